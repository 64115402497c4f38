// SPDX-License-Identifier: MIT
//
// The sim's device guard: the current device and stream of each thread, the
// stream pool, and events (a recording is a marker's position on its
// stream).

#include "checker.hpp"
#include "internal.hpp"

#include <offload/detail/linked.hpp>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>

namespace offload::sim::detail {
namespace {

using c10::DeviceIndex;
using c10::StreamId;

// One recording of an event: the marker's position on its stream.
struct Recording {
  SimStream* stream = nullptr;
  std::uint64_t position = 0;
  std::atomic<std::int64_t> t_ns{-1};
  std::shared_ptr<const check::Clock> clock;  // the stream's clock at the record (checking mode)
  bool done() const { return stream->reached(position); }
};

struct SimEvent {
  explicit SimEvent(DeviceIndex d) : device(d) {}
  const DeviceIndex device;
  std::mutex mutex;
  std::shared_ptr<Recording> last;  // null: never recorded

  std::shared_ptr<Recording> recording() {
    std::lock_guard<std::mutex> lock(mutex);
    return last;
  }
};

void check_index_loose(DeviceIndex index) {
  auto* rt = g_runtime.load(std::memory_order_acquire);
  const int limit = rt != nullptr ? rt->installed.num_devices : kMaxDevices;
  TORCH_CHECK(index >= 0 && index < limit, "offload::sim: device index ", static_cast<int>(index),
              " is out of range [0, ", limit, ")");
}

struct SimGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kSimType; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const auto old = getDevice();
    setDevice(device);
    return old;
  }

  c10::Device getDevice() const override { return {kSimType, t_device}; }

  void setDevice(c10::Device device) const override {
    TORCH_CHECK(device.type() == kSimType, "offload::sim: setDevice needs a sim device, got ", device);
    if (device.index() < 0) {
      return;
    }
    // Before install() the autograd engine's device threads may already
    // set their device; any index below kMaxDevices is accepted then.
    check_index_loose(device.index());
    t_device = device.index();
  }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    if (device.index() >= 0 && device.index() < kMaxDevices) {
      t_device = device.index();
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    const auto index = resolve(device.index());
    check_device(index);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kSimType, index), t_stream[static_cast<std::size_t>(index)]);
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    const auto index = resolve(device.index());
    check_device(index);
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(kSimType, index));
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool /*isHighPriority*/) const override {
    const auto index = resolve(device.index());
    check_device(index);
    const auto n = runtime().next_pool[static_cast<std::size_t>(index)].fetch_add(1);
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kSimType, index), static_cast<StreamId>(1 + n % kPoolStreams));
  }

  // The pool is small and fixed (like CUDA's): a "new" stream is the next
  // pool stream.
  c10::Stream getNewStream(c10::Device device, int /*priority*/) const override {
    return getStreamFromGlobalPool(device, false);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override {
    auto& s = stream_ref(stream);
    auto& slot = t_stream[static_cast<std::size_t>(s.device())];
    const auto old = slot;
    slot = s.id();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kSimType, s.device()), old);
  }

  void* getStreamNativeHandle(const c10::Stream stream) const override { return &stream_ref(stream); }

  void destroyEvent(void* event, const DeviceIndex /*device_index*/) const noexcept override {
    delete static_cast<SimEvent*>(event);
  }

  void record(void** event, const c10::Stream& stream, const DeviceIndex device_index,
              const c10::EventFlag /*flag*/) const override {
    auto& s = stream_ref(stream);
    TORCH_CHECK(device_index == -1 || device_index == s.device(), "offload::sim: event device index ",
                static_cast<int>(device_index), " does not match the recording stream's device ",
                static_cast<int>(s.device()));
    if (*event == nullptr) {
      *event = new SimEvent(s.device());
    }
    auto* ev = static_cast<SimEvent*>(*event);
    TORCH_CHECK(ev->device == s.device(), "offload::sim: event of ", device_name(ev->device),
                " cannot be recorded on a stream of ", device_name(s.device()));
    auto rec = std::make_shared<Recording>();
    rec->stream = &s;
    if (check::on()) rec->clock = check::record(s.device(), s.id());
    rec->position = s.mark([rec] { rec->t_ns.store(now_ns()); });
    std::lock_guard<std::mutex> lock(ev->mutex);
    ev->last = std::move(rec);
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) {
      return;
    }
    auto rec = static_cast<SimEvent*>(event)->recording();
    if (!rec) {
      return;
    }
    auto& s = stream_ref(stream);
    if (rec->clock && check::on()) check::wait(*rec->clock, s.device(), s.id());
    if (rec->stream == &s || rec->done()) {
      return;  // FIFO order already waits for it, or there is nothing left to wait for
    }
    s.enqueue([rec] { rec->stream->wait(rec->position); });
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) {
      return true;
    }
    auto rec = static_cast<SimEvent*>(event)->recording();
    if (!rec) return true;
    const bool done = rec->done();
    // The host saw the work done: it and every stream are ordered after it.
    if (done && rec->clock && check::on()) check::synchronize_event(*rec->clock);
    return done;
  }

  void synchronizeEvent(void* event) const override {
    if (event == nullptr) {
      return;
    }
    if (auto rec = static_cast<SimEvent*>(event)->recording()) {
      rec->stream->wait(rec->position);
      if (rec->clock && check::on()) check::synchronize_event(*rec->clock);
    }
  }

  DeviceIndex deviceCount() const noexcept override {
    // Before install() report the maximum so that an autograd engine
    // started earlier has a ready queue for every possible sim device.
    auto* rt = g_runtime.load(std::memory_order_acquire);
    return static_cast<DeviceIndex>(rt != nullptr ? rt->installed.num_devices : kMaxDevices);
  }

  bool queryStream(const c10::Stream& stream) const override {
    auto& s = stream_ref(stream);
    const bool idle = s.idle();
    if (idle && check::on()) check::synchronize_stream(s.device(), s.id());
    return idle;
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    auto& s = stream_ref(stream);
    s.synchronize();
    if (check::on()) check::synchronize_stream(s.device(), s.id());
  }

  void synchronizeDevice(const DeviceIndex device_index) const override { offload::sim::synchronize(device_index); }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr, const c10::Stream& stream) const override {
    device_allocator().recordStream(data_ptr, stream);
  }

  double elapsedTime(void* event1, void* event2, const DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(event1 != nullptr && event2 != nullptr,
                "offload::sim: both events must be recorded before calculating elapsed time");
    auto r1 = static_cast<SimEvent*>(event1)->recording();
    auto r2 = static_cast<SimEvent*>(event2)->recording();
    TORCH_CHECK(r1 && r2, "offload::sim: both events must be recorded before calculating elapsed time");
    TORCH_CHECK(r1->done() && r2->done(),
                "offload::sim: both events must be completed before calculating elapsed time");
    return static_cast<double>(r2->t_ns.load() - r1->t_ns.load()) / 1e6;
  }
};

SimGuardImpl& instance() {
  static auto* instance = new SimGuardImpl();
  return *instance;
}

// Registered at load time (see install()'s documentation for why).
const c10::impl::DeviceGuardImplRegistrar g_guard_registrar(kSimType, &instance());

// So that make_manager's errors say this program has the sim device.
const bool g_noted_linked = (offload::detail::note_linked("sim"), true);

}  // namespace

c10::impl::DeviceGuardImplInterface& guard_impl() { return instance(); }

}  // namespace offload::sim::detail
