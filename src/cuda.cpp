// SPDX-License-Identifier: MIT
// device::Cuda: the one translation unit that includes c10/cuda.

#include <offload/device/cuda.hpp>

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

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

}  // namespace offload::device
