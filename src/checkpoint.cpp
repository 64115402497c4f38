// SPDX-License-Identifier: MIT
// offload::checkpoint: a block's inputs saved through the current scope, a
// ManagerInterface whose hooks keep only a record of what the block saves, and in
// backward a recomputation under one whose hooks collect those tensors.

#include <offload/checkpoint.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Generator.h>
#include <ATen/ops/empty.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <offload/any_manager.hpp>
#include <offload/block_plan.hpp>
#include <offload/detail/autograd.hpp>
#include <offload/detail/null_manager.hpp>
#include <offload/scope.hpp>

namespace offload {
namespace {

// Planned blocks (and recomputations) running on this thread: a planned
// block inside one just runs, so a step counts the same blocks whatever
// the outer one's choice, and a recomputation takes no turn of the plan.
thread_local int t_planned_depth = 0;
struct PlannedDepth {
  PlannedDepth() { ++t_planned_depth; }
  ~PlannedDepth() { --t_planned_depth; }
  PlannedDepth(const PlannedDepth&) = delete;
  PlannedDepth& operator=(const PlannedDepth&) = delete;
};

// Thrown by the recording hooks once the recomputation saved all it must;
// caught around the recomputation (nothing else sees it).
struct StopRecomputation {};

// What the forward saw of one saved tensor, to compare with the recomputation.
struct Meta {
  c10::SmallVector<std::int64_t, 6> sizes;
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::Device device{c10::DeviceType::CPU};
  bool defined = false;

  static Meta of(const at::Tensor& t) {
    Meta m;
    m.defined = t.defined();
    if (m.defined) {
      m.sizes.assign(t.sizes().begin(), t.sizes().end());
      m.dtype = t.scalar_type();
      m.device = t.device();
    }
    return m;
  }
  bool operator==(const Meta& o) const {
    return defined == o.defined && (!defined || (sizes == o.sizes && dtype == o.dtype && device == o.device));
  }
  friend std::ostream& operator<<(std::ostream& os, const Meta& m) {
    if (!m.defined) return os << "undefined";
    return os << c10::IntArrayRef(m.sizes) << ' ' << m.dtype << " on " << m.device;
  }
};

// A generator and its state at forward.
struct RngState {
  at::Generator generator;
  at::Tensor state;
};

// Autocast state of one device type at forward.
struct AutocastState {
  c10::DeviceType type;
  bool enabled;
  c10::ScalarType dtype;
};

// The tensors one backward pass got back from the recomputation.
struct Recomputed {
  std::vector<at::Tensor> tensors;  // by pack index; reset when handed out
  std::vector<bool> handed;         // whether index i was handed out
  std::int64_t count = 0;           // saved so far by the recomputation
};

class Frame : public std::enable_shared_from_this<Frame> {
 public:
  Frame(Block block, const CheckpointOptions& options)
      : block_(std::move(block)),
        name_(options.name.empty() ? "checkpoint" : options.name),
        preserve_rng_(options.preserve_rng_state),
        early_stop_(options.early_stop) {
    for (std::size_t i = 0; i < options.state.size(); ++i) {
      const auto& t = options.state[i];
      if (!t.defined()) continue;
      TORCH_CHECK_VALUE(!t.requires_grad(), "offload::checkpoint: block '", name_, "': CheckpointOptions::state[", i,
                        "] requires grad; state is what the block writes in place (buffers such as BatchNorm's "
                        "running statistics), never a parameter");
      state_.push_back(t);
    }
  }

  const std::string& name() const noexcept { return name_; }

