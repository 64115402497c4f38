// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The names the core uses for offload::ManagerInterface and
/// offload::ScopeMark (<offload/manager_interface.hpp>).

#include <offload/manager_interface.hpp>

namespace offload::detail {

using HookSource = ManagerInterface;
using ScopeMark = offload::ScopeMark;

}  // namespace offload::detail
