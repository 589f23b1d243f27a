// The SFA KV-offload host pool in POSIX shared memory (see host_pool.h).
#include "ascend_attn_rt/sfa/host_pool.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <limits>
#include <stdexcept>

#include "ascend_attn_rt/errors.h"

namespace aar::sfa {

namespace {

constexpr char kMagic[8] = {'A', 'A', 'R', 'K', 'V', 'P', 'L', '1'};
// 2: the header records the owner's start time beside its pid.
constexpr uint32_t kVersion = 2;
constexpr int64_t kPage = 4096;
constexpr int64_t kElem = 2;  // bfloat16

int64_t page_align(int64_t n) { return (n + kPage - 1) / kPage * kPage; }

// The segment's first page. `ready` is stored last (release) by the owner.
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t ready;
  int64_t num_layers, num_blocks, block_size, k_dim, v_dim;
  int64_t layer_stride, v_offset, total_bytes;
  int64_t owner_pid;
  // The owner's start time (field 22 of /proc/<pid>/stat, clock ticks since
  // boot; 0 where it cannot be read): with the pid it names the owner process
  // even after the pid has been reused.
  int64_t owner_start;
};
static_assert(sizeof(Header) <= kPage, "the header fits its page");

struct Layout {
  int64_t layer_stride = 0, v_offset = 0, total = 0;
};

Layout layout_of(int64_t layers, int64_t blocks, int64_t bs, int64_t k_dim, int64_t v_dim) {
  Layout l;
  l.v_offset = page_align(blocks * bs * k_dim * kElem);
  l.layer_stride = l.v_offset + page_align(blocks * bs * v_dim * kElem);
  l.total = kPage + layers * l.layer_stride;
  return l;
}

// Start time of process `pid` (see Header::owner_start), 0 when unknown.
int64_t process_start_time(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!f || !std::getline(f, line)) return 0;
  // The command name (field 2) is in parentheses and may hold spaces: count
  // fields after its closing one (field 3 is the first).
  const std::size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) {
      try {
        return std::stoll(field);
      } catch (...) {
        return 0;
      }
    }
  }
  return 0;
}

// Whether the process that created a pool is still running: the pid exists
// (kill 0: EPERM means it exists under another user) and, where both start
// times are known, it is the same process, not a later one with the pid reused.
bool owner_is_alive(int64_t pid, int64_t start) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  const int64_t now = process_start_time(pid);
  return start == 0 || now == 0 || now == start;
}

std::string posix_name(const std::string& name) {
  AAR_CHECK_ARG(name.find('\0') == std::string::npos, "name \"", name.c_str(), "...\" (", name.size(),
                " bytes) holds a NUL byte at offset ", name.find('\0'), ": a POSIX shared-memory name is a C string");
  std::string n = name.empty() || name[0] != '/' ? "/" + name : name;
  AAR_CHECK_ARG(n.size() > 1 && n.size() <= 255 && n.find('/', 1) == std::string::npos, "name \"", name,
                "\" is not a POSIX shared-memory name (\"/name\", 1..254 characters, no other '/')");
  return n;
}

[[noreturn]] void throw_sys(const std::string& what, const std::string& name, int err) {
  throw std::runtime_error(what + " \"" + name + "\" failed: " + std::strerror(err));
}

}  // namespace

// A mapping, unmapped (and unpinned) when the pool and every tensor over it are gone.
struct HostKvPool::Mapping {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  std::function<void(void*)> unpin;
  ~Mapping() {
    if (ptr == nullptr) return;
    if (unpin) {
      try {
        unpin(ptr);
      } catch (...) {  // a destructor: an unpin failure must not terminate the process; the memory is unmapped anyway
      }
    }
    munmap(ptr, bytes);
  }
};

int64_t HostKvPool::block_bytes(int64_t num_layers, int64_t block_size, int64_t kv_lora_rank,
                                int64_t qk_rope_head_dim) {
  AAR_CHECK_ARG(num_layers > 0, "num_layers must be positive, got ", num_layers);
  AAR_CHECK_ARG(block_size > 0, "block_size must be positive, got ", block_size);
  AAR_CHECK_ARG(kv_lora_rank > 0 && qk_rope_head_dim > 0, "kv_lora_rank and qk_rope_head_dim must be positive, got ",
                kv_lora_rank, " and ", qk_rope_head_dim);
  // A block's bytes must fit int64 (a wrapped product made blocks_for_budget divide by 0 or create map a
  // pool far smaller than its layout).
  int64_t width = 0, bytes = 0;
  const bool overflow = __builtin_add_overflow(kv_lora_rank, qk_rope_head_dim, &width) ||
                        __builtin_mul_overflow(num_layers, block_size, &bytes) ||
                        __builtin_mul_overflow(bytes, width, &bytes) ||
                        __builtin_mul_overflow(bytes, static_cast<int64_t>(kElem), &bytes);
  AAR_CHECK_ARG(!overflow, "num_layers=", num_layers, " x block_size=", block_size, " x (kv_lora_rank=", kv_lora_rank,
                " + qk_rope_head_dim=", qk_rope_head_dim, ") x ", kElem, " bytes overflows int64");
  return bytes;
}