  // Forward, before the block runs: the inputs go through the current
  // scope's hooks (a SavedVariable asks the default engine, like any node's),
  // and the generator and autocast states are taken.
  void save_inputs(const std::vector<at::Tensor>& inputs) {
    inputs_.reserve(inputs.size());
    c10::SmallVector<c10::Device, 2> devices;
    for (const auto& t : inputs) {
      inputs_.emplace_back(t, /*is_output=*/false);
      if (t.defined() && !t.is_cpu() && std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
        devices.push_back(t.device());
      }
    }
    if (preserve_rng_) {
      add_rng(at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CPU)));
      for (const auto& d : devices) add_rng(at::globalContext().defaultGenerator(d));
    }
    c10::SmallVector<c10::DeviceType, 2> types{c10::DeviceType::CPU};
    for (const auto& d : devices) {
      if (std::find(types.begin(), types.end(), d.type()) == types.end()) types.push_back(d.type());
    }
    for (auto type : types) {
      if (!at::autocast::is_autocast_available(type)) continue;
      autocast_.push_back({type, at::autocast::is_autocast_enabled(type), at::autocast::get_autocast_dtype(type)});
    }
    autocast_cache_ = at::autocast::is_autocast_cache_enabled();
    state_at_forward_ = copies(state_);
  }

  // Forward: the block saved `t` (not kept); returns its index.
  std::size_t record(const at::Tensor& t) {
    const std::lock_guard lock(mutex_);
    metas_.push_back(Meta::of(t));
    if (counting_) count(t);
    return metas_.size() - 1;
  }

  // Forward: count the device storages the block saves (what keeping it
  // would hold), for the automatic plan.
  void count_saved() { counting_ = true; }
  // What was counted: bytes, storages, the largest storage's bytes.
  std::tuple<std::int64_t, std::int64_t, std::int64_t> counted() {
    const std::lock_guard lock(mutex_);
    counting_ = false;
    const auto out = std::make_tuple(counted_bytes_, static_cast<std::int64_t>(counted_.size()), counted_largest_);
    counted_ = {};
    return out;
  }

  // Backward: `begin` runs when a recomputation begins, `end` when it
  // ended without an error (the automatic plan's measuring step records
  // the device's allocated bytes there, and times it).
  void on_recompute(std::function<void()> begin, std::function<void()> end) {
    recompute_began_ = std::move(begin);
    recompute_ended_ = std::move(end);
  }

  // Forward: runs the block (under the recording scope the caller opened).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs) { return block_(inputs); }
  void forward_done() { forward_done_ = true; }

  // Backward: the recomputed tensor `index` for the running backward pass
  // (recomputing the block first if this pass has not yet).
  at::Tensor take(std::size_t index);

  // Recomputation: the block saved `t` again.
  void collect(std::int64_t pass, const at::Tensor& t);

 private:
  void add_rng(at::Generator generator) {
    for (const auto& r : rng_) {
      if (r.generator.unsafeGetGeneratorImpl() == generator.unsafeGetGeneratorImpl()) return;  // sim shares the CPU's
    }
    const std::lock_guard lock(generator.mutex());
    rng_.push_back({generator, generator.get_state()});
  }
  void recompute(std::int64_t pass, Recomputed& out);
  void check(const Recomputed& out) const;
  void count(const at::Tensor& t) {
    if (!t.defined() || t.is_cpu() || !t.has_storage() || detail::is_parameter(t)) return;
    auto* impl = t.storage().unsafeGetStorageImpl();
    for (const auto& seen : counted_) {
      if (seen._unsafe_get_target() == impl) return;
    }
    // A weak reference: the storage's bytes are freed as usual, but its
    // object (and so its address) is not reused while the block runs.
    counted_.emplace_back(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
    const auto nbytes = static_cast<std::int64_t>(t.storage().nbytes());
    counted_bytes_ += nbytes;
    counted_largest_ = std::max(counted_largest_, nbytes);
  }
  // Copies of `tensors`, made with grad mode off.
  static std::vector<at::Tensor> copies(const std::vector<at::Tensor>& tensors) {
    const torch::autograd::AutoGradMode no_grad(false);
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& t : tensors) out.push_back(t.detach().clone());
    return out;
  }
  // Writes `values` into the state tensors through views with a version
  // counter of their own: restoring what was there is not an in-place
  // change that autograd's check should see (a saved running_mean stays
  // usable).
  void write_state(const std::vector<at::Tensor>& values) {
    const torch::autograd::AutoGradMode no_grad(false);
    for (std::size_t i = 0; i < state_.size(); ++i) state_[i].variable_data().copy_(values[i]);
  }

