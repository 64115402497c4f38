// SPDX-License-Identifier: MIT
// device::Cuda: the one translation unit that includes c10/cuda.

#include <offload/device/cuda.hpp>

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string_view>

#include <cuda_runtime_api.h>

#include <ATen/Context.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <offload/numa.hpp>

namespace offload::device {

bool Cuda::available() { return at::globalContext().hasCUDA() && c10::cuda::device_count() > 0; }

c10::Stream Cuda::current_stream(c10::DeviceIndex index) { return c10::cuda::getCurrentCUDAStream(index).unwrap(); }

namespace {

constexpr std::size_t kMaxDevices = 64;

// A stream of this library's own on device `index`, made once with
// `priority` (0: the default, lower: higher priority) and kept for the
// process: never one of c10's pool streams, which every torch.cuda.Stream()
// of the process shares round-robin.
c10::Stream own_stream(c10::DeviceIndex index, bool high_priority) {
  static std::mutex mutex;
  static std::array<std::array<cudaStream_t, 2>, kMaxDevices> streams{};
  TORCH_CHECK(index >= 0 && static_cast<std::size_t>(index) < kMaxDevices, "offload::device::Cuda: device index ",
              static_cast<int>(index), " is out of range [0, ", kMaxDevices, ")");
  const std::lock_guard lock(mutex);
  auto& slot = streams[static_cast<std::size_t>(index)][high_priority ? 1 : 0];
  if (slot == nullptr) {
    const c10::cuda::CUDAGuard on_device(index);
    int least = 0;
    int greatest = 0;
    C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    C10_CUDA_CHECK(cudaStreamCreateWithPriority(&slot, cudaStreamNonBlocking, high_priority ? greatest : least));
  }
  return c10::cuda::getStreamFromExternal(slot, index).unwrap();
}

// The caching allocator's active bytes on `index` (now, or the peak since
// its last reset): bytes in blocks handed out and not yet reusable, so a
// block freed while a recorded stream (record_stream) still uses it counts
// until that stream passes the free. -1 before CUDA's lazy initialisation
// and under an allocator without statistics (a CUDAPluggableAllocator).
std::int64_t active_bytes(c10::DeviceIndex index, bool peak) noexcept {
  try {
    auto* allocator = c10::cuda::CUDACachingAllocator::get();
    if (allocator == nullptr || !allocator->initialized()) return -1;
    const auto stats = allocator->getDeviceStats(index);
    const auto& active = stats.active_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return peak ? active.peak : active.current;
  } catch (...) {
    return -1;
  }
}

}  // namespace

c10::Stream Cuda::side_stream(c10::DeviceIndex index) { return own_stream(index, /*high_priority=*/false); }

c10::Stream Cuda::h2d_stream(c10::DeviceIndex index) { return own_stream(index, /*high_priority=*/true); }

void Cuda::record_stream(const at::Tensor& t, c10::Stream stream) {
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), c10::cuda::CUDAStream(stream));
}

std::int64_t Cuda::memory_allocated(c10::DeviceIndex index) { return active_bytes(index, /*peak=*/false); }

std::int64_t Cuda::memory_peak(c10::DeviceIndex index) { return active_bytes(index, /*peak=*/true); }

bool Cuda::capturing(c10::DeviceIndex index) noexcept {
  // The current stream of `index` asked directly: no device switch on the
  // pack path.
  try {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(index).stream(), &status) != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky, and not the caller's: clear it
      return false;
    }
    return status != cudaStreamCaptureStatusNone;
  } catch (...) {
    return false;
  }
}

void Cuda::empty_cache() { c10::cuda::CUDACachingAllocator::emptyCache(); }

int Cuda::numa_node(c10::DeviceIndex index) noexcept {
  // node + 2 per device; 0: not looked up yet (racing first calls look it up
  // twice, alike).
  static std::array<std::atomic<int>, 64> nodes{};
  if (index < 0 || static_cast<std::size_t>(index) >= nodes.size()) return -1;
  auto& slot = nodes[static_cast<std::size_t>(index)];
  if (const int known = slot.load(std::memory_order_relaxed); known != 0) return known - 2;
  int node = -1;
  // The PCI address as the runtime writes it ("0000:3B:00.0"; an ABI-stable
  // call, unlike reading cudaDeviceProp, whose layout changed between
  // toolkits). sysfs names the domain with 4 digits.
  char bus_id[32] = {};
  if (cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof bus_id), index) == cudaSuccess) {
    std::string_view id(bus_id);
    if (const auto colon = id.find(':'); colon == 8 && id.starts_with("0000")) id.remove_prefix(4);
    node = offload::numa::pci_node(id);
  } else {
    (void)cudaGetLastError();  // not sticky, and not the caller's: clear it
  }
  slot.store(node + 2, std::memory_order_relaxed);
  return node;
}

}  // namespace offload::device
