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

/// CUDA device policy. Streams from c10's CUDA stream pool, events through
/// c10::Event, allocator safety through the CUDA caching allocator's
/// recordStream, statistics from the caching allocator.
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
  /// A stream from c10's CUDA stream pool.
  static c10::Stream side_stream(c10::DeviceIndex index);
  /// CUDACachingAllocator::recordStream on `t`'s memory.
  static void record_stream(const at::Tensor& t, c10::Stream stream);
  /// Bytes allocated by the caching allocator on `index` now.
  static std::int64_t memory_allocated(c10::DeviceIndex index);
  /// The most bytes allocated on `index` at once since the allocator's
  /// peak was last reset.
  static std::int64_t memory_peak(c10::DeviceIndex index);
  /// CUDACachingAllocator::emptyCache().
  static void empty_cache();
  /// The host NUMA node the GPU `index` is attached to: its PCI address
  /// (device properties) looked up in sysfs, -1 when sysfs does not say
  /// (one-node machines often report none). Cached per device after the
  /// first call. Never throws.
  static int numa_node(c10::DeviceIndex index) noexcept;
};

}  // namespace offload::device
