// SPDX-License-Identifier: MIT
// device::Cuda: the one translation unit that includes c10/cuda.

#include <offload/device/cuda.hpp>

#include <array>
#include <atomic>
#include <cstdio>

#include <cuda_runtime_api.h>

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include <offload/numa.hpp>

// ATen's device properties (libtorch_cuda), declared here rather than taken
// from <ATen/cuda/CUDAContext.h>, which includes the cuBLAS, cuSPARSE and
// cuSOLVER headers: a CUDA 12 wheel keeps each in a folder of its own, and
// this file needs none of them.
namespace at::cuda {
cudaDeviceProp* getDeviceProperties(c10::DeviceIndex device);
}  // namespace at::cuda

namespace offload::device {

bool Cuda::available() { return at::globalContext().hasCUDA() && c10::cuda::device_count() > 0; }

c10::Stream Cuda::current_stream(c10::DeviceIndex index) { return c10::cuda::getCurrentCUDAStream(index).unwrap(); }

c10::Stream Cuda::side_stream(c10::DeviceIndex index) {
  return c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index).unwrap();
}

void Cuda::record_stream(const at::Tensor& t, c10::Stream stream) {
  c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), c10::cuda::CUDAStream(stream));
}

std::int64_t Cuda::memory_allocated(c10::DeviceIndex index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].current;
}

std::int64_t Cuda::memory_peak(c10::DeviceIndex index) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  return stats.allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)].peak;
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
  try {
    const auto* props = at::cuda::getDeviceProperties(index);
    char bus_id[32];
    std::snprintf(bus_id, sizeof bus_id, "%04x:%02x:%02x.0", static_cast<unsigned>(props->pciDomainID),
                  static_cast<unsigned>(props->pciBusID), static_cast<unsigned>(props->pciDeviceID));
    node = offload::numa::pci_node(bus_id);
  } catch (...) {
    node = -1;
  }
  slot.store(node + 2, std::memory_order_relaxed);
  return node;
}

}  // namespace offload::device
