// The step core every backend shares (docs/design/core.md): one step input, one
// counts struct, one builder configuration core. Builders' inputs extend
// StepInput, every Metadata embeds StepCounts, every builder config extends
// BuilderCore (or the parts of it the builder has).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ascend_attn_rt/plan/step_input.h"
#include "ascend_attn_rt/staging.h"

namespace aar::core {

using plan::StepCounts;
using plan::StepInput;

// How many requests and tokens a step may have.
struct Capacities {
  int32_t max_num_reqs = 256;
  int32_t max_num_tokens = 8192;
  // Draft tokens per request: the decode threshold is 1 + this (<= 16, the
  // fused kernels' query rows per request).
  int32_t num_speculative_tokens = 0;
  int32_t decode_threshold() const { return 1 + num_speculative_tokens; }
};

// The paged KV cache the block tables index.
struct BlockGeometry {
  int32_t max_blocks_per_req = 64;  // block-table columns
  int32_t block_size = 128;
  int32_t num_blocks = 0;           // required: block ids and slots are range-checked against it
};

// Where the metadata lives and how the host staging reaches it.
struct StagingConfig {
  c10::Device device = c10::Device(c10::kCPU);
  // Keep device buffers apart from the host staging buffers and copy once per
  // build. Defaults to (device != CPU); settable so CPU tests exercise the copy.
  std::optional<bool> separate_device_buffers;
  // Host staging buffers used in turn on the device path (1..4): a buffer is
  // rewritten only once the device has consumed the copy made from it.
  int32_t staging_buffers = 2;
  // How staging copies reach the device and how their completion is awaited
  // (null: a c10::Event on the device's current stream).
  std::shared_ptr<StagingHooks> staging_hooks;
  bool separate() const { return separate_device_buffers.value_or(!device.is_cpu()); }
};

struct BuilderCore : Capacities, BlockGeometry, StagingConfig {};

// Checks of the core's fields, each error naming the field and value:
// capacities positive, num_speculative_tokens in [0, 15], staging_buffers in
// [1, 4]; check_geometry also the block size against the backend's list.
void check_capacities(const Capacities& c);
void check_geometry(const BlockGeometry& g, const int32_t* block_sizes, int num_block_sizes);
void check_staging(const StagingConfig& s);

// A step against a builder's capacities, before anything is written: at most
// max_num_reqs requests (`reqs_capacity` when a lane holds more, e.g. a draft
// lane), at most max_num_tokens tokens (num_input_tokens, or
// query_start_loc[B]), a block table of at most max_blocks_per_req columns
// (max_blocks_per_req < 0: the builder takes no table and refuses one).
void check_step_fits(const StepInput& in, const Capacities& c, int32_t max_blocks_per_req,
                     int64_t reqs_capacity = -1);

// The optional StepInput fields a builder does not read, refused by name when
// given (nothing is silently ignored). `who` names the builder.
enum StepField : uint32_t {
  kAttnState = 1u << 0,
  kNumSpecTokens = 1u << 1,
  kIsPrefilling = 1u << 2,
  kReqIds = 1u << 3,
  kBlockTable = 1u << 4,
  kNumInputTokens = 1u << 5,
};
void refuse_unread(const StepInput& in, uint32_t unread_fields, const char* who);

}  // namespace aar::core
