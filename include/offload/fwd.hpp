// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Light forward header: names of torch-offload's public types, no LibTorch.
/// Include this where a type only needs to be named (declarations, members
/// held by pointer); include <offload/offload.hpp> where it is used.

namespace offload {

struct Options;
struct Range;
struct Stats;
struct StatField;
struct HostBuffer;
struct Reloaded;
template <class EntryState>
class Transfer;
template <class EntryState>
class TransferRef;
class Scope;
class NoOffload;
class AnyManager;
class ManagerInterface;
struct ScopeMark;

template <class Device, class Storage, class Sync>
class Manager;

namespace device {
struct Cuda;
struct Xpu;
struct Npu;
struct Neuron;
struct Generic;
struct Sim;
}  // namespace device

namespace storage {
struct PinnedHost;
struct PageableHost;
}  // namespace storage

namespace sync {
struct Blocking;
struct Streamed;
}  // namespace sync

}  // namespace offload