  Block block_;
  std::string name_;
  bool preserve_rng_;
  bool early_stop_;
  bool forward_done_ = false;
  std::vector<torch::autograd::SavedVariable> inputs_;
  std::vector<RngState> rng_;
  std::vector<AutocastState> autocast_;
  bool autocast_cache_ = true;
  std::vector<at::Tensor> state_;             // CheckpointOptions::state, defined entries
  std::vector<at::Tensor> state_at_forward_;  // their values when the forward began
  std::vector<Meta> metas_;                   // by pack index, in forward
  std::recursive_mutex mutex_;
  bool recomputing_ = false;
  std::unordered_map<std::int64_t, Recomputed> passes_;             // by backward pass id
  bool counting_ = false;                                           // count_saved(): forward counts what it saves
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> counted_;  // the storages counted (weak)
  std::int64_t counted_bytes_ = 0;                                  // ... their bytes
  std::int64_t counted_largest_ = 0;                                // ... the largest one's
  std::function<void()> recompute_began_;                           // on_recompute()
  std::function<void()> recompute_ended_;
};

// What the block's nodes hold for each tensor it saved in forward.
class RecordHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit RecordHooks(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  void call_pack_hook(const at::Tensor& tensor) override { index_ = frame_->record(tensor); }
  at::Tensor call_unpack_hook() override { return frame_->take(index_); }

 private:
  std::shared_ptr<Frame> frame_;
  std::size_t index_ = 0;
};

// What the recomputation's nodes hold: the tensor kept where it is, always
// as its data (the recomputed graph is dropped every step: a saved output
// taken for an input would make its node own itself and leak every step;
// used only if someone runs backward through the recomputed graph); the
// frame collects it for the block's original saved tensors.
class CollectHooks final : public torch::autograd::SavedVariableHooks {
 public:
  CollectHooks(std::shared_ptr<Frame> frame, std::int64_t pass) : frame_(std::move(frame)), pass_(pass) {}
  void call_pack_hook(const at::Tensor& tensor) override {
    kept_ = detail::KeptTensor(tensor, detail::KeptTensor::as_data);
    frame_->collect(pass_, kept_.tensor());
  }
  at::Tensor call_unpack_hook() override { return kept_.unpack(); }

 private:
  std::shared_ptr<Frame> frame_;
  std::int64_t pass_;
  detail::KeptTensor kept_;
};

// The hooks' manager while a block records or recomputes: not a manager,
// so the parts of ManagerInterface a Scope does not use answer "nothing".
class BlockSource : public detail::NullManager {
 public:
  std::string describe() const override { return "offload::checkpoint"; }
};

class RecordSource final : public BlockSource {
 public:
  explicit RecordSource(std::shared_ptr<Frame> frame) : frame_(std::move(frame)) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<RecordHooks>(frame_);
  }

 private:
  std::shared_ptr<Frame> frame_;
};

class CollectSource final : public BlockSource {
 public:
  CollectSource(std::shared_ptr<Frame> frame, std::int64_t pass) : frame_(std::move(frame)), pass_(pass) {}
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<CollectHooks>(frame_, pass_);
  }

 private:
  std::shared_ptr<Frame> frame_;
  std::int64_t pass_;
};

// Ids for unpacks outside any backward pass (each its own recomputation).
std::atomic<std::int64_t> g_outside_pass{-2};

