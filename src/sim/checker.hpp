// SPDX-License-Identifier: MIT
#pragma once

// The stream-order checker of sim (Config::check_streams): the semantics of
// PyTorch's CUDA sanitizer (torch.cuda._sanitizer) over sim's streams, plus
// the caching allocators' reuse rules. Each stream has a vector clock (the
// latest sequence number of every stream it is ordered after); every kernel
// and copy sim runs declares, on the stream it is queued on, the storages it
// reads and writes, and an access not ordered after the last conflicting
// access of the same storage from another stream is an error (c10::Error
// thrown from the operator). Events capture a clock at record and merge it
// into a waiting stream; stream, event and device synchronization (and a
// query that finds the work done) order every stream and the host after that
// point. Storages are identified by their block (device) or buffer (pinned
// host) address: one record per storage in a hash map, nothing per byte.
// Used by the kernels, the guard and both allocators. Not installed.

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace at {
class TensorBase;
}

namespace offload::sim::detail::check {

/// Whether checking is on (one relaxed load: the price of the checker when
/// it is off).
bool on() noexcept;

/// Turns checking on or off. Turning it on starts from a clean state: no
/// access known, every stream ordered after the host.
void set_on(bool on);

/// One tensor an operator touches: a sim tensor (its storage's block), or a
/// CPU tensor (only a pinned host buffer is tracked; others are ignored).
struct Touch {
  const at::TensorBase* tensor;
  bool write;
};

/// A kernel or a copy queued on stream `stream` of sim device `device`,
/// named `op` ("aten::add.Tensor"), touching `touches`. Records every access,
/// then throws c10::Error describing the first one not ordered after the
/// last conflicting access of its storage. Thread-safe.
void launch(c10::DeviceIndex device, c10::StreamId stream, std::string_view op, const std::vector<Touch>& touches);

/// A recorded event's clock.
using Clock = std::vector<std::uint64_t>;

/// The clock of stream (`device`, `stream`) now (an event recorded on it).
std::shared_ptr<const Clock> record(c10::DeviceIndex device, c10::StreamId stream);

/// Stream (`device`, `stream`) waits for an event recorded with `clock`.
void wait(const Clock& clock, c10::DeviceIndex device, c10::StreamId stream);

/// The host waited for an event recorded with `clock`: every stream and the
/// host are ordered after it.
void synchronize_event(const Clock& clock);

/// The host waited for stream (`device`, `stream`).
void synchronize_stream(c10::DeviceIndex device, c10::StreamId stream);

/// The host waited for every stream of `device`.
void synchronize_device(c10::DeviceIndex device);

/// The device allocator handed out the block at `ptr`; `fresh`: taken from
/// malloc (nothing is known of it).
void device_block_allocated(const void* ptr, bool fresh);

/// The device allocator's block at `ptr`, allocated on stream
/// (`device`, `alloc_stream`) and recorded on `recorded` (record_stream), is
/// freed: its own stream may reuse it at once, so the accesses of other,
/// unrecorded streams that its stream is not ordered after are kept and
/// checked against the block's next storage.
void device_block_freed(const void* ptr, c10::DeviceIndex device, c10::StreamId alloc_stream,
                        const std::vector<std::pair<c10::DeviceIndex, c10::StreamId>>& recorded);

/// The pinned host allocator handed out the block at `ptr` (it is reused
/// only after the copies of its previous tensor ran, as a caching host
/// allocator's events ensure): nothing of its past counts.
void host_block_allocated(const void* ptr);

}  // namespace offload::sim::detail::check