int64_t HostKvPool::blocks_for_budget(int64_t budget_bytes, int64_t num_layers, int64_t block_size,
                                      int64_t kv_lora_rank, int64_t qk_rope_head_dim) {
  const int64_t per = block_bytes(num_layers, block_size, kv_lora_rank, qk_rope_head_dim);
  AAR_CHECK_ARG(budget_bytes >= 0, "budget_bytes must be non-negative, got ", budget_bytes);
  // Slots (block * block_size + offset) are int32 in the metadata.
  return std::min<int64_t>(budget_bytes / per, std::numeric_limits<int32_t>::max() / block_size);
}

std::shared_ptr<HostKvPool> HostKvPool::create(const HostKvPoolConfig& cfg) {
  const int64_t per = block_bytes(cfg.num_layers, cfg.block_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim);
  AAR_CHECK_ARG(cfg.min_blocks >= 1, "min_blocks must be at least 1, got ", cfg.min_blocks);
  AAR_CHECK_ARG(!cfg.unpin || cfg.pin, "unpin was given without pin");
  const int64_t blocks =
      blocks_for_budget(cfg.budget_bytes, cfg.num_layers, cfg.block_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim);
  AAR_CHECK_ARG(blocks >= cfg.min_blocks, "budget_bytes=", cfg.budget_bytes, " holds ", blocks,
                " blocks of the host KV pool, fewer than min_blocks=", cfg.min_blocks, ": one block needs ", per,
                " bytes (num_layers=", cfg.num_layers, " x block_size=", cfg.block_size, " x (kv_lora_rank=",
                cfg.kv_lora_rank, " + qk_rope_head_dim=", cfg.qk_rope_head_dim, ") x 2 bytes of bfloat16), so ",
                cfg.min_blocks, " blocks need budget_bytes >= ", per * cfg.min_blocks);
  static std::atomic<int64_t> counter{0};
  const std::string name = cfg.name.empty() ? "/aar_kv_pool_" + std::to_string(getpid()) + "_" +
                                                  std::to_string(counter.fetch_add(1))
                                            : posix_name(cfg.name);
  const Layout lay = layout_of(cfg.num_layers, blocks, cfg.block_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim);

  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) {
      throw std::runtime_error("a shared-memory object named \"" + name + "\" exists (another owner's pool, or one "
                               "left by a process that died: HostKvPool::unlink removes it); choose another name");
    }
    throw_sys("shm_open(O_CREAT | O_EXCL) of", name, err);
  }
  void* ptr = MAP_FAILED;
  // posix_fallocate reserves the pages: on tmpfs ftruncate alone would let a
  // later write to an unbacked page kill the process (SIGBUS) when /dev/shm
  // is smaller than the pool.
  int err = 0;
  if (ftruncate(fd, lay.total) != 0) {
    err = errno;
  } else if ((err = posix_fallocate(fd, 0, lay.total)) == 0) {
    ptr = mmap(nullptr, lay.total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (ptr == MAP_FAILED) err = errno;
  }
  close(fd);
  if (ptr == MAP_FAILED) {
    shm_unlink(name.c_str());
    throw_sys("sizing / mapping " + std::to_string(lay.total) + " bytes of", name, err);
  }
  auto map = std::make_shared<Mapping>();
  map->ptr = ptr;
  map->bytes = static_cast<std::size_t>(lay.total);

  std::shared_ptr<HostKvPool> p(new HostKvPool());
  p->owner_ = true;
  p->name_ = name;
  p->num_layers_ = cfg.num_layers;
  p->num_blocks_ = blocks;
  p->block_size_ = cfg.block_size;
  p->k_dim_ = cfg.kv_lora_rank;
  p->v_dim_ = cfg.qk_rope_head_dim;
  p->map_ = map;  // from here on the destructor unlinks the name
  if (cfg.pin) {
    cfg.pin(ptr, map->bytes);
    map->unpin = cfg.unpin;
  }
  auto* h = static_cast<Header*>(ptr);
  std::memcpy(h->magic, kMagic, sizeof(kMagic));
  h->version = kVersion;
  h->num_layers = cfg.num_layers;
  h->num_blocks = blocks;
  h->block_size = cfg.block_size;
  h->k_dim = cfg.kv_lora_rank;
  h->v_dim = cfg.qk_rope_head_dim;
  h->layer_stride = lay.layer_stride;
  h->v_offset = lay.v_offset;
  h->total_bytes = lay.total;
  h->owner_pid = getpid();
  h->owner_start = process_start_time(getpid());
  __atomic_store_n(&h->ready, 1u, __ATOMIC_RELEASE);
  p->make_views();
  return p;
}

