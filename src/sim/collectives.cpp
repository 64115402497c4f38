// SPDX-License-Identifier: MIT
// The c10d collective backend of the sim device (see <offload/sim_collectives.hpp>).

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <offload/sim.hpp>
#include <offload/sim_collectives.hpp>

namespace offload::sim {
namespace {

using Bytes = std::vector<std::uint8_t>;
using c10d::OpType;

[[noreturn]] void not_supported(const std::string& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, "offload::sim collectives: ", op, " is not supported by the ",
                              collective_backend_name, " backend");
}

/// A Work that is complete when constructed: its future holds `outputs`.
class DoneWork final : public c10d::Work {
 public:
  DoneWork(int rank, OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type), outputs_(std::move(outputs)) {
    std::vector<c10::Device> devices;
    for (const auto& t : outputs_) {
      if (!t.device().is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
    future_->markCompleted(c10::IValue(outputs_));
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/) override { return true; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// Where a point-to-point message waits in the store: the sender's `seq`-th
/// message with `tag` from `src` to `dst` (ranks of this group; the store is
/// the group's).
std::string message_key(int src, int dst, int tag, std::uint64_t seq) {
  return "offload_sim/p2p/" + std::to_string(src) + "/" + std::to_string(dst) + "/" + std::to_string(tag) + "/" +
         std::to_string(seq);
}

/// A posted receive: nothing happens at post time, so that a rank can post
/// its receives and sends together (batch_isend_irecv) without waiting for
/// its peer. wait() (and getFuture(), and isCompleted() once the message is
/// in the store) takes the message out of the store, deletes its key and
/// copies it into the tensors (a copy on the current stream for sim
/// tensors). Thread-safe: the first caller completes it, the others wait.
class RecvWork final : public c10d::Work {
 public:
  RecvWork(int rank, c10::intrusive_ptr<c10d::Store> store, std::string key, int src, std::vector<at::Tensor> tensors,
           std::chrono::milliseconds timeout)
      : c10d::Work(rank, OpType::RECV),
        store_(std::move(store)),
        key_(std::move(key)),
        src_(src),
        tensors_(std::move(tensors)),
        timeout_(timeout) {}

  bool isCompleted() override {
    std::lock_guard<std::mutex> lock(complete_mutex_);
    if (!received_ && store_->check({key_})) receive_locked(timeout_);
    return received_;
  }
  bool isSuccess() const override {
    std::lock_guard<std::mutex> lock(complete_mutex_);
    return received_;
  }
  int sourceRank() const override { return src_; }
  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(complete_mutex_);
    receive_locked(timeout == ::kNoTimeout ? timeout_ : timeout);
    return true;
  }
  std::vector<at::Tensor> result() override { return tensors_; }
  /// Completes the receive first (blocking), like wait().
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    wait(::kNoTimeout);
    std::lock_guard<std::mutex> lock(complete_mutex_);
    if (!future_) {
      std::vector<c10::Device> devices;
      for (const auto& t : tensors_) {
        if (!t.device().is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
          devices.push_back(t.device());
        }
      }
      future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
      future_->markCompleted(c10::IValue(tensors_));
    }
    return future_;
  }

 private:
  void receive_locked(std::chrono::milliseconds timeout) {
    if (received_) return;
    store_->wait({key_}, timeout);
    auto bytes = store_->get(key_);
    store_->deleteKey(key_);
    std::size_t expected = 0;
    for (const auto& t : tensors_) expected += t.nbytes();
    TORCH_CHECK(bytes.size() == expected, "offload::sim collectives: recv: rank ", src_, " sent ", bytes.size(),
                " bytes, rank ", rank_, " expected ", expected,
                " (the ranks disagree on the tensors' shapes or dtypes)");
    std::size_t at = 0;
    for (auto& t : tensors_) {
      auto from = at::from_blob(bytes.data() + at, t.sizes(), t.options().device(at::kCPU));
      // Written like a backend writes device memory: outside autograd (a
      // stage's input buffer is a leaf that requires grad) and without
      // bumping the tensor's version.
      t.variable_data().copy_(from);
      at += t.nbytes();
    }
    received_ = true;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string key_;
  int src_;
  std::vector<at::Tensor> tensors_;
  std::chrono::milliseconds timeout_;
  mutable std::mutex complete_mutex_;
  bool received_ = false;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

/// Host bytes of `tensors`, one after the other (a blocking copy: it drains
/// the current sim stream first).
Bytes pack(const std::vector<at::Tensor>& tensors) {
  std::size_t total = 0;
  std::vector<at::Tensor> host;
  host.reserve(tensors.size());
  for (const auto& t : tensors) {
    host.push_back(t.to(at::kCPU).contiguous());
    total += host.back().nbytes();
  }
  Bytes out(total);
  std::size_t at = 0;
  for (const auto& h : host) {
    if (h.nbytes() != 0) std::memcpy(out.data() + at, h.data_ptr(), h.nbytes());
    at += h.nbytes();
  }
  return out;
}

std::size_t total_bytes(const std::vector<at::Tensor>& tensors) {
  std::size_t total = 0;
  for (const auto& t : tensors) total += t.nbytes();
  return total;
}

/// CPU tensors shaped like `like`, viewing `blob` (which must outlive them).
std::vector<at::Tensor> unpack(Bytes& blob, const std::vector<at::Tensor>& like) {
  std::vector<at::Tensor> out;
  out.reserve(like.size());
  std::size_t at = 0;
  for (const auto& t : like) {
    out.push_back(at::from_blob(blob.data() + at, t.sizes(), t.options().device(at::kCPU)));
    at += t.nbytes();
  }
  return out;
}

/// parts[0] op parts[1] op ... in rank order, as a new CPU tensor.
at::Tensor combine(const std::vector<at::Tensor>& parts, c10d::ReduceOp op) {
  at::Tensor acc = parts.front().clone();
  for (std::size_t r = 1; r < parts.size(); ++r) {
    switch (op) {
      case c10d::ReduceOp::SUM:
      case c10d::ReduceOp::AVG:
        acc.add_(parts[r]);
        break;
      case c10d::ReduceOp::MIN:
        at::minimum_out(acc, acc, parts[r]);
        break;
      case c10d::ReduceOp::MAX:
        at::maximum_out(acc, acc, parts[r]);
        break;
      default:
        break;  // rejected by check_op before any exchange
    }
  }
  if (op == c10d::ReduceOp::AVG) acc.div_(static_cast<double>(parts.size()));
  return acc;
}

std::string reduce_op_name(c10d::ReduceOp op) {
  switch (op) {
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return std::to_string(static_cast<int>(op.op_));
  }
}

void check_op(const std::string& what, c10d::ReduceOp op, const std::vector<at::Tensor>& tensors) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      return;
    case c10d::ReduceOp::AVG:
      for (const auto& t : tensors) {
        if (!at::isFloatingType(t.scalar_type())) {
          not_supported(what + " with ReduceOp.AVG on " + std::string(c10::toString(t.scalar_type())));
        }
      }
      return;
    default:
      not_supported(what + " with ReduceOp." + reduce_op_name(op));
  }
}

class SimCollectives final : public c10d::Backend {
 public:
  SimCollectives(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout)
      : c10d::Backend(rank, size), store_(std::move(store)), timeout_(timeout) {}

  const std::string getBackendName() const override { return collective_backend_name; }
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return reduce_all("allreduce", OpType::ALLREDUCE, tensors, opts.reduceOp);
  }
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    return reduce_all("allreduce_coalesced", OpType::ALLREDUCE_COALESCED, tensors, opts.reduceOp);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const int root = check_root("broadcast", opts.rootRank);
    auto blobs =
        exchange("broadcast", getRank() == root ? pack(tensors) : Bytes{}, root, std::nullopt, total_bytes(tensors));
    if (getRank() != root) {
      const auto in = unpack(blobs[root], tensors);
      for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].copy_(in[i]);
    }
    return done(OpType::BROADCAST, tensors);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& /*opts*/) override {
    gather_lists("allgather", outputs, inputs);
    return done(OpType::ALLGATHER, flatten(outputs));
  }
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& /*opts*/) override {
    gather_lists("allgather_coalesced", outputs, inputs);
    return done(OpType::ALLGATHER_COALESCED, flatten(outputs));
  }
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& /*opts*/) override {
    std::vector<at::Tensor> outs{output}, ins{input};
    gather_into("_allgather_base", outs, ins);
    return done(OpType::_ALLGATHER_BASE, outs);
  }
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& /*opts*/) override {
    gather_into("allgather_into_tensor_coalesced", outputs, inputs);
    return done(OpType::COALESCED, outputs);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const std::string what = "reduce_scatter";
    check_op(what, opts.reduceOp, outputs);
    TORCH_CHECK_VALUE(inputs.size() == outputs.size(), "offload::sim collectives: ", what,
                      " needs one input list per output, got ", inputs.size(), " for ", outputs.size());
    std::vector<at::Tensor> flat;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      TORCH_CHECK_VALUE(static_cast<int>(inputs[i].size()) == getSize(), "offload::sim collectives: ", what,
                        " input list ", i, " must hold ", getSize(), " tensors, got ", inputs[i].size());
      for (const auto& t : inputs[i]) flat.push_back(t);
    }
    auto blobs = exchange(what, pack(flat), std::nullopt, std::nullopt, total_bytes(flat));
    std::vector<std::vector<at::Tensor>> peers;
    for (auto& b : blobs) peers.push_back(unpack(b, flat));
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      std::vector<at::Tensor> parts;
      for (const auto& p : peers) parts.push_back(p[i * getSize() + getRank()]);
      outputs[i].copy_(combine(parts, opts.reduceOp));
    }
    return done(OpType::REDUCE_SCATTER, outputs);
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    std::vector<at::Tensor> outs{output}, ins{input};
    scatter_into("_reduce_scatter_base", outs, ins, opts.reduceOp);
    return done(OpType::_REDUCE_SCATTER_BASE, outs);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    scatter_into("reduce_scatter_tensor_coalesced", outputs, inputs, opts.reduceOp);
    return done(OpType::COALESCED, outputs);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const std::string what = "gather";
    const int root = check_root(what, opts.rootRank);
    TORCH_CHECK_VALUE(inputs.size() == 1, "offload::sim collectives: ", what, " needs 1 input tensor, got ",
                      inputs.size());
    if (getRank() == root) {
      TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
                        "offload::sim collectives: ", what, " needs on the root 1 output list of ", getSize(),
                        " tensors, got ", outputs.size(), " lists of ", outputs.empty() ? 0 : outputs[0].size());
    } else {
      TORCH_CHECK_VALUE(outputs.empty(), "offload::sim collectives: ", what,
                        " takes no output list on a rank other than the root, got ", outputs.size());
    }
    auto blobs = exchange(what, pack(inputs), std::nullopt, root, total_bytes(inputs));
    if (getRank() != root) return done(OpType::GATHER, {});
    for (int r = 0; r < getSize(); ++r) outputs[0][r].copy_(unpack(blobs[r], inputs)[0]);
    return done(OpType::GATHER, outputs[0]);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const std::string what = "scatter";
    const int root = check_root(what, opts.rootRank);
    TORCH_CHECK_VALUE(outputs.size() == 1, "offload::sim collectives: ", what, " needs 1 output tensor, got ",
                      outputs.size());
    if (getRank() == root) {
      TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
                        "offload::sim collectives: ", what, " needs on the root 1 input list of ", getSize(),
                        " tensors, got ", inputs.size(), " lists of ", inputs.empty() ? 0 : inputs[0].size());
      for (const auto& t : inputs[0]) {
        TORCH_CHECK_VALUE(t.nbytes() == outputs[0].nbytes(), "offload::sim collectives: ", what,
                          " input tensors must have the output's ", outputs[0].nbytes(), " bytes, got ", t.nbytes());
      }
    } else {
      TORCH_CHECK_VALUE(inputs.empty(), "offload::sim collectives: ", what,
                        " takes no input list on a rank other than the root, got ", inputs.size());
    }
    // The root's contribution is its whole list; every rank takes its piece.
    std::vector<at::Tensor> like(static_cast<std::size_t>(getSize()), outputs[0]);
    auto blobs = exchange(what, getRank() == root ? pack(inputs[0]) : Bytes{}, root, std::nullopt, total_bytes(like));
    outputs[0].copy_(unpack(blobs[root], like)[getRank()]);
    return done(OpType::SCATTER, outputs);
  }

  /// Puts the message in the store and returns a completed Work: the bytes
  /// wait there for the peer's recv (a send never blocks).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override {
    check_peer("send", "dstRank", dstRank);
    const auto seq = sent_[{dstRank, tag}]++;
    store_->set(message_key(getRank(), dstRank, tag, seq), pack(tensors));
    return done(OpType::SEND, tensors);
  }

  /// Returns at once a Work that receives when waited on (see RecvWork).
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override {
    check_peer("recv", "srcRank", srcRank);
    const auto seq = received_[{srcRank, tag}]++;
    return c10::make_intrusive<RecvWork>(getRank(), store_, message_key(srcRank, getRank(), tag, seq), srcRank, tensors,
                                         timeout_);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& /*opts*/) override {
    exchange("barrier", Bytes{}, std::nullopt, std::nullopt, 0);
    return done(OpType::BARRIER, {});
  }

  // Everything else c10d::Backend declares.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>&, const c10d::AllreduceOptions&) override {
    not_supported("allreduce_sparse");
  }
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>&, const c10d::ReduceOptions&) override {
    not_supported("reduce");
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor&, at::Tensor&, std::vector<int64_t>&, std::vector<int64_t>&,
                                               const c10d::AllToAllOptions&) override {
    not_supported("alltoall_base");
  }
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>&, std::vector<at::Tensor>&,
                                          const c10d::AllToAllOptions&) override {
    not_supported("alltoall");
  }
  void monitoredBarrier(const c10d::BarrierOptions&, bool) override { not_supported("monitoredBarrier"); }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>&, int) override {
    not_supported("recvAnysource");
  }

 private:
  /// The contributions to the next collective: every rank's, or `sender`'s
  /// alone, read by every rank, or by `reader` alone (entries a rank does not
  /// read stay empty; a rank that reads nothing does not wait). Each sending
  /// rank sets its bytes under its own key, each reading rank waits for the
  /// keys it reads, then every rank counts itself done; the last to count
  /// deletes the keys (a reader counts after it has read). Throws if a
  /// contribution read is not `expected` bytes (the ranks disagree on the
  /// shapes).
  std::vector<Bytes> exchange(const std::string& what, Bytes mine, std::optional<int> sender, std::optional<int> reader,
                              std::size_t expected) {
    const std::string prefix = std::string("offload_sim/") + std::to_string(sequence_++) + "/";
    const int size = getSize();
    const int me = getRank();
    auto key = [&](int r) { return prefix + std::to_string(r); };
    auto sends = [&](int r) { return !sender || *sender == r; };
    const bool reads = !reader || *reader == me;
    if (sends(me)) store_->set(key(me), mine);
    std::vector<Bytes> out(static_cast<std::size_t>(size));
    if (reads) {
      std::vector<std::string> keys;
      for (int r = 0; r < size; ++r) {
        if (sends(r) && r != me) keys.push_back(key(r));
      }
      if (!keys.empty()) {
        store_->wait(keys, timeout_);
        auto got = store_->multiGet(keys);
        std::size_t k = 0;
        for (int r = 0; r < size; ++r) {
          if (sends(r) && r != me) out[r] = std::move(got[k++]);
        }
      }
      if (sends(me)) out[me] = std::move(mine);
    }
    if (store_->add(prefix + "done", 1) == size) {
      for (int r = 0; r < size; ++r) {
        if (sends(r)) store_->deleteKey(key(r));
      }
      store_->deleteKey(prefix + "done");
    }
    if (reads) {
      for (int r = 0; r < size; ++r) {
        if (sends(r)) {
          TORCH_CHECK(out[r].size() == expected, "offload::sim collectives: ", what, ": rank ", r, " sent ",
                      out[r].size(), " bytes, rank ", me, " expected ", expected,
                      " (the ranks disagree on the tensors' shapes or dtypes)");
        }
      }
    }
    return out;
  }

  int check_root(const std::string& what, std::int64_t root) const {
    TORCH_CHECK_VALUE(root >= 0 && root < getSize(), "offload::sim collectives: ", what, " rootRank must be in [0, ",
                      getSize(), "), got ", root);
    return static_cast<int>(root);
  }

  void check_peer(const std::string& what, const char* name, int peer) const {
    TORCH_CHECK_VALUE(peer >= 0 && peer < getSize(), "offload::sim collectives: ", what, " ", name, " must be in [0, ",
                      getSize(), "), got ", peer);
  }

  c10::intrusive_ptr<c10d::Work> reduce_all(const std::string& what, OpType type, std::vector<at::Tensor>& tensors,
                                            c10d::ReduceOp op) {
    check_op(what, op, tensors);
    auto blobs = exchange(what, pack(tensors), std::nullopt, std::nullopt, total_bytes(tensors));
    std::vector<std::vector<at::Tensor>> peers;
    for (auto& b : blobs) peers.push_back(unpack(b, tensors));
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      std::vector<at::Tensor> parts;
      for (const auto& p : peers) parts.push_back(p[i]);
      tensors[i].copy_(combine(parts, op));
    }
    return done(type, tensors);
  }

  void gather_lists(const std::string& what, std::vector<std::vector<at::Tensor>>& outputs,
                    std::vector<at::Tensor>& inputs) {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "offload::sim collectives: ", what,
                      " needs one output list per input, got ", outputs.size(), " for ", inputs.size());
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      TORCH_CHECK_VALUE(static_cast<int>(outputs[i].size()) == getSize(), "offload::sim collectives: ", what,
                        " output list ", i, " must hold ", getSize(), " tensors, got ", outputs[i].size());
    }
    auto blobs = exchange(what, pack(inputs), std::nullopt, std::nullopt, total_bytes(inputs));
    for (int r = 0; r < getSize(); ++r) {
      const auto in = unpack(blobs[r], inputs);
      for (std::size_t i = 0; i < inputs.size(); ++i) outputs[i][r].copy_(in[i]);
    }
  }

  void gather_into(const std::string& what, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs) {
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "offload::sim collectives: ", what,
                      " needs one output per input, got ", outputs.size(), " for ", inputs.size());
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * getSize() && outputs[i].is_contiguous(),
                        "offload::sim collectives: ", what, " output ", i, " must be contiguous with ", getSize(),
                        " x ", inputs[i].numel(), " elements, got ", outputs[i].numel());
    }
    auto blobs = exchange(what, pack(inputs), std::nullopt, std::nullopt, total_bytes(inputs));
    for (int r = 0; r < getSize(); ++r) {
      const auto in = unpack(blobs[r], inputs);
      for (std::size_t i = 0; i < inputs.size(); ++i) {
        const auto n = inputs[i].numel();
        outputs[i].view({-1}).narrow(0, r * n, n).copy_(in[i].view({-1}));
      }
    }
  }

  void scatter_into(const std::string& what, std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                    c10d::ReduceOp op) {
    check_op(what, op, outputs);
    TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "offload::sim collectives: ", what,
                      " needs one output per input, got ", outputs.size(), " for ", inputs.size());
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * getSize(), "offload::sim collectives: ", what,
                        " input ", i, " must have ", getSize(), " x ", outputs[i].numel(), " elements, got ",
                        inputs[i].numel());
    }
    auto blobs = exchange(what, pack(inputs), std::nullopt, std::nullopt, total_bytes(inputs));
    std::vector<std::vector<at::Tensor>> peers;
    for (auto& b : blobs) peers.push_back(unpack(b, inputs));
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      const auto n = outputs[i].numel();
      std::vector<at::Tensor> parts;
      for (const auto& p : peers)
        parts.push_back(p[i].reshape({-1}).narrow(0, getRank() * n, n).view(outputs[i].sizes()));
      outputs[i].copy_(combine(parts, op));
    }
  }

  static std::vector<at::Tensor> flatten(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<at::Tensor> out;
    for (const auto& l : lists) out.insert(out.end(), l.begin(), l.end());
    return out;
  }

  c10::intrusive_ptr<c10d::Work> done(OpType type, std::vector<at::Tensor> outputs) {
    return c10::make_intrusive<DoneWork>(getRank(), type, std::move(outputs));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::uint64_t sequence_ = 0;
  /// Point-to-point messages sent to / received from each (peer, tag): the
  /// sequence number of the next one.
  std::map<std::pair<int, int>, std::uint64_t> sent_;
  std::map<std::pair<int, int>, std::uint64_t> received_;
};

}  // namespace

