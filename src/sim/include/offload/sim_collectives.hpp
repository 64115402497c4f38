// SPDX-License-Identifier: MIT
#pragma once

// offload::sim collectives — a c10d collective backend for the simulated
// device, so that data-parallel and sharded training (DDP, FSDP2, a LibTorch
// program averaging gradients through c10d) run with several processes on
// `sim`. It is a test substrate, not a production backend: every collective
// moves its bytes through the c10d Store the ranks rendezvoused on (a
// TCPStore on 127.0.0.1) and is slow for large tensors.
//
// How a collective runs, on every rank, synchronously on the calling thread:
// the inputs are copied to host memory with a blocking copy (which first
// drains the current sim stream, so the collective runs as if queued on it),
// each rank sets its bytes in the store under a key of its own for this
// collective (a per-backend counter: ranks must issue collectives in the same
// order, as with every c10d backend), every rank reads all contributions and
// combines them in rank order with ATen operators on the CPU (rank 0's value,
// then rank 1's added to it, ...), and copies the result back. Results are
// therefore identical on every rank and deterministic (same inputs, same
// bits). The last rank to finish a collective deletes its keys, so the store
// does not grow with the number of collectives.
//
// Supported: allreduce and allreduce_coalesced (SUM, AVG for floating types,
// MIN, MAX), broadcast, allgather, allgather_coalesced, _allgather_base
// (all_gather_into_tensor), allgather_into_tensor_coalesced, reduce_scatter,
// _reduce_scatter_base (reduce_scatter_tensor),
// reduce_scatter_tensor_coalesced, gather, scatter (the root's whole list
// goes through the store; each rank takes its piece), barrier, and send /
// recv. Every other operation (reduce, alltoall, alltoall_base,
// recvAnysource, monitoredBarrier, allreduce_sparse), and every other
// ReduceOp, throws c10::NotImplementedError (NotImplementedError in Python)
// "offload::sim collectives: <op> is not supported by the offload_sim
// backend" before anything is exchanged. Tensors may be on sim or on the
// CPU.
//
// Every collective returns a completed c10d::Work whose getFuture() holds
// the output tensors (what DDP's reducer and comm hooks read).
//
// Point-to-point: send(tensors, dst, tag) copies the tensors to host memory
// (a blocking copy) and sets them in the store under a key of their own
// (source, destination, tag and a sequence number per (destination, tag)),
// then returns a completed Work: a send never waits for its receiver.
// recv(tensors, src, tag) returns at once, before the message is there, so
// that a rank can post its receives and sends together
// (torch.distributed.batch_isend_irecv, the pipeline schedules) without
// waiting for its peer; the Work's wait() (also getFuture(), and
// isCompleted() once the message is in the store) waits up to the
// backend's timeout for the message, deletes its key and copies it into
// the tensors (a copy on the current stream for sim tensors). The copy is
// made outside autograd and leaves the tensors' version counter alone, as a
// device backend writing memory does (a pipeline stage receives into a leaf
// that requires grad). Messages between two ranks with one tag are received
// in the order they were sent, as c10d requires.

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>

namespace offload::sim {

/// The name of the backend (c10d::Backend::getBackendName(), and the name
/// torch_offload.sim.install() registers with torch.distributed).
inline constexpr const char* collective_backend_name = "offload_sim";

/// A collective backend for rank `rank` of `size` ranks that rendezvous on
/// `store` (every rank passes a store of the same server and prefix).
/// `timeout` bounds each wait for another rank's contribution (a c10d
/// DistStoreError when it expires). Does not require install() for CPU
/// tensors; sim tensors need it. Throws c10::ValueError if `size` < 1, `rank`
/// is not in [0, size) or `timeout` is not positive. One backend is used by
/// one thread at a time (collectives are issued in order, as c10d requires).
c10::intrusive_ptr<c10d::Backend> make_collective_backend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                                          std::chrono::milliseconds timeout);

/// A process group for LibTorch programs on sim: make_collective_backend()
/// registered for the CPU and the sim device type and made the default, so
/// that c10d::Reducer, c10d::ProcessGroup::allreduce(...) and friends work on
/// sim tensors. Throws like make_collective_backend(), and c10::Error if
/// install() was not called.
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                                          std::chrono::milliseconds timeout);

}  // namespace offload::sim