at::Tensor Frame::take(std::size_t index) {
  std::int64_t pass = detail::current_backward_id();
  if (pass < 0) pass = g_outside_pass.fetch_sub(1, std::memory_order_relaxed);
  const std::lock_guard lock(mutex_);
  TORCH_CHECK(!recomputing_, "offload::checkpoint: block '", name_,
              "': a backward pass inside the block's own recomputation needs what the block saved; "
              "backward inside a checkpointed block is not supported");
  auto found = passes_.find(pass);
  if (found == passes_.end()) {
    found = passes_.emplace(pass, Recomputed{}).first;
    try {
      recompute(pass, found->second);
    } catch (...) {
      passes_.erase(found);
      throw;
    }
    if (pass >= 0) {
      // The recomputed tensors belong to this pass: whatever it did not
      // use is released when it ends.
      std::weak_ptr<Frame> weak = weak_from_this();
      detail::at_backward_end([weak, pass] {
        if (auto frame = weak.lock()) {
          const std::lock_guard relock(frame->mutex_);
          frame->passes_.erase(pass);
        }
      });
    }
  }
  auto& got = found->second;
  TORCH_CHECK(index < got.tensors.size() && !got.handed[index], "offload::checkpoint: block '", name_,
              "': saved tensor ", index,
              " was unpacked a second time in one backward pass; each is handed out once per pass");
  got.handed[index] = true;
  auto out = std::move(got.tensors[index]);
  if (pass < 0) passes_.erase(found);
  return out;
}

void Frame::collect(std::int64_t pass, const at::Tensor& t) {
  // Called from recompute(), which holds mutex_ on this thread.
  auto& got = passes_.at(pass);
  const auto index = got.count++;
  TORCH_CHECK(static_cast<std::size_t>(index) < metas_.size(), "offload::checkpoint: block '", name_,
              "': the recomputation saved more tensors than the forward (", metas_.size(),
              "); the block must run the same operations each time");
  const auto meta = Meta::of(t);
  if (!(meta == metas_[index])) {
    std::ostringstream message;
    message << "offload::checkpoint: block '" << name_ << "': saved tensor " << index << " is " << meta
            << " in the recomputation but was " << metas_[index]
            << " in the forward; the block must run the same operations each time";
    TORCH_CHECK(false, message.str());
  }
  got.tensors[index] = t;
  if (early_stop_ && static_cast<std::size_t>(got.count) == metas_.size()) throw StopRecomputation{};
}

void Frame::recompute(std::int64_t pass, Recomputed& out) {
  TORCH_CHECK(forward_done_, "offload::checkpoint: block '", name_,
              "': its saved tensors were needed before the block returned (backward inside the block); not "
              "supported");
  if (recompute_began_) recompute_began_();
  out.tensors.resize(metas_.size());
  out.handed.assign(metas_.size(), false);
  std::vector<at::Tensor> inputs;
  inputs.reserve(inputs_.size());
  for (const auto& saved : inputs_) inputs.push_back(saved.unpack());

  // The forward's generator, autocast and block states, the current ones
  // restored after (the copies that can fail are made before anything is
  // switched).
  const auto state_now = copies(state_);
  std::vector<at::Tensor> now;
  now.reserve(rng_.size());
  for (auto& r : rng_) {
    const std::lock_guard lock(r.generator.mutex());
    now.push_back(r.generator.get_state());
    r.generator.set_state(r.state);
  }
  std::vector<AutocastState> autocast_now;
  for (const auto& a : autocast_) {
    autocast_now.push_back(
        {a.type, at::autocast::is_autocast_enabled(a.type), at::autocast::get_autocast_dtype(a.type)});
    at::autocast::set_autocast_enabled(a.type, a.enabled);
    at::autocast::set_autocast_dtype(a.type, a.dtype);
  }
  const bool cache_now = at::autocast::is_autocast_cache_enabled();
  at::autocast::set_autocast_cache_enabled(autocast_cache_);
  // One more autocast region, as torch.autocast enters one: the casts the
  // recomputation caches (leaf weights) are cleared where it ends the
  // outermost one, as at the end of the forward's; left cached, they would
  // be used for the weights after the optimizer changed them in place.
  at::autocast::increment_nesting();
  const auto restore = [&] {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    for (std::size_t i = 0; i < rng_.size(); ++i) {
      const std::lock_guard lock(rng_[i].generator.mutex());
      rng_[i].generator.set_state(now[i]);
    }
    for (const auto& a : autocast_now) {
      at::autocast::set_autocast_enabled(a.type, a.enabled);
      at::autocast::set_autocast_dtype(a.type, a.dtype);
    }
    at::autocast::set_autocast_cache_enabled(cache_now);
    write_state(state_now);  // last: the generators and autocast are back even if it throws
  };

  recomputing_ = true;
  try {
    write_state(state_at_forward_);
    const torch::autograd::AutoGradMode grad(true);
    const PlannedDepth planned_depth;
    const Scope collecting(any_manager_of(std::make_shared<CollectSource>(shared_from_this(), pass)));
    try {
      (void)block_(inputs);
    } catch (const StopRecomputation&) {  // saved all it must
    }
  } catch (...) {
    recomputing_ = false;
    try {
      restore();
    } catch (...) {  // the block's own error is the one to report
    }
    throw;
  }
  recomputing_ = false;
  restore();
  if (recompute_ended_) recompute_ended_();
  TORCH_CHECK(static_cast<std::size_t>(out.count) == metas_.size(), "offload::checkpoint: block '", name_,
              "': the recomputation saved ", out.count, " tensors, the forward ", metas_.size(),
              "; the block must run the same operations each time");
}