std::shared_ptr<HostKvPool> HostKvPool::attach(const std::string& name_in, std::function<void(void*, std::size_t)> pin,
                                               std::function<void(void*)> unpin) {
  const std::string name = posix_name(name_in);
  AAR_CHECK_ARG(!unpin || pin, "unpin was given without pin");
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      throw std::runtime_error("no host KV pool named \"" + name + "\" (its owner has not created it yet, or has "
                               "gone and unlinked it)");
    }
    throw_sys("shm_open of", name, err);
  }
  struct stat st {};
  void* ptr = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size >= kPage) {
    ptr = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  }
  const int err = errno;
  close(fd);
  if (ptr == MAP_FAILED) {
    if (st.st_size == 0) {
      throw std::runtime_error("the host KV pool \"" + name + "\" is not ready (its owner is still creating it)");
    }
    if (st.st_size < kPage) {
      throw std::runtime_error("the shared-memory object \"" + name + "\" is not a host KV pool (" +
                               std::to_string(st.st_size) + " bytes, no header)");
    }
    throw_sys("mapping", name, err);
  }
  auto map = std::make_shared<Mapping>();
  map->ptr = ptr;
  map->bytes = static_cast<std::size_t>(st.st_size);
  const auto* h = static_cast<const Header*>(ptr);
  static constexpr char kZero[sizeof(kMagic)] = {};
  if (std::memcmp(h->magic, kZero, sizeof(kMagic)) == 0) {
    throw std::runtime_error("the host KV pool \"" + name + "\" is not ready (its owner is still creating it)");
  }
  if (std::memcmp(h->magic, kMagic, sizeof(kMagic)) != 0 || h->version != kVersion) {
    throw std::runtime_error("the shared-memory object \"" + name + "\" is not a host KV pool of this version");
  }
  if (__atomic_load_n(&h->ready, __ATOMIC_ACQUIRE) != 1u) {
    throw std::runtime_error("the host KV pool \"" + name + "\" is not ready (its owner is still creating it)");
  }
  if (!owner_is_alive(h->owner_pid, h->owner_start)) {
    throw std::runtime_error("the host KV pool \"" + name + "\" was created by process " +
                             std::to_string(h->owner_pid) + ", which has exited: nothing commits its rows any more "
                             "(HostKvPool::unlink removes the name; the new owner creates the pool again)");
  }
  const Layout lay = layout_of(h->num_layers, h->num_blocks, h->block_size, h->k_dim, h->v_dim);
  if (lay.total != h->total_bytes || h->total_bytes > st.st_size || lay.layer_stride != h->layer_stride ||
      lay.v_offset != h->v_offset) {
    throw std::runtime_error("the host KV pool \"" + name + "\" has an inconsistent header");
  }
  std::shared_ptr<HostKvPool> p(new HostKvPool());
  p->owner_ = false;
  p->owner_pid_ = h->owner_pid;
  p->owner_start_ = h->owner_start;
  p->name_ = name;
  p->num_layers_ = h->num_layers;
  p->num_blocks_ = h->num_blocks;
  p->block_size_ = h->block_size;
  p->k_dim_ = h->k_dim;
  p->v_dim_ = h->v_dim;
  p->map_ = map;
  if (pin) {
    pin(ptr, map->bytes);
    map->unpin = std::move(unpin);
  }
  p->make_views();
  return p;
}

bool HostKvPool::owner_alive() const { return owner_ || owner_is_alive(owner_pid_, owner_start_); }

bool HostKvPool::unlink(const std::string& name) { return shm_unlink(posix_name(name).c_str()) == 0; }

HostKvPool::~HostKvPool() {
  if (owner_ && map_ != nullptr) shm_unlink(name_.c_str());
}

int64_t HostKvPool::segment_bytes() const { return static_cast<int64_t>(map_->bytes); }

void HostKvPool::make_views() {
  const Layout lay = layout_of(num_layers_, num_blocks_, block_size_, k_dim_, v_dim_);
  auto* base = static_cast<uint8_t*>(map_->ptr) + kPage;
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCPU);
  std::shared_ptr<Mapping> keep = map_;
  const auto deleter = [keep](void*) {};  // each tensor holds the mapping
  for (int64_t l = 0; l < num_layers_; ++l) {
    uint8_t* kp = base + l * lay.layer_stride;
    k_.push_back(at::from_blob(kp, {num_blocks_, block_size_, 1, k_dim_}, deleter, opts));
    v_.push_back(at::from_blob(kp + lay.v_offset, {num_blocks_, block_size_, 1, v_dim_}, deleter, opts));
    k_rows_.push_back(k_.back().view({num_blocks_ * block_size_, k_dim_}));
    v_rows_.push_back(v_.back().view({num_blocks_ * block_size_, v_dim_}));
  }
}

void HostKvPool::check_layer(int64_t layer) const {
  AAR_CHECK_ARG(layer >= 0 && layer < num_layers_, "layer=", layer, " is out of range [0, num_layers=", num_layers_,
                ") of the host KV pool \"", name_, "\"");
}

const at::Tensor& HostKvPool::k(int64_t layer) const {
  check_layer(layer);
  return k_[layer];
}
const at::Tensor& HostKvPool::v(int64_t layer) const {
  check_layer(layer);
  return v_[layer];
}
const at::Tensor& HostKvPool::k_rows(int64_t layer) const {
  check_layer(layer);
  return k_rows_[layer];
}
const at::Tensor& HostKvPool::v_rows(int64_t layer) const {
  check_layer(layer);
  return v_rows_[layer];
}

}  // namespace aar::sfa
