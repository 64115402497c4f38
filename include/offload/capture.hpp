// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Stream capture (CUDA graphs, and a backend's own graph capture): whether
/// the work a thread queues on a device's current stream is being recorded
/// into a graph instead of run. Under capture a manager offloads nothing
/// (Stats::passed_capture): its event waits and queries, host allocations
/// and side-stream forks are illegal there and would break the capture far
/// from the cause. device::Cuda asks CUDA itself; a PrivateUse1 backend
/// tells the library through a probe (offload::sim registers one).

#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

namespace offload {

/// Whether the current stream of device `index` (of the probe's device
/// type) on the calling thread is capturing. Must not throw; called per
/// offloadable saved tensor, so it should be cheap.
using CaptureProbe = bool (*)(c10::DeviceIndex index) noexcept;

/// Registers the capture probe of device type `type` (null removes it).
/// A backend with graph capture calls it once, e.g. when it is installed.
/// Thread-safe.
void set_capture_probe(c10::DeviceType type, CaptureProbe probe) noexcept;

/// Whether the current stream of `type`'s device `index` is capturing, by
/// its registered probe; false without one. Thread-safe; one atomic load
/// when no probe is registered.
bool capturing(c10::DeviceType type, c10::DeviceIndex index) noexcept;

}  // namespace offload