// Runs `block` checkpointed; with `cost`, counts what its forward saves,
// and with `measure`, tells the plan where its recomputation begins and
// what it took.
std::vector<at::Tensor> run_checkpointed(Block block, const std::vector<at::Tensor>& inputs,
                                         const CheckpointOptions& options, BlockCost* cost,
                                         const std::function<void(Frame&)>& measure = {}) {
  auto frame = std::make_shared<Frame>(std::move(block), options);
  frame->save_inputs(inputs);
  if (cost != nullptr) frame->count_saved();
  if (measure) measure(*frame);
  std::vector<at::Tensor> outputs;
  {
    const Scope recording(any_manager_of(std::make_shared<RecordSource>(frame)));
    outputs = frame->run(inputs);
  }
  frame->forward_done();
  if (cost != nullptr) std::tie(cost->saved_bytes, cost->saved_storages, cost->largest_storage) = frame->counted();
  return outputs;
}

// Storage bytes of the defined inputs on a device (not the CPU), each
// storage once, parameters excluded; and the first such input's device.
std::pair<std::int64_t, std::optional<c10::Device>> device_inputs(const std::vector<at::Tensor>& inputs) {
  std::int64_t bytes = 0;
  std::optional<c10::Device> device;
  c10::SmallVector<const void*, 4> seen;
  for (const auto& t : inputs) {
    if (!t.defined() || t.is_cpu() || !t.has_storage() || detail::is_parameter(t)) continue;
    if (!device) device = t.device();
    const void* key = t.storage().unsafeGetStorageImpl();
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    bytes += static_cast<std::int64_t>(t.storage().nbytes());
  }
  return {bytes, device};
}

// A block's forward time on `device`'s current stream: device events
// (timing enabled) where the device has them, else the wall clock between
// two synchronizations of the stream.
class BlockTimer {
 public:
  explicit BlockTimer(std::optional<c10::Device> device) {
    if (device) {
      stream_ = c10::impl::getDeviceGuardImpl(device->type())->getStream(*device);
      try {
        start_.emplace(device->type(), c10::EventFlag::BACKEND_DEFAULT);
        start_->record(*stream_);
      } catch (const c10::Error&) {
        start_.reset();
        stream_->synchronize();
      }
    }
    wall_ = std::chrono::steady_clock::now();
  }
  std::int64_t stop() {
    if (start_) {
      try {
        c10::Event end(stream_->device_type(), c10::EventFlag::BACKEND_DEFAULT);
        end.record(*stream_);
        end.synchronize();
        return static_cast<std::int64_t>(start_->elapsedTime(end) * 1e6);
      } catch (const c10::Error&) {  // no timing on this device: the wall clock
      }
    }
    if (stream_) stream_->synchronize();
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - wall_).count();
  }

 private:
  std::optional<c10::Stream> stream_;
  std::optional<c10::Event> start_;
  std::chrono::steady_clock::time_point wall_;
};

