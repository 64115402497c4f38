// SPDX-License-Identifier: MIT
#pragma once

// offload::sim — a simulated accelerator registered as LibTorch's PrivateUse1
// backend, so that streams, events, asynchronous copies, device memory limits
// and use-after-free faults can be tested on machines without an accelerator.
//
// Device memory is ordinary host memory (so every ATen CPU kernel can run on
// it through the boxed CPU fallback), but it is handed out by a counting,
// caching allocator with an optional capacity, released in stream order and,
// in checking mode, filled with 0xFF bytes (NaN for floating types) when it
// is handed out and when it is released. Every stream of every device is one
// worker thread with a FIFO queue (a thread waiting for the stream runs the
// next queued task itself when the worker is not running one, one task at a
// time in queue order): a `non_blocking` copy between the CPU and
// a sim device is queued on the current stream of the sim device, events
// complete when their stream reaches them, and every other operator
// first waits for the current stream of its device to drain, then runs
// inline on the calling thread. Every copy between the CPU and a sim device
// crosses a simulated link: it takes `latency + bytes / bandwidth` (the two
// link knobs) on the stream it runs on (a queued copy's bytes move at the
// end of that time; a blocking one holds the host for it). A missing wait or an early free therefore shows up as wrong
// numbers (NaN) rather than going unnoticed.
//
// Semantics worth knowing (each is a deliberate choice):
// - Streams: stream 0 is each device's default stream, ids 1..8 its pool
//   (getStreamFromGlobalPool and getNewStream hand them out round robin).
//   The current stream is per thread and per device, as in CUDA. Events
//   complete when their stream reaches them; block(event, stream) waits for
//   the recording current at the time of the call; an event never recorded
//   is complete; elapsedTime needs EventFlag::BACKEND_DEFAULT ("timing").
// - Copies: a non_blocking copy with one CPU side is always asynchronous,
//   pinned or pageable (stricter than CUDA, where pageable copies are
//   partly synchronous). The CPU tensor is kept alive until the copy has
//   run; the sim memory is not (as with CUDA's caching allocator). A
//   blocking copy first drains the device's current stream, copies, and
//   holds the host until its link time has passed. Both kinds cost the link
//   time, copy_latency_us + bytes / copy_bandwidth_gbps; a queued copy's
//   host memcpy comes on top, after its link time (so its bytes land last).
//   Copies between sim devices (or within one) drain the current streams
//   and run inline, with no link time.
// - Compute: every other operator drains its device's current stream and
//   runs on the calling thread with the CPU kernel (boxed CPU fallback), so
//   results are bitwise those of the CPU; random operators use the CPU
//   generator (the sim devices share it). Tensors of different devices in
//   one operator are an error, except 0-dim CPU tensors (scalars) and CPU
//   index tensors, as on CUDA.
// - Memory: both allocators cache, as CUDA's caching allocator and pinned
//   host allocator do. Sizes are rounded up (512 bytes below 1 MiB, 128 KiB
//   above); a released block is kept idle by size and handed out again for
//   a request it fits, on any stream: a device block for one it fits best
//   (at most 25 % larger), a pinned host block only for a request of its
//   rounded size (as CUDA's pinned allocator keeps one free list per
//   power of two, so what a request sets aside is its rounded size). A
//   device block is released in stream order (see device_memory()), so it
//   is reused only after the work queued on its streams before the free has
//   run; at once when those streams are idle, the usual case since compute
//   runs inline. It stops counting as in use at its free, unless a stream
//   recorded on it still has that work queued: the active bytes of a
//   caching allocator; its allocated bytes, which drop at the free even
//   then, are counted too (MemoryStats::allocated_bytes). In
//   checking mode a released device block first waits in
//   a bounded quarantine (64 MiB, 1024 blocks), so that a late reader sees the poison rather than the next owner's
//   data. Idle blocks above 1 GiB per cache, and all of them at empty_cache(), go back to malloc. The reserved counters
//   drop only when a block goes back to malloc.
//
// A c10d collective backend for sim (DDP, FSDP2 and c10d process groups
// across processes) is declared in <offload/sim_collectives.hpp>.
//
// Users on real hardware never link this library; it is a test substrate and
// a CPU demo device. It is modelled on how PyTorch tests its own out-of-tree
// device support (test/cpp_extensions/open_registration_extension).

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <string>
#include <vector>

