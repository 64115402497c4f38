// SPDX-License-Identifier: MIT
#pragma once
// offload-demo's data-parallel training (--ranks N): N processes, each
// training on its shard of the text; after every backward the gradients are
// averaged through a c10d process group (bucketed all-reduce in parameter
// order), so every rank takes the same optimizer step. The collective
// backend comes from the device: sim -> offload::sim's offload_sim, cuda ->
// NCCL (when the build has it), anything else -> a usage error.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include "device.hpp"
#include "flags.hpp"

namespace c10d {
class ProcessGroup;
class Store;
}  // namespace c10d

namespace demo {

class DataParallel {
 public:
  /// nullptr for --ranks 1. Rank 0 (the process the user started) serves the
  /// rendezvous store on a socket bound to 127.0.0.1 (a free port), starts
  /// ranks 1..N-1 (this program again, with --rank and --rendezvous, stdout
  /// discarded) and waits for them; a started rank connects to
  /// --rendezvous. Throws UsageError naming the address when the ranks do not
  /// all meet within --rendezvous-timeout, or naming --ranks when the device
  /// has no collective backend in this build. On cuda, rank R trains on
  /// cuda:R (`device` is updated).
  static std::unique_ptr<DataParallel> join(const Args& args, DeviceChoice& device, char** argv);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  /// "offload_sim" or "nccl".
  const std::string& backend() const { return backend_; }

  /// Rank `rank()`'s shard of the token ids: contiguous, size()-th parts.
  at::Tensor shard(const at::Tensor& tokens) const;
  /// Makes every parameter rank 0's (one broadcast per parameter, in order).
  void broadcast_parameters(const std::vector<at::Tensor>& parameters) const;
  /// Averages the gradients over the ranks: buckets of about 1 MiB in
  /// parameter order, each one all-reduce (sum) then a division by size().
  void average_gradients(const std::vector<at::Tensor>& parameters) const;
  /// Rank 0: every rank's `text`, by rank (the others get an empty list).
  std::vector<std::string> gather(const std::string& key, const std::string& text) const;
  /// Rank 0: waits for the ranks it started; false if any failed.
  bool wait_for_ranks();

 private:
  DataParallel() = default;
  int rank_ = 0;
  int size_ = 1;
  std::string backend_;
  std::string address_;
  std::chrono::milliseconds timeout_{0};
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::vector<int> children_;  // pids of the started ranks, until waited for
};

}  // namespace demo