// Times blocking copies of `t`'s bytes (all, and a quarter) from `device`
// to pinned host memory, the best of two each, for the automatic plan's
// link model.
void probe_link(BlockPlanner& plan, const at::Tensor& t) {
  const torch::autograd::AutoGradMode no_grad(false);
  const auto flat = t.detach().contiguous().view({-1}).view(at::kByte);
  const auto bytes = flat.numel();
  const auto small = bytes / 4;
  if (small <= 0) return;
  const auto host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
  const auto stream = c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device());
  const auto timed = [&](std::int64_t n) {
    std::int64_t best = std::numeric_limits<std::int64_t>::max();
    for (int i = 0; i < 2; ++i) {
      stream.synchronize();
      const auto start = std::chrono::steady_clock::now();
      host.narrow(0, 0, n).copy_(flat.narrow(0, 0, n));
      best = std::min<std::int64_t>(
          best, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
  };
  const auto all = timed(bytes);
  const auto part = timed(small);
  plan.link_measured(bytes, all, small, part);
}

// A block marked CheckpointOptions::planned: what the current manager's
// plan chose for it this step.
std::vector<at::Tensor> run_planned(Block block, const std::vector<at::Tensor>& inputs,
                                    const CheckpointOptions& options) {
  const auto manager = t_planned_depth == 0 ? detail::current_manager() : nullptr;
  const auto plan = manager ? manager->block_planner() : nullptr;
  if (!plan) return block(inputs);
  const PlannedDepth depth;
  const auto [input_bytes, device] = device_inputs(inputs);
  const auto turn = plan->next_block(input_bytes, device ? device->index() : -1);
  const struct Done {
    BlockPlanner& plan;
    ~Done() { plan.block_done(); }
  } done{*plan};
  switch (turn.choice) {
    case BlockChoice::keep: {
      const NoOffload kept;
      return block(inputs);
    }
    case BlockChoice::offload:
      return block(inputs);
    case BlockChoice::recompute_input_kept: {
      const NoOffload inputs_kept;  // the recording scope of the block opens inside it
      return run_checkpointed(std::move(block), inputs, options, nullptr);
    }
    case BlockChoice::recompute:
      break;
  }
  if (!turn.measure) return run_checkpointed(std::move(block), inputs, options, nullptr);
  BlockCost cost;
  cost.input_bytes = input_bytes;
  // The recomputation in backward: where it begins, and its time (the
  // cost of recomputing, with the allocator warm).
  const auto measure_recomputation = [&](Frame& frame) {
    if (!device) return;
    auto timer = std::make_shared<std::optional<BlockTimer>>();
    const std::weak_ptr<BlockPlanner> weak = plan;
    frame.on_recompute(
        [weak, timer, index = turn.index, device = *device] {
          if (const auto p = weak.lock()) p->recomputing(index, device.index());
          timer->emplace(device);
        },
        [weak, timer, index = turn.index] {
          if (!timer->has_value()) return;
          const auto ns = (*timer)->stop();
          timer->reset();
          if (const auto p = weak.lock()) p->recomputed(index, ns);
        });
  };
  BlockTimer timer(device);
  auto outputs = run_checkpointed(std::move(block), inputs, options, &cost, measure_recomputation);
  cost.forward_ns = timer.stop();
  plan->measured(turn.index, cost);
  if (turn.probe_link) {
    for (const auto& t : inputs) {
      if (t.defined() && !t.is_cpu() && t.has_storage() && !detail::is_parameter(t)) {
        probe_link(*plan, t);
        break;
      }
    }
  }
  return outputs;
}

}  // namespace

std::vector<at::Tensor> checkpoint(Block block, const std::vector<at::Tensor>& inputs,
                                   const CheckpointOptions& options) {
  TORCH_CHECK_VALUE(static_cast<bool>(block), "offload::checkpoint: block must be a callable, got an empty function");
  if (!torch::autograd::GradMode::is_enabled()) return block(inputs);
  if (options.planned) return run_planned(std::move(block), inputs, options);
  return run_checkpointed(std::move(block), inputs, options, nullptr);
}

at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input,
                      const CheckpointOptions& options) {
  TORCH_CHECK_VALUE(static_cast<bool>(fn), "offload::checkpoint: block must be a callable, got an empty function");
  return checkpoint(
      [fn = std::move(fn)](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; }, {input},
      options)[0];
}

}  // namespace offload
