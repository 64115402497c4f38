// SPDX-License-Identifier: MIT
#pragma once
// Test models for the compile-time tests: a sync policy that satisfies
// sync_policy_for, and its near-misses, each one member away (SyncModel<M>
// with M naming the member that is missing or wrong).

#include <memory>
#include <string_view>
#include <type_traits>

#include <offload/concepts.hpp>

namespace static_tests {

/// Which member a SyncModel gets wrong.
enum class Miss {
  none,              ///< a model
  release,           ///< no release()
  release_noexcept,  ///< release() not noexcept
  settle,            ///< settle() misspelt "settel"
  resume,            ///< no resume()
  reload_tensor,     ///< reload() returns at::Tensor instead of Reloaded
  entry_state,       ///< no EntryState
};

struct WithEntryState {
  struct EntryState {};
  using E = offload::Entry<EntryState>;
};
struct WithoutEntryState {
  using E = offload::Entry<int>;
};

template <Miss M, bool NeedsEvents = false>
struct SyncModel {
  static constexpr std::string_view name = "sync_model";
  static constexpr bool needs_events = NeedsEvents;
  template <class D>
  struct State : std::conditional_t<M == Miss::entry_state, WithoutEntryState, WithEntryState> {
    using E = typename std::conditional_t<M == Miss::entry_state, WithoutEntryState, WithEntryState>::E;
    explicit State(const offload::Options&);
    void offload(const std::shared_ptr<E>&, const at::Tensor&);
    std::conditional_t<M == Miss::reload_tensor, at::Tensor, offload::Reloaded> reload(const std::shared_ptr<E>&);
    void on_unpack(const std::shared_ptr<E>&);
    void settle() requires(M != Miss::settle);
    void settel() requires(M == Miss::settle);
    void end_backward();
    void resume(const std::shared_ptr<E>&) requires(M != Miss::resume);
    void add_stats(offload::Stats&) const;
    void release(E&) noexcept(M != Miss::release_noexcept) requires(M != Miss::release);
  };
};

}  // namespace static_tests
