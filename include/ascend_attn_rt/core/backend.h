// The backend contract (docs/design/core.md §5). Every backend exposes the same
// parts with the same signatures:
//
//   * facts, declared (BackendFacts below; registered with BackendRegistrar so
//     engines, bindings and the contract tests can walk every backend);
//   * a builder with
//       const Metadata& build(const BuildInputs&);
//       const Metadata& build_for_graph_capture(const BuildInputs&, plan::AttentionState);
//       const Metadata& build_for_drafting(const BuildInputs&, int32_t draft_index);
//     where BuildInputs extends core::StepInput and Metadata extends
//     core::StepCounts. build_for_graph_capture accepts exactly the states of
//     facts().capturable and refuses the others by name (NotSupported, before
//     anything is built); build_for_drafting is build() unless the backend
//     keeps draft lanes of its own (facts().draft_lanes), as vLLM's base
//     builder does;
//   * an impl whose forward takes its arguments in one order:
//       forward(<activations>, <kv caches>, const Metadata* metadata,
//               const at::Tensor& output, <backend extras>)
//     metadata == nullptr is a profiling run (output zero-filled, refused
//     inside a graph capture); it returns output.
//
// is_builder_v<B> checks the builder's part at compile time.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ascend_attn_rt/plan/attention_state.h"

namespace aar::core {

// A set of attention states, one bit each.
using StateSet = uint32_t;
constexpr StateSet state_bit(plan::AttentionState s) { return StateSet{1} << static_cast<int>(s); }
constexpr bool has_state(StateSet set, plan::AttentionState s) { return (set & state_bit(s)) != 0; }

struct BackendFacts {
  std::string id;    // unique: "gqa", "c8", "fa3", "mla", "sfa", "dsa", "gqa_dcp", "gqa_pcp"
  std::string name;  // what vLLM calls the upstream backend ("CUSTOM", "ASCEND_MLA", ...)
  std::vector<int64_t> block_sizes;         // kernel block sizes accepted (empty: any positive)
  std::vector<c10::ScalarType> dtypes;      // activation dtypes the layers take
  std::vector<std::string> kv_caches;       // the layer's cache tensors, in forward order
  // States the backend captures in a graph (its layers record a forward of a
  // step built for them); 0: a forward inside a capture is refused by name.
  StateSet capturable = 0;
  // The backend whose builder this one's layers take (empty: its own). Its
  // build_for_graph_capture accepts that builder's capturable states.
  std::string builder;
  bool draft_lanes = false;                 // build_for_drafting keeps lanes of its own
  bool context_parallel = false;            // the impl needs a cp::Comm
};

// Every registered backend, in registration order (the runtime registers its
// own at load time).
const std::vector<BackendFacts>& registered_backends();
// The facts of backend `id`; InvalidArgument naming the known ids otherwise.
const BackendFacts& backend_facts(const std::string& id);

// The contract's argument checks, one wording for every backend:
// build_for_graph_capture refuses a state outside facts.capturable (NotSupported
// naming the state, the backend's id and the states it captures) before
// anything is built; build_for_drafting refuses a negative draft_index
// (InvalidArgument). `who` prefixes the message.
void check_capturable(const BackendFacts& facts, plan::AttentionState state,
                      const char* who = "build_for_graph_capture");
void check_draft_index(int32_t draft_index);
// Whether `block_size` is one of a backend's supported sizes.
inline bool has_block_size(const std::vector<int64_t>& sizes, int64_t block_size) {
  for (int64_t s : sizes) {
    if (s == block_size) return true;
  }
  return false;
}

struct BackendRegistrar {
  explicit BackendRegistrar(BackendFacts (*facts)());
};

namespace detail {
template <class B, class = void>
struct is_builder : std::false_type {};
template <class B>
struct is_builder<B, std::void_t<typename B::Inputs, typename B::Output,
                                 decltype(std::declval<B&>().build(std::declval<const typename B::Inputs&>())),
                                 decltype(std::declval<B&>().build_for_graph_capture(
                                     std::declval<const typename B::Inputs&>(), plan::AttentionState::DecodeOnly)),
                                 decltype(std::declval<B&>().build_for_drafting(
                                     std::declval<const typename B::Inputs&>(), int32_t{0}))>>
    : std::integral_constant<bool,
                             std::is_same_v<decltype(std::declval<B&>().build(std::declval<const typename B::Inputs&>())),
                                            const typename B::Output&>> {};
}  // namespace detail

// True when B has the three build entry points with the contract's signatures
// (B::Inputs / B::Output name its input and metadata types).
template <class B>
constexpr bool is_builder_v = detail::is_builder<B>::value;

}  // namespace aar::core