namespace offload::sim {

/// Largest accepted Config::copy_latency_us (10 s).
inline constexpr std::int64_t kMaxCopyLatencyUs = 10'000'000;
/// Largest accepted Config::copy_bandwidth_gbps (10 TB/s, above any
/// device's memory bandwidth).
inline constexpr double kMaxCopyBandwidthGbps = 10'000.0;
/// Largest accepted Config::pinned_alloc_us (1 s).
inline constexpr std::int64_t kMaxPinnedAllocUs = 1'000'000;

/// What install() registers. Fields are validated by install(); see there.
struct Config {
  /// Name of the PrivateUse1 backend ("sim", "npu", "neuron", ...): lower-case
  /// letters, digits and '_', starting with a letter, at most 32 characters,
  /// and not the name of an in-tree device type ("cuda", "cpu", ...).
  std::string backend_name = "sim";
  /// Number of devices, in [1, 16].
  int num_devices = 2;
  /// Device-memory capacity per device in bytes; 0 means unlimited. An
  /// allocation that would exceed it throws c10::OutOfMemoryError.
  std::int64_t capacity_bytes = 0;
  /// Link latency in microseconds: the fixed part of the time every copy
  /// between the CPU and a sim device takes, blocking or not, in
  /// [0, kMaxCopyLatencyUs]. The default, 10 us, is the order of a PCIe DMA
  /// transfer's launch and completion; the test suites raise it to widen
  /// race windows.
  std::int64_t copy_latency_us = 10;
  /// Link bandwidth in GB/s (1e9 bytes per second): a copy of n bytes
  /// takes n / copy_bandwidth_gbps nanoseconds on top of the latency, in
  /// (0, kMaxCopyBandwidthGbps]. The default, 25 GB/s, is what a pinned copy
  /// achieves over PCIe 4.0 x16.
  double copy_bandwidth_gbps = 25.0;
  /// Checking mode: fill device blocks with 0xFF bytes when they are
  /// allocated and when they are released (reads of memory that is not yet
  /// written, or already freed, see NaN for floating types).
  bool poison_freed = false;
  /// How the pinned host allocator sizes a block it takes from malloc:
  /// false, as the device allocator does (512 bytes below 1 MiB, 128 KiB
  /// above); true, the next power of two, as PyTorch's caching host
  /// allocator (CUDA's, XPU's) does, so that 2^k + 1 bytes reserve 2^(k+1)
  /// (host_memory().reserved_bytes shows it).
  bool host_power_of_two = false;
  /// What taking a fresh block from malloc costs the thread of the pinned
  /// host allocation, in microseconds (it waits that long; a block reused
  /// from the cache costs nothing), in [0, kMaxPinnedAllocUs]: pinning
  /// pages is what makes cudaHostAlloc cost milliseconds. With
  /// host_power_of_two, sim's pinned memory behaves as CUDA's
  /// (docs/guide.md, "The simulated accelerator", has the values).
  std::int64_t pinned_alloc_us = 0;
  /// Stream-order checking, as PyTorch's CUDA sanitizer
  /// (torch.cuda._sanitizer) checks CUDA streams: every kernel and copy sim
  /// runs declares the storages it reads and writes (an operator's schema
  /// says which) on the stream it is queued on, and an access not ordered
  /// after the last conflicting access of the same storage from another
  /// stream (by an event wait, or a stream, event or device synchronize)
  /// throws c10::Error from the operator, naming it, both streams, the
  /// tensor's shape and the earlier access. The caching allocators' rules
  /// are checked too: a device block freed on its stream may be reused
  /// there at once, so a stream that used it without record_stream must be
  /// ordered before its next storage's accesses; a pinned host buffer at an
  /// address a copy still used must not be reused before that copy is
  /// ordered. The environment variable OFFLOAD_SIM_CHECK_STREAMS (0 or 1),
  /// read by install(), overrides it. docs/testing.md: what it costs.
  bool check_streams = false;

