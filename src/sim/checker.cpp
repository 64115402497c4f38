// SPDX-License-Identifier: MIT
//
// The stream-order checker (checker.hpp): vector clocks per stream, one
// access record per storage, and the reports.

#include "checker.hpp"

#include "internal.hpp"

#include <ATen/core/TensorBase.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace offload::sim::detail::check {
namespace {

constexpr std::size_t kStreams = std::size_t{kMaxDevices} * kStreamsPerDevice;

using StreamIndex = std::uint16_t;  // device * kStreamsPerDevice + stream id

// One access of a storage by a kernel or copy.
struct Access {
  std::uint64_t seq = 0;  // the launch's sequence number
  StreamIndex stream = 0;
  StreamIndex old_home = 0;  // `previous`: the stream the block's previous storage was allocated on
  bool write = false;
  bool previous = false;  // an access to the previous storage of a block, kept at its free
  const std::string* op = nullptr;
};

// What is known of one storage: its last write and the reads since (at most
// one per stream: a later read on a stream orders after the earlier ones).
struct Record {
  std::optional<Access> write;
  std::vector<Access> reads;
  const void* owner = nullptr;  // pinned host buffers: the storage last seen at this address
};

struct NameHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

struct State {
  std::mutex mutex;
  std::uint64_t seq = 0;
  std::vector<Clock> clocks = std::vector<Clock>(kStreams);  // empty: stream not seen yet
  Clock host = Clock(kStreams, 0);
  std::unordered_map<const void*, Record> device;
  std::unordered_map<const void*, Record> pinned;
  std::unordered_set<std::string, NameHash, std::equal_to<>> names;
};

std::atomic<bool> g_on{false};

State& state() {
  static auto* s = new State();  // leaked: stream workers may outlive main()
  return *s;
}

StreamIndex index_of(c10::DeviceIndex device, c10::StreamId stream) {
  return static_cast<StreamIndex>(device * kStreamsPerDevice + stream);
}

std::string stream_name(StreamIndex s) {
  return device_name(static_cast<c10::DeviceIndex>(s / kStreamsPerDevice)) + " stream " +
         std::to_string(s % kStreamsPerDevice);
}

// The clock of stream `s`; a stream seen for the first time is ordered after
// what the host is (as CSAN creates streams).
Clock& clock_of(State& st, StreamIndex s) {
  auto& c = st.clocks[s];
  if (c.empty()) c = st.host;
  return c;
}

void merge(Clock& into, const Clock& other) {
  for (std::size_t i = 0; i < kStreams; ++i) into[i] = std::max(into[i], other[i]);
}

bool ordered(const Clock& c, const Access& earlier) { return earlier.seq <= c[earlier.stream]; }

// The earlier access `now` conflicts with and is not ordered after, if any:
// a read needs the last write; a write the reads since it, or the write.
// `reuse`: every earlier access counts (a pinned buffer's new owner).
const Access* unordered(const Record& r, const Clock& c, bool write, bool reuse) {
  if (write || reuse) {
    for (const auto& a : r.reads) {
      if (!ordered(c, a)) return &a;
    }
    if (!r.reads.empty() && !reuse) return nullptr;
  }
  return r.write && !ordered(c, *r.write) ? &*r.write : nullptr;
}

void apply(Record& r, const Access& a) {
  if (a.write) {
    r.write = a;
    r.reads.clear();
    return;
  }
  auto same = std::find_if(r.reads.begin(), r.reads.end(), [&](const Access& x) { return x.stream == a.stream; });
  if (same != r.reads.end()) {
    *same = a;
  } else {
    r.reads.push_back(a);
  }
}

const char* kind_of(bool write, const Access& earlier) {
  if (!write) return "read-after-write";
  return earlier.write ? "write-after-write" : "write-after-read";
}

// The report of `now` (by `op` on stream `s`, touching `t`) against `earlier`.
std::string report(const std::string& op, StreamIndex s, const at::TensorBase& t, bool write, bool pinned, bool reuse,
                   const Access& earlier) {
  std::ostringstream out;
  const auto now = stream_name(s);
  const auto then = stream_name(earlier.stream);
  out << "offload::sim stream check: " << op << " on " << now << (write ? " writes " : " reads ")
      << (pinned ? "a pinned host buffer" : "a storage") << " (tensor of shape " << t.sizes() << ", "
      << t.dtype().name() << ")";
  const char* verb = earlier.write ? " wrote " : " read ";
  if (earlier.previous) {
    out << " in a block whose previous storage (allocated on " << stream_name(earlier.old_home) << ") " << *earlier.op
        << verb << "on " << then << " before it was freed, and " << now << " is not ordered after that access: "
        << (s == earlier.old_home ? "a storage used on a second stream without record_stream, then freed and reused"
                                  : "a block reused across streams after a free")
        << " (record_stream(" << then << ") before the free, or an event wait, orders it)";
  } else if (reuse) {
    out << " at an address whose previous buffer " << *earlier.op << verb << "on " << then << ", and " << now
        << " is not ordered after that copy: a pinned buffer reused before its copy ended";
  } else {
    out << " that " << *earlier.op << verb << "on " << then << ", and " << now
        << " is not ordered after it: " << kind_of(write, earlier)
        << " with no event wait or synchronization between the two streams";
  }
  return out.str();
}

const std::string* intern(State& st, std::string_view op) {
  auto found = st.names.find(op);
  if (found == st.names.end()) found = st.names.emplace(op).first;
  return &*found;
}

// Where a touched tensor's storage is recorded: a sim block, a pinned host
// buffer, or nowhere (null).
struct Target {
  std::unordered_map<const void*, Record>* map = nullptr;
  const void* key = nullptr;
  const void* owner = nullptr;
  bool write = false;
  std::size_t touch = 0;  // the first touch of this storage
};

Target target_of(State& st, const Touch& touch, const std::vector<bool>& pinned, std::size_t i) {
  const auto& t = *touch.tensor;
  if (!t.defined() || !t.has_storage()) return {};
  const void* key = t.storage().data_ptr().get();
  if (key == nullptr) return {};
  if (t.device().type() == kSimType) return {&st.device, key, nullptr, touch.write, i};
  if (pinned[i]) return {&st.pinned, key, t.storage().unsafeGetStorageImpl(), touch.write, i};
  return {};
}

}  // namespace

