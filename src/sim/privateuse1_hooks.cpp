// SPDX-License-Identifier: MIT
//
// The sim's PrivateUse1 hooks: what at:: asks of a PrivateUse1 backend
// (availability, device count and current device, pinned memory, generators,
// storage resizing).

#include "internal.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Storage.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace offload::sim::detail {
namespace {

using c10::DeviceIndex;

struct SimHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return g_runtime.load() != nullptr; }
  bool hasPrimaryContext(DeviceIndex /*device_index*/) const override { return true; }
  void init() const override {}
  DeviceIndex deviceCount() const override {
    auto* rt = g_runtime.load();
    return static_cast<DeviceIndex>(rt != nullptr ? rt->installed.num_devices : 0);
  }
  void setCurrentDevice(DeviceIndex device) const override { guard_impl().setDevice({kSimType, device}); }
  DeviceIndex getCurrentDevice() const override { return t_device; }
  DeviceIndex exchangeDevice(DeviceIndex device) const override {
    return guard_impl().exchangeDevice({kSimType, device}).index();
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex device) const override { return exchangeDevice(device); }
  bool isPinnedPtr(const void* data) const override { return is_pinned(data); }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &host_allocator(); }
  at::Device getDeviceFromPtr(void* data) const override {
    const auto device = device_of(data);
    TORCH_CHECK(device.has_value(), "offload::sim: ", data, " is not in a live sim device block");
    return {kSimType, *device};
  }
  // Kernels run on the CPU through the fallback, with the CPU generator; the
  // sim device shares it so that seeded runs match the CPU bit for bit.
  const at::Generator& getDefaultGenerator(DeviceIndex /*device_index*/) const override {
    return at::detail::getDefaultCPUGenerator();
  }
  at::Generator getNewGenerator(DeviceIndex /*device_index*/ = -1) const override {
    return at::detail::createCPUGenerator();
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, std::size_t newsize) const override {
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    const auto index = storage.device().index();
    check_device(index);
    drain_current(index);
    const auto old_device = std::exchange(t_device, index);
    c10::DataPtr data;
    try {
      data = device_allocator().allocate(newsize);
    } catch (...) {
      t_device = old_device;
      throw;
    }
    t_device = old_device;
    const auto keep = std::min(newsize, storage.nbytes());
    if (keep > 0 && storage.data() != nullptr) {
      std::memcpy(data.get(), storage.data(), keep);
    }
    auto* impl = storage.unsafeGetStorageImpl();
    impl->set_data_ptr_noswap(std::move(data));
    impl->set_nbytes(newsize);
  }
};

}  // namespace

at::PrivateUse1HooksInterface& hooks() {
  static auto* instance = new SimHooks();
  return *instance;
}

}  // namespace offload::sim::detail