  friend bool operator==(const Config&, const Config&) = default;
};

/// Registers the sim backend for the whole process: the PrivateUse1 backend
/// name, the device allocator, the pinned host allocator and PrivateUse1
/// hooks (so at::getAccelerator() returns PrivateUse1), and the native
/// kernels plus the boxed CPU fallback. The device guard (streams, events) is
/// registered when the library is loaded, so that the autograd engine sizes
/// its device threads correctly even if a backward pass runs before install().
///
/// The first call installs `config`. A later call with a Config equal to
/// the one installed first (whatever the runtime knobs were set to since)
/// does nothing; any other Config throws c10::Error naming each field that
/// differs. Every field is validated before anything changes
/// (c10::ValueError naming the field, the value and the accepted range).
/// Every call reads OFFLOAD_SIM_CHECK_STREAMS: any value other than 0 or 1
/// throws c10::ValueError naming the variable and the accepted values,
/// before anything changes; at the first call, 1 turns
/// Config::check_streams on and 0 off, whatever `config` says (the
/// installed Config stays `config`; config() shows the knob). Throws
/// c10::Error if another PrivateUse1 backend name is already registered in
/// the process. Thread-safe.
void install(const Config& config = {});

/// True once install() has succeeded. Thread-safe.
bool installed() noexcept;

/// The installed Config, with the current values of the runtime knobs
/// (copy_latency_us, copy_bandwidth_gbps, poison_freed, capacity_bytes,
/// host_power_of_two, pinned_alloc_us, check_streams).
/// Throws c10::Error if not installed. Thread-safe.
Config config();

/// Runtime knob: link latency in microseconds of every copy issued from now
/// on, in [0, kMaxCopyLatencyUs] (c10::ValueError naming it otherwise,
/// nothing changed). Copies already queued keep the link time they were
/// queued with. Throws c10::Error if not installed. Thread-safe.
void set_copy_latency_us(std::int64_t us);

/// Runtime knob: link bandwidth in GB/s of every copy issued from now on,
/// in (0, kMaxCopyBandwidthGbps] (c10::ValueError naming it otherwise,
/// nothing changed). Copies already queued keep the link time they were
/// queued with. Throws c10::Error if not installed. Thread-safe.
void set_copy_bandwidth_gbps(double gbps);

/// Runtime knob: checking mode (see Config::poison_freed) for blocks
/// allocated or released from now on. Throws c10::Error if not installed.
/// Thread-safe.
void set_poison_freed(bool on);

/// Runtime knob: per-device capacity in bytes, 0 = unlimited, >= 0
/// (c10::ValueError otherwise). Lowering it below what is in use frees
/// nothing; later allocations fail until enough is released. Throws
/// c10::Error if not installed. Thread-safe.
void set_capacity_bytes(std::int64_t bytes);

/// Runtime knob: Config::host_power_of_two, for blocks the pinned host
/// allocator takes from malloc from now on. Throws c10::Error if not
/// installed. Thread-safe.
void set_host_power_of_two(bool on);

/// Runtime knob: Config::pinned_alloc_us, in [0, kMaxPinnedAllocUs]
/// (c10::ValueError naming it, the value and the range, otherwise). Throws
/// c10::Error if not installed. Thread-safe.
void set_pinned_alloc_us(std::int64_t us);

/// Runtime knob: Config::check_streams. Turning it on starts from a clean
/// slate (no access known, every stream ordered after the host), so it is
/// best set while no work is in flight. Throws c10::Error if not
/// installed. Thread-safe.
void set_check_streams(bool on);

/// Saves the runtime knobs on construction and restores them on
/// destruction, so that a test that changes them cannot leak its settings
/// into the next one, even when it throws. Requires install().
class ScopedKnobs {
 public:
  ScopedKnobs();
  ~ScopedKnobs();
  ScopedKnobs(const ScopedKnobs&) = delete;
  ScopedKnobs& operator=(const ScopedKnobs&) = delete;