c10::intrusive_ptr<c10d::Backend> make_collective_backend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                                          std::chrono::milliseconds timeout) {
  TORCH_CHECK_VALUE(store, "offload::sim::make_collective_backend: store must not be null");
  TORCH_CHECK_VALUE(size >= 1, "offload::sim::make_collective_backend: size must be >= 1, got ", size);
  TORCH_CHECK_VALUE(rank >= 0 && rank < size, "offload::sim::make_collective_backend: rank must be in [0, ", size,
                    "), got ", rank);
  TORCH_CHECK_VALUE(timeout.count() > 0, "offload::sim::make_collective_backend: timeout must be > 0 ms, got ",
                    timeout.count());
  return c10::make_intrusive<SimCollectives>(std::move(store), rank, size, timeout);
}

c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                                          std::chrono::milliseconds timeout) {
  TORCH_CHECK(installed(), "offload::sim::make_process_group: call offload::sim::install() first");
  auto backend = make_collective_backend(store, rank, size, timeout);
  auto group = c10::make_intrusive<c10d::ProcessGroup>(std::move(store), rank, size);
  for (auto type : {c10::DeviceType::CPU, c10::DeviceType::PrivateUse1}) {
    group->setBackend(type, c10d::ProcessGroup::BackendType::CUSTOM, backend);
  }
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  return group;
}

}  // namespace offload::sim