bool on() noexcept { return g_on.load(std::memory_order_relaxed); }

void set_on(bool enable) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  if (enable && !g_on.load()) {
    st.clocks.assign(kStreams, Clock{});
    st.host.assign(kStreams, 0);
    st.device.clear();
    st.pinned.clear();
  }
  g_on.store(enable);
}

void launch(c10::DeviceIndex device, c10::StreamId stream, std::string_view op, const std::vector<Touch>& touches) {
  // Outside the checker's lock (the host allocator takes its own).
  std::vector<bool> pinned(touches.size(), false);
  for (std::size_t i = 0; i < touches.size(); ++i) {
    const auto& t = *touches[i].tensor;
    pinned[i] = t.defined() && t.has_storage() && t.device().is_cpu() && is_pinned(t.storage().data_ptr().get());
  }
  std::string error;
  {
    auto& st = state();
    const std::lock_guard lock(st.mutex);
    const auto s = index_of(device, stream);
    auto& c = clock_of(st, s);
    const auto seq = ++st.seq;
    c[s] = seq;
    const auto* name = intern(st, op);
    std::vector<Target> targets;
    for (std::size_t i = 0; i < touches.size(); ++i) {
      auto tg = target_of(st, touches[i], pinned, i);
      if (tg.map == nullptr) continue;
      // A storage both read and written is written (CSAN's read_only set).
      auto same = std::find_if(targets.begin(), targets.end(), [&](const Target& x) { return x.key == tg.key; });
      if (same != targets.end()) {
        same->write = same->write || tg.write;
        continue;
      }
      targets.push_back(tg);
    }
    for (const auto& tg : targets) {
      auto& r = (*tg.map)[tg.key];
      const bool reuse = tg.owner != nullptr && r.owner != nullptr && r.owner != tg.owner;
      if (const auto* earlier = unordered(r, c, tg.write, reuse); earlier != nullptr && error.empty()) {
        error = report(*name, s, *touches[tg.touch].tensor, tg.write, tg.owner != nullptr, reuse, *earlier);
      }
      if (reuse) r = Record{};
      r.owner = tg.owner;
      apply(r, Access{seq, s, 0, tg.write, false, name});
    }
  }
  TORCH_CHECK(error.empty(), error);
}

