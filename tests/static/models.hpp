// SPDX-License-Identifier: MIT
#pragma once
// Test models for the compile-time tests: sync policies that satisfy
// sync_policy_for (a minimal one, and one with every step callback), and
// near-misses of the latter, each one member away (SyncModel<M> with M
// naming the member that is missing or wrong).

#include <string_view>
#include <type_traits>

#include <offload/concepts.hpp>

namespace static_tests {

/// Which member a SyncModel gets wrong.
enum class Miss {
  none,              ///< a model with every step callback
  release,           ///< no release()
  release_noexcept,  ///< release() not noexcept
  end_forward,       ///< end_forward() misspelt "end_froward"
  resume,            ///< no resume()
  reload_tensor,     ///< reload() returns at::Tensor instead of Reloaded
  entry_state,       ///< no EntryState
  undeclared,        ///< every step callback, but observes_steps not declared
};

struct WithEntryState {
  struct EntryState {};
  using T = offload::Transfer<EntryState>;
};
struct WithoutEntryState {
  using T = offload::Transfer<int>;
};

template <Miss M, bool NeedsEvents = false>
struct SyncModel {
  static constexpr std::string_view name = "sync_model";
  static constexpr bool needs_events = NeedsEvents;
  template <class D>
  struct State : std::conditional_t<M == Miss::entry_state, WithoutEntryState, WithEntryState> {
    using T = typename std::conditional_t<M == Miss::entry_state, WithoutEntryState, WithEntryState>::T;
    static constexpr bool observes_steps = M != Miss::undeclared;
    explicit State(const offload::Options&);
    void offload(const T&, const at::Tensor&);
    std::conditional_t<M == Miss::reload_tensor, at::Tensor, offload::Reloaded> reload(const T&);
    void on_unpack(const T&);
    void on_shared(const T&, const at::Tensor&);
    void end_forward()
      requires(M != Miss::end_forward);
    void end_froward()
      requires(M == Miss::end_forward);
    void end_backward();
    void suspend(const T&);
    void resume(const T&, const at::Tensor&)
      requires(M != Miss::resume);
    void add_stats(offload::Stats&) const;
    void release(const T&) noexcept(M != Miss::release_noexcept)
      requires(M != Miss::release);
  };
};

/// The minimal complete sync policy: the two copies, no step callback.
struct MinimalSync {
  static constexpr std::string_view name = "minimal";
  static constexpr bool needs_events = false;
  template <class D>
  struct State {
    struct EntryState {};
    explicit State(const offload::Options&);
    void offload(const offload::Transfer<EntryState>&, const at::Tensor&);
    offload::Reloaded reload(const offload::Transfer<EntryState>&);
  };
};

}  // namespace static_tests
