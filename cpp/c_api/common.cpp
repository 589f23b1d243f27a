// The C ABI's shared pieces: per-thread errors, status mapping, DLPack in and out.
#include <ATen/DLConvertor.h>
#include <ATen/Functions.h>
#include <c10/core/DeviceType.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <new>
#include <string>

#include "ascend_attn_rt/ops/provider.h"
#include "internal.h"

namespace aar::capi {
namespace {

thread_local std::string t_error;

void set_error(const char* fn, const char* what) noexcept {
  try {
    t_error.assign(fn).append(": ").append(what);
  } catch (...) {
    t_error.clear();  // out of memory while formatting: the status still says what happened
  }
}

// Sizes beyond this are not a tensor anyone means (and would overflow from_blob's size arithmetic).
constexpr int32_t kMaxDims = 16;

}  // namespace

void clear_error() noexcept { t_error.clear(); }
const char* last_error() noexcept { return t_error.c_str(); }

aar_status_t status_of_current_exception(const char* fn) noexcept {
  try {
    throw;
  } catch (const InvalidArgument& e) {
    set_error(fn, e.what());
    return AAR_ERR_INVALID_ARGUMENT;
  } catch (const NotSupported& e) {
    set_error(fn, e.what());
    return AAR_ERR_NOT_SUPPORTED;
  } catch (const c10::ValueError& e) {
    set_error(fn, e.what_without_backtrace());
    return AAR_ERR_INVALID_ARGUMENT;
  } catch (const c10::IndexError& e) {
    set_error(fn, e.what_without_backtrace());
    return AAR_ERR_INVALID_ARGUMENT;
  } catch (const c10::TypeError& e) {
    set_error(fn, e.what_without_backtrace());
    return AAR_ERR_INVALID_ARGUMENT;
  } catch (const c10::NotImplementedError& e) {
    set_error(fn, e.what_without_backtrace());
    return AAR_ERR_NOT_SUPPORTED;
  } catch (const c10::OutOfMemoryError& e) {
    set_error(fn, e.what_without_backtrace());
    return AAR_ERR_OUT_OF_MEMORY;
  } catch (const c10::Error& e) {
    set_error(fn, e.what_without_backtrace());
    return AAR_ERR_RUNTIME;
  } catch (const std::bad_alloc& e) {
    set_error(fn, "out of memory");
    return AAR_ERR_OUT_OF_MEMORY;
  } catch (const std::invalid_argument& e) {
    set_error(fn, e.what());
    return AAR_ERR_INVALID_ARGUMENT;
  } catch (const std::exception& e) {
    set_error(fn, e.what());
    return AAR_ERR_RUNTIME;
  } catch (...) {
    set_error(fn, "unknown exception");
    return AAR_ERR_RUNTIME;
  }
}

bool flag(int32_t v, const char* name) {
  AAR_CHECK_ARG(v == 0 || v == 1, name, " must be 0 or 1, got ", v);
  return v == 1;
}

void check_group(const char* prefix, const char* size_field, int32_t size, const char* rank_field, int32_t rank) {
  AAR_CHECK_ARG(size >= 1, prefix, size_field, " must be >= 1, got ", size);
  AAR_CHECK_ARG(rank >= 0 && rank < size, prefix, rank_field, "=", rank, " is out of range [0, ", size_field, "=",
                size, ")");
}

std::optional<bool> tristate(const aar_tristate_t& field, const char* name) {
  const int32_t v = enum_int(field);
  AAR_CHECK_ARG(v == AAR_DEFAULT || v == AAR_FALSE || v == AAR_TRUE, name,
                " must be AAR_DEFAULT (-1), AAR_FALSE (0) or AAR_TRUE (1), got ", v);
  if (v == AAR_DEFAULT) return std::nullopt;
  return v == AAR_TRUE;
}

std::optional<plan::AttentionState> attn_state(const aar_attn_state_t& field, const char* name) {
  const int32_t s = enum_int(field);
  AAR_CHECK_ARG(s >= AAR_STATE_AUTO && s <= AAR_STATE_SPEC_DECODING, name,
                " must be AAR_STATE_AUTO (-1) or an aar_attn_state_t in [0, 4], got ", s);
  if (s == AAR_STATE_AUTO) return std::nullopt;
  return static_cast<plan::AttentionState>(s);
}

plan::AttentionState capture_state(const aar_attn_state_t& s) {
  const auto st = attn_state(s, "state");
  AAR_CHECK_ARG(st.has_value(), "state must be an attention state, got AAR_STATE_AUTO");
  return *st;
}

gqa::AttnType attn_type(int32_t v, const char* name) {
  AAR_CHECK_ARG(v >= 0 && v <= 3, name, " must be 0 (decoder), 1 (encoder-only), 2 (encoder) or 3 (encoder-decoder), got ",
                v);
  return static_cast<gqa::AttnType>(v);
}

plan::DeviceKind device_kind(int32_t v, const char* name) {
  AAR_CHECK_ARG(v >= 0 && v <= 3, name, " must be 0 (A2), 1 (A3), 2 (A5) or 3 (310P), got ", v);
  return static_cast<plan::DeviceKind>(v);
}

aar_attn_state_t to_c(plan::AttentionState s) { return static_cast<aar_attn_state_t>(s); }

namespace {

// How many NPUs torch_npu sees, once it is known to be loaded (-1 until then).
// Cached: a PrivateUse1 backend cannot be unloaded or renamed once registered,
// and asking the device runtime for its count per tensor per call would not be free.
std::atomic<int32_t> g_npu_count{-1};

// The NPU backend this process has, checked before torch is asked for a
// PrivateUse1 tensor: without it torch's own error would name neither the
// argument nor what is missing.
void check_npu_reachable(const DLDevice& d, const char* name, const char* suffix) {
  int32_t count = g_npu_count.load(std::memory_order_relaxed);
  if (count < 0) {
    AAR_CHECK_ARG(c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1), name, suffix,
                  " is kDLExtDev (12) device ", d.device_id,
                  ", an Ascend NPU, but no NPU backend is loaded in this process: NPU tensors need torch_npu "
                  "(import torch_npu, or link libtorch_npu, before this call)");
    const std::string backend = c10::get_privateuse1_backend();
    AAR_CHECK_ARG(backend == "npu", name, suffix, " is kDLExtDev (12) device ", d.device_id,
                  ", an Ascend NPU, but the PrivateUse1 backend loaded in this process is '", backend,
                  "', not torch_npu's 'npu'");
    count = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->deviceCount();
    g_npu_count.store(count, std::memory_order_relaxed);
  }
  AAR_CHECK_ARG(d.device_id < count, name, suffix, " is kDLExtDev (12) device ", d.device_id, ", but torch_npu sees ",
                count, " NPU(s)");
}

}  // namespace

