// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Everything a user of torch-offload needs: options, stats, the manager,
/// scopes, and the device, storage and sync policies this build ships.

#include <offload/config.hpp>
#include <offload/any_manager.hpp>
#include <offload/concepts.hpp>
#include <offload/manager.hpp>
#include <offload/options.hpp>
#include <offload/scope.hpp>
#include <offload/stats.hpp>

#include <offload/device/cuda.hpp>
#include <offload/device/sim.hpp>
#include <offload/storage/host.hpp>
#include <offload/sync/blocking.hpp>
#include <offload/sync/streamed.hpp>
