// SPDX-License-Identifier: MIT
// Must-not-compile cases for tests/static/one_error.py: each CASE is a
// Manager (or make_manager) whose policies fail one concept by one member;
// the build must stop with exactly one error, naming that concept and
// member. With -DTWIN the same program, one token away, must compile.

#include <cstdint>
#include <memory>
#include <string_view>

#include <offload/offload.hpp>

struct Device {
  static constexpr c10::DeviceType device_type = c10::DeviceType::PrivateUse1;
  static constexpr std::string_view name = "device";
  static constexpr bool has_streams = false;
  static constexpr bool has_events = false;
#if CASE != 1 || defined(TWIN)
  static bool available() { return true; }
#endif
#if CASE != 8 || defined(TWIN)
  static int numa_node(c10::DeviceIndex) noexcept { return -1; }
#else
  static long numa_node(int) { return -1; }
#endif
};

struct Storage {
  static constexpr std::string_view name = "storage";
#if CASE != 2 || defined(TWIN)
  static constexpr bool prefers_pinned = false;
#endif
  offload::HostBuffer allocate(const offload::HostRequest&);
};

struct Sync {
  static constexpr std::string_view name = "sync";
  static constexpr bool needs_events = false;
  template <class D>
  struct State {
    struct EntryState {};
    using Transfer = offload::Transfer<EntryState>;
#if CASE != 7 || defined(TWIN)
    static constexpr bool observes_steps = true;
#else
    static constexpr bool observes_steps = false;
#endif
    explicit State(const offload::Options&) {}
    void offload(const Transfer&, const at::Tensor&) {}
    offload::Reloaded reload(const Transfer&) { return {}; }
    void on_unpack(const Transfer&) {}
    void on_shared(const Transfer&, const at::Tensor&) {}
#if CASE != 3 || defined(TWIN)
    void end_forward() {}
#else
    void end_froward() {}
#endif
    void end_backward() {}
    void suspend(const Transfer&) {}
    void resume(const Transfer&, const at::Tensor&) {}
    void add_stats(offload::Stats&) const {}
#if CASE != 5 || defined(TWIN)
    void release(const Transfer&) noexcept {}
#else
    void release(const Transfer&) {}
#endif
  };
};

#if CASE == 4 && !defined(TWIN)
using Chosen = offload::sync::Streamed;  // needs events; Device has none
#else
using Chosen = Sync;
#endif

#if CASE == 6
// The dispatcher: a storage policy without prefers_pinned, through make_manager.
struct BadStorage {
  static constexpr std::string_view name = "bad";
#ifdef TWIN
  static constexpr bool prefers_pinned = false;
#endif
  offload::HostBuffer allocate(const offload::HostRequest&);
};
offload::AnyManager make() { return offload::make_manager<BadStorage, offload::sync::Streamed>(); }
#else
offload::AnyManager make() { return offload::Manager<Device, Storage, Chosen>(offload::Options{}); }
#endif