c10::Device device_of(const DLDevice& d, const char* name, const char* suffix) {
  AAR_CHECK_ARG(d.device_id >= 0 && d.device_id <= INT8_MAX, name, suffix, ".device_id must be in [0, 127], got ",
                d.device_id);
  const int32_t type = enum_int(d.device_type);
  switch (type) {
    case kDLCPU:
    case kDLCUDAHost:  // pinned host memory: a host tensor
      return c10::Device(c10::kCPU);
    case kDLExtDev:  // torch's PrivateUse1: the Ascend NPU under torch_npu
      check_npu_reachable(d, name, suffix);
      return c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(d.device_id));
    default:
      throw_invalid(name, suffix, ".device_type ", type,
                    " is not a device this runtime runs on (kDLCPU = 1, kDLCUDAHost = 3 or kDLExtDev = 12, the NPU)");
  }
}

at::Tensor borrow(const DLManagedTensor* t, const char* name) {
  check_not_null(t, name);
  const DLTensor& d = t->dl_tensor;
  AAR_CHECK_ARG(d.ndim >= 0 && d.ndim <= kMaxDims, name, ".ndim must be in [0, ", kMaxDims, "], got ", d.ndim);
  AAR_CHECK_ARG(d.ndim == 0 || d.shape != nullptr, name, ".shape is NULL with ndim ", d.ndim);
  int64_t numel = 1;
  for (int32_t i = 0; i < d.ndim; ++i) {
    AAR_CHECK_ARG(d.shape[i] >= 0, name, ".shape[", i, "] is negative: ", d.shape[i]);
    AAR_CHECK_ARG(!__builtin_mul_overflow(numel, d.shape[i], &numel), name, ".shape overflows int64 at dim ", i);
  }
  if (d.strides != nullptr) {
    for (int32_t i = 0; i < d.ndim; ++i) {
      AAR_CHECK_ARG(d.strides[i] >= 0, name, ".strides[", i, "] is negative: ", d.strides[i]);
    }
  }
  AAR_CHECK_ARG(d.data != nullptr || numel == 0, name, ".data is NULL with ", numel, " elements");
  AAR_CHECK_ARG(d.dtype.lanes == 1, name, ".dtype.lanes must be 1, got ", d.dtype.lanes);
  // Sub-byte element types (DLPack's packed 4- and 6-bit floats, odd int widths) have no
  // addressable element: torch and the kernels index whole bytes.
  AAR_CHECK_ARG(d.dtype.bits > 0 && d.dtype.bits % 8 == 0, name, ".dtype.bits must be a positive multiple of 8, got ",
                static_cast<int>(d.dtype.bits), " (code ", static_cast<int>(d.dtype.code), ")");
  at::ScalarType st;
  try {
    st = at::toScalarType(d.dtype);
  } catch (const c10::Error&) {
    throw_invalid(name, ".dtype (code ", static_cast<int>(d.dtype.code), ", bits ", static_cast<int>(d.dtype.bits),
                  ") is not a dtype torch represents");
  }
  const c10::Device dev = device_of(d.device, name, ".device");
  // byte_offset moves the first element; torch would take any address, but a
  // misaligned element is undefined behaviour on the host and a fault or a
  // wrong read in a device kernel.
  const auto base = reinterpret_cast<uintptr_t>(d.data);
  AAR_CHECK_ARG(d.byte_offset <= UINTPTR_MAX - base, name, ".byte_offset ", d.byte_offset,
                " overflows the address space from data ", d.data);
  const size_t item = at::elementSize(st);
  AAR_CHECK_ARG(numel == 0 || (base + d.byte_offset) % item == 0, name, ".byte_offset ", d.byte_offset,
                " puts the first element at ", reinterpret_cast<const void*>(base + d.byte_offset),
                " (data ", d.data, "), not a multiple of ", item, " bytes, the element size of ", st);
  const std::vector<int64_t> sizes(d.shape, d.shape + d.ndim);
  char* data = static_cast<char*>(d.data) + d.byte_offset;
  const at::TensorOptions opts = at::TensorOptions().dtype(st).device(dev);
  if (d.strides == nullptr) return at::from_blob(data, sizes, [](void*) {}, opts);
  const std::vector<int64_t> strides(d.strides, d.strides + d.ndim);
  return at::from_blob(data, sizes, strides, [](void*) {}, opts);
}

