// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// device::Cuda: NVIDIA GPUs through c10/cuda. Declarations only: no CUDA
/// header is included here; the definitions live in the library's CUDA
/// translation unit, compiled when LibTorch was built with CUDA
/// (OFFLOAD_HAS_CUDA in <offload/config.hpp>).

#include <cstdint>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace offload::device {

/// CUDA device policy. Copy streams of its own (one per direction and
/// device, host-to-device at high priority), events through c10::Event,
/// allocator safety through the CUDA caching allocator's recordStream,
/// statistics from the caching allocator (active bytes: what it cannot hand
/// out again, blocks held for a recorded stream included).
///
/// Thread-safety: every member is thread-safe (c10/cuda is).
/// Errors: calls throw c10::Error when no CUDA device is present.
struct Cuda {
  static constexpr c10::DeviceType device_type = c10::DeviceType::CUDA;
  static constexpr std::string_view name = "cuda";
  static constexpr bool has_streams = true;
  static constexpr bool has_events = true;
  /// True when this LibTorch has CUDA and at least one device is visible.
  static bool available();
  /// The current CUDA stream of `index` on this thread.
  static c10::Stream current_stream(c10::DeviceIndex index);
  /// The device-to-host copy stream of `index`: made by this library once
  /// per device (default priority, non-blocking), never one of c10's pool
  /// streams, which the whole process shares round-robin.
  static c10::Stream side_stream(c10::DeviceIndex index);
  /// The host-to-device copy stream of `index`: another stream of its own,
  /// at the device's highest priority (backward waits on these copies), so
  /// the two directions use both copy engines.
  static c10::Stream h2d_stream(c10::DeviceIndex index);
  /// CUDACachingAllocator::recordStream on `t`'s memory.
  static void record_stream(const at::Tensor& t, c10::Stream stream);
  /// The caching allocator's active bytes on `index` now
  /// (`torch.cuda.memory_stats()["active_bytes.all.current"]`): blocks
  /// handed out, and blocks freed while a stream recorded on them
  /// (record_stream) has not yet passed the free. allocated_bytes leaves
  /// the latter out though they cannot be reused, so a target steered by it
  /// overshoots. -1 (not reported) before CUDA's lazy initialisation and
  /// under an allocator without statistics (CUDAPluggableAllocator). Never
  /// throws.
  static std::int64_t memory_allocated(c10::DeviceIndex index);
  /// The most active bytes on `index` at once since the allocator's peak
  /// was last reset; -1 as memory_allocated(). Never throws.
  static std::int64_t memory_peak(c10::DeviceIndex index);
  /// Whether the current CUDA stream of `index` is capturing a CUDA graph
  /// (c10::cuda::currentStreamCaptureStatusMayInitCtx). Never throws (false
  /// when CUDA cannot say).
  static bool capturing(c10::DeviceIndex index) noexcept;
  /// CUDACachingAllocator::emptyCache().
  static void empty_cache();
  /// The host NUMA node the GPU `index` is attached to: its PCI address
  /// (device properties) looked up in sysfs, -1 when sysfs does not say
  /// (one-node machines often report none). Cached per device after the
  /// first call. Never throws.
  static int numa_node(c10::DeviceIndex index) noexcept;
};

}  // namespace offload::device
