// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Everything a user of torch-offload needs, in one include: options,
/// stats, the manager and AnyManager, scopes, checkpoint, the runtime dispatcher
/// (make_manager, builtin_devices), and every device, storage and sync
/// policy this build ships (device::Cuda only when OFFLOAD_HAS_CUDA).
/// The simulated device's functions (offload::sim::install) are in
/// <offload/sim.hpp>, which ships with liboffload_sim. docs/headers.md
/// lists the narrower headers and what each costs to include.

#include <offload/any_manager.hpp>
#include <offload/buffers.hpp>
#include <offload/checkpoint.hpp>
#include <offload/concepts.hpp>
#include <offload/config.hpp>
#include <offload/dispatch.hpp>
#include <offload/manager.hpp>
#include <offload/numa.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>
#include <offload/stats.hpp>
#include <offload/transfer.hpp>

#include <offload/builtin.hpp>
#include <offload/device/generic.hpp>
#include <offload/device/generic_ops.hpp>
#include <offload/device/neuron.hpp>
#include <offload/device/npu.hpp>
#include <offload/device/sim.hpp>
#include <offload/device/xpu.hpp>
#include <offload/storage/host.hpp>
#include <offload/storage/pool.hpp>
#include <offload/sync/blocking.hpp>
#include <offload/sync/streamed.hpp>
#if OFFLOAD_HAS_CUDA
#include <offload/device/cuda.hpp>
#endif