std::shared_ptr<const Clock> record(c10::DeviceIndex device, c10::StreamId stream) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  return std::make_shared<const Clock>(clock_of(st, index_of(device, stream)));
}

void wait(const Clock& clock, c10::DeviceIndex device, c10::StreamId stream) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  merge(clock_of(st, index_of(device, stream)), clock);
}

void synchronize_event(const Clock& clock) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  for (auto& c : st.clocks) {
    if (!c.empty()) merge(c, clock);
  }
  merge(st.host, clock);
}

void synchronize_stream(c10::DeviceIndex device, c10::StreamId stream) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  const Clock done = clock_of(st, index_of(device, stream));
  for (auto& c : st.clocks) {
    if (!c.empty()) merge(c, done);
  }
  merge(st.host, done);
}

void synchronize_device(c10::DeviceIndex device) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  for (c10::StreamId id = 0; id < kStreamsPerDevice; ++id) {
    const auto s = index_of(device, id);
    if (!st.clocks[s].empty()) st.host[s] = std::max(st.host[s], st.clocks[s][s]);
  }
  for (auto& c : st.clocks) {
    if (!c.empty()) merge(c, st.host);
  }
}

void device_block_allocated(const void* ptr, bool fresh) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  auto found = st.device.find(ptr);
  if (found == st.device.end()) return;
  auto& r = found->second;
  // Only what was kept at the free counts (accesses recorded while the free
  // went unseen are dropped); a block fresh from malloc has no past.
  if (fresh || (r.write && !r.write->previous)) r.write.reset();
  std::erase_if(r.reads, [&](const Access& a) { return fresh || !a.previous; });
  if (!r.write && r.reads.empty()) st.device.erase(found);
}

void device_block_freed(const void* ptr, c10::DeviceIndex device, c10::StreamId alloc_stream,
                        const std::vector<std::pair<c10::DeviceIndex, c10::StreamId>>& recorded) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  auto found = st.device.find(ptr);
  if (found == st.device.end()) return;
  const auto home = index_of(device, alloc_stream);
  const auto& c = clock_of(st, home);
  // Covered: its own stream reuses it in stream order, the allocator waits
  // for a recorded stream, or its stream is already ordered after it.
  const auto covered = [&](const Access& a) {
    if (a.stream == home || ordered(c, a)) return true;
    return std::any_of(recorded.begin(), recorded.end(),
                       [&](const auto& rec) { return index_of(rec.first, rec.second) == a.stream; });
  };
  auto& r = found->second;
  const auto keep = [&](Access& a) {
    if (!a.previous) {
      a.previous = true;
      a.old_home = home;
    }
  };
  if (r.write && covered(*r.write)) r.write.reset();
  std::erase_if(r.reads, covered);
  if (r.write) keep(*r.write);
  std::for_each(r.reads.begin(), r.reads.end(), keep);
  if (!r.write && r.reads.empty()) st.device.erase(found);
}

void host_block_allocated(const void* ptr) {
  auto& st = state();
  const std::lock_guard lock(st.mutex);
  st.pinned.erase(ptr);
}

}  // namespace offload::sim::detail::check
