// Typed handles of the C ABI. A C caller holds opaque pointers and C lets it
// pass any of them anywhere (a cast, a void* in an FFI, a stale copy), so
// every handle starts with a type tag that each entry point reads before it
// trusts the pointer: a handle of another type, a destroyed one or a pointer
// that is no handle at all is rejected by name instead of being read as the
// wrong object.
//
// A handle is a small standard-layout shell: `Tag tag` first (so the tag sits
// at offset 0 whatever the handle's type, and is read without assuming it),
// then raw pointers to the C++ objects it owns or views. A new family adds a
// Kind and its name in handle.cpp, declares its shells with kKind, and uses
// make / checked / retire.
//
// Destroyed handles: retire() marks the tag dead and keeps the shell (only the
// shell: the C++ object is freed at once) in a small process-wide quarantine of
// the most recently destroyed ones, so a use after destroy reads memory that is
// still ours and says "destroyed". Best effort: once a shell leaves the
// quarantine its memory may be reused by anything, including a new handle.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

namespace aar::capi {

enum class Kind : uint32_t {
  GqaBuilder = 1,
  GqaImpl = 2,
  GqaMetadata = 3,
  MlaBuilder = 4,
  MlaImpl = 5,
  MlaMetadata = 6,
  GraphParams = 7,
  SfaBuilder = 8,
  SfaImpl = 9,
  SfaMetadata = 10,
  SfaTopkBuffer = 11,
  DsaStepBuilder = 12,
  DsaGroupBuilder = 13,
  DsaImpl = 14,
  DsaStepMetadata = 15,
  DsaGroupMetadata = 16,
  C8Impl = 17,
  Fa3Impl = 18,
  MlaLatent = 19,
  CpComm = 20,
  GqaDcpBuilder = 21,
  GqaDcpImpl = 22,
  GqaDcpMetadata = 23,
  GqaPcpBuilder = 24,
  GqaPcpImpl = 25,
  GqaPcpMetadata = 26,
};

// The C type name of a kind ("aar_gqa_builder_t"); nullptr for a value that is no Kind.
const char* kind_name(uint32_t kind) noexcept;

struct Tag {
  uint32_t magic;
  uint32_t kind;
};
inline constexpr uint32_t kLiveMagic = 0x4c524141u;  // "AARL"
inline constexpr uint32_t kDeadMagic = 0x44524141u;  // "AARD"

template <typename H>
inline constexpr bool is_handle_v = std::is_standard_layout_v<H> && std::is_trivially_destructible_v<H> &&
                                    std::is_same_v<std::remove_cv_t<decltype(H::kKind)>, Kind>;

inline void mark_live(Tag& t, Kind k) noexcept { t = Tag{kLiveMagic, static_cast<uint32_t>(k)}; }
inline void mark_dead(Tag& t) noexcept { t.magic = kDeadMagic; }

// True when `p` points at a live handle of kind `k`. The caller's pointer may
// be of any type: the bytes are read, not a Tag object.
inline bool has_tag(const void* p, Kind k) noexcept {
  if (p == nullptr) return false;
  Tag t;
  std::memcpy(&t, p, sizeof t);
  return t.magic == kLiveMagic && t.kind == static_cast<uint32_t>(k);
}

// Throws InvalidArgument unless `p` points at a live handle of kind `expected`;
// the message names `name`, the expected type and what was found there.
void check_tag(const void* p, Kind expected, const char* name);

template <typename H>
H* checked(H* h, const char* name) {
  using Shell = std::remove_const_t<H>;
  static_assert(is_handle_v<Shell>);
  static_assert(offsetof(Shell, tag) == 0, "the tag must sit at offset 0 of every handle");
  if (__builtin_expect(!has_tag(h, Shell::kKind), 0)) check_tag(h, Shell::kKind, name);
  return h;
}

// A new shell, zero-filled but for its live tag. Plain ::operator new, so the
// quarantine frees any shell the same way whatever its type.
template <typename H>
H* make() {
  static_assert(is_handle_v<H>);
  H* h = new (::operator new(sizeof(H))) H{};
  mark_live(h->tag, H::kKind);
  return h;
}

// Marks the shell dead and hands it to the quarantine (which frees it later).
// Call after the objects it owns are gone.
void quarantine(void* shell) noexcept;
template <typename H>
void retire(H* h) noexcept {
  static_assert(is_handle_v<H>);
  mark_dead(h->tag);
  quarantine(h);
}

}  // namespace aar::capi