 private:
  std::int64_t copy_latency_us_;
  double copy_bandwidth_gbps_;
  std::int64_t capacity_bytes_;
  bool poison_freed_;
  bool host_power_of_two_;
  std::int64_t pinned_alloc_us_;
  bool check_streams_;
};

/// Memory counters in bytes and in numbers of blocks (allocations, frees:
/// cumulative since install or the last
/// c10::DeviceAllocator::resetAccumulatedStats).
/// - current_bytes / peak_bytes: bytes in use, the requested sizes (not
///   rounded). A device block counts until its free, or, while a stream
///   recorded on it still has work queued before the free, until that work
///   has run (see device_memory()): CUDA's active (and requested) bytes,
///   reported as c10's `active_bytes` and `requested_bytes`; the figure a
///   device-memory target steers by.
/// - allocated_bytes / peak_allocated_bytes: the same blocks, each dropped
///   at its free whatever a recorded stream still does: CUDA's allocated
///   bytes (`torch.cuda.memory_allocated`), reported as c10's
///   `allocated_bytes`. current_bytes - allocated_bytes is what recorded
///   streams hold ("limbo"). Device only (the host allocator reports
///   current_bytes there).
/// - reserved_bytes / peak_reserved_bytes: bytes taken from malloc: blocks in
///   use (rounded sizes), idle in the cache, or in the poison quarantine.
///   c10's `reserved_bytes`. They drop at empty_cache().
/// - system_allocations: blocks taken from malloc (not from the cache):
///   for the pinned host allocator, what cudaHostAlloc calls are on CUDA.
struct MemoryStats {
  std::int64_t current_bytes = 0;
  std::int64_t peak_bytes = 0;
  std::int64_t allocations = 0;
  std::int64_t frees = 0;
  std::int64_t reserved_bytes = 0;
  std::int64_t peak_reserved_bytes = 0;
  std::int64_t system_allocations = 0;
  std::int64_t allocated_bytes = 0;
  std::int64_t peak_allocated_bytes = 0;
};

/// Counters of the sim device allocator for device `index`. A freed block is
/// released (back to the cache, reusable) at once when the stream it was
/// allocated on has nothing queued and no stream recorded on it
/// (recordStream) has pending work; otherwise its release is queued behind
/// that work. It counts as in use (current_bytes) until its free (its own
/// stream runs what comes next after that work), or, while a recorded
/// stream has work queued before the free, until that work has run: the
/// memory a side stream's copy still reads, as CUDA's active bytes count
/// it; allocated_bytes drops at the free, as CUDA's allocated bytes do. The capacity
/// (Config::capacity_bytes) limits the bytes in use; idle cached blocks do
/// not count against it. Throws c10::Error if not installed or `index` is not
/// a sim device. Thread-safe.
MemoryStats device_memory(c10::DeviceIndex index);

/// Sets the peaks of device `index` (in use, reserved) to their current
/// values. Throws like device_memory(). Thread-safe.
void reset_peak(c10::DeviceIndex index);

/// Counters of the pinned host allocator (tensor.pin_memory(), and
/// at::empty(..., pinned_memory(true)) when no CUDA device is present).
/// Throws c10::Error if not installed. Thread-safe.
MemoryStats host_memory();

/// Sets the host peaks (in use, reserved) to their current values.
/// Thread-safe.
void reset_host_peak();

/// Returns the idle cached blocks of every sim device and of the pinned host
/// allocator to malloc (like torch.cuda.empty_cache(), which returns only
/// device blocks; c10::DeviceAllocator::emptyCache() on the sim allocator
/// does the same for the devices alone). Blocks in use, waiting for stream
/// work, or in the poison quarantine stay. Throws c10::Error if not
/// installed. Thread-safe.
void empty_cache();

/// Waits until every stream of device `index` has finished its queued work
/// (index -1: the current device). Rethrows the first error a queued task
/// raised on those streams. Throws c10::Error if not installed.
void synchronize(c10::DeviceIndex index = -1);

/// For process exit: waits until every stream of every device has finished
/// its queued work, then runs all work queued from now on on the thread
/// that queues it (after the work queued before it on that stream), so the
/// idle stream workers touch nothing more. install() registers it with
/// std::atexit; an embedding runtime whose exit tears down what tasks may
/// release (Python's: a task dropping the last reference to a tensor that
/// has a Python object takes the GIL, which a thread outside the
/// interpreter cannot take once it is finalizing) calls it earlier
/// (torch_offload.sim does, from Python's atexit). Idempotent; does nothing
/// before install(). Errors of queued work are dropped (nobody is left to
/// report them to). Thread-safe; never throws.
void drain_for_exit() noexcept;

/// Starts (true) or ends (false) a simulated graph capture on `stream` (a
/// sim stream): while it lasts, offload::capturing(PrivateUse1, index)
/// answers true on every thread whose current stream of that device is
/// `stream`, as a CUDA stream inside a graph capture reports, so a manager treats the
/// region as a CUDA graph capture. Nothing is recorded or replayed: work
/// queued meanwhile runs as usual. Throws c10::Error if not installed or
/// `stream` is not a sim stream. Thread-safe.
void set_capturing(c10::Stream stream, bool on);

/// One sample of the device-0 memory trace: time in microseconds since
/// set_trace(true), and device-0 current bytes right after an allocation or
/// a release.
struct TracePoint {
  std::int64_t t_us;
  std::int64_t bytes;
};

/// Starts (true: clears the trace and restarts its clock) or stops recording
/// device-0 allocations and releases. Thread-safe.
void set_trace(bool on);

/// Returns the samples recorded so far and clears them. Thread-safe.
std::vector<TracePoint> take_trace();

}  // namespace offload::sim