std::optional<at::Tensor> borrow_optional(const DLManagedTensor* t, const char* name) {
  if (t == nullptr) return std::nullopt;
  return borrow(t, name);
}

void BorrowCache::describe(const DLTensor& d, std::vector<int64_t>& key) {
  key.clear();
  key.push_back(reinterpret_cast<intptr_t>(d.data));
  key.push_back(static_cast<int64_t>(d.byte_offset));
  key.push_back((int64_t{d.dtype.code} << 24) | (int64_t{d.dtype.bits} << 8) | d.dtype.lanes);
  key.push_back((int64_t{d.device.device_type} << 32) | static_cast<uint32_t>(d.device.device_id));
  key.push_back(d.ndim);
  key.push_back(d.strides != nullptr);
  for (int32_t i = 0; i < d.ndim; ++i) key.push_back(d.shape[i]);
  if (d.strides != nullptr) {
    for (int32_t i = 0; i < d.ndim; ++i) key.push_back(d.strides[i]);
  }
}

at::Tensor BorrowCache::get(const DLManagedTensor* t, const char* name) {
  check_not_null(t, name);
  const DLTensor& d = t->dl_tensor;
  // describe() reads shape/strides: only once ndim and the pointers are known sane.
  if (tensor_.defined() && d.ndim >= 0 && d.ndim <= kMaxDims && (d.ndim == 0 || d.shape != nullptr)) {
    describe(d, scratch_);
    if (scratch_ == key_) return tensor_;
  }
  at::Tensor fresh = borrow(t, name);
  describe(d, key_);
  tensor_ = fresh;
  return tensor_;
}

DLManagedTensor* lend(const at::Tensor& t) { return at::toDLPack(t); }

}  // namespace aar::capi

using aar::capi::guarded;

extern "C" {

int aar_c_api_version(void) { return AAR_C_API_VERSION; }

const char* aar_status_name(aar_status_t status) {
  switch (aar::capi::enum_int(status)) {
    case AAR_OK: return "AAR_OK";
    case AAR_ERR_INVALID_ARGUMENT: return "AAR_ERR_INVALID_ARGUMENT";
    case AAR_ERR_NOT_SUPPORTED: return "AAR_ERR_NOT_SUPPORTED";
    case AAR_ERR_OUT_OF_MEMORY: return "AAR_ERR_OUT_OF_MEMORY";
    case AAR_ERR_RUNTIME: return "AAR_ERR_RUNTIME";
  }
  return "unknown";
}

const char* aar_last_error(void) { return aar::capi::last_error(); }

aar_status_t aar_set_provider(aar_provider_t provider) {
  return guarded("aar_set_provider", [&] {
    const int32_t v = aar::capi::enum_int(provider);
    AAR_CHECK_ARG(v >= AAR_PROVIDER_AUTO && v <= AAR_PROVIDER_NO_COMPUTE, "provider must be an aar_provider_t in [0, 3], got ",
                  v);
    aar::ops::set_provider_override(static_cast<aar::ops::Provider>(v));
  });
}

}  // extern "C"
