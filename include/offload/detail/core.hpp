// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::Core<Device, Storage, Sync>: the shared state behind one
/// offload::Manager. Decides which saved tensors leave the device (the rule
/// of docs/guide.md), keeps their host copies, and brings them back; the
/// hooks objects autograd holds per saved tensor. docs/internals.md
/// explains it.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/ScalarType.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <offload/block_plan.hpp>
#include <offload/buffers.hpp>
#include <offload/concepts.hpp>
#include <offload/detail/autograd.hpp>
#include <offload/detail/entry.hpp>
#include <offload/detail/piece.hpp>
#include <offload/detail/planner.hpp>
#include <offload/manager_interface.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>
#include <offload/transfer.hpp>

namespace offload::detail {

/// How to rebuild one offloaded saved tensor from its entry's storage;
/// `E` is the manager's Entry<...> type.
template <class E>
struct OffloadedView {
  std::shared_ptr<E> entry;
  c10::VariableVersion version_counter;  ///< shared with the saved tensor
  VersionCheck check;                    ///< its version at pack
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<std::int64_t, 6> sizes;
  c10::SmallVector<std::int64_t, 6> strides;
  std::int64_t storage_offset = 0;
  bool conj = false;
  bool neg = false;
};

/// What a hooks object keeps for one saved tensor. Small, so that a
/// pass-through costs one small allocation (the hooks object) and no more.
template <class E>
struct Packed {
  KeptTensor kept;                              ///< the tensor, when it was not offloaded
  std::unique_ptr<OffloadedView<E>> offloaded;  ///< set when it was
  PlanTicket ticket;                            ///< with a device-memory target: which saved tensor of its step
};

/// Whether the bytes of `impl`'s storage can be copied: it has a storage
/// holding data of its own. A wrapper tensor subclass (the Python dispatch
/// keys: DTensor, float8 tensors and other `_make_wrapper_subclass`
/// tensors), a functional tensor and a batched tensor have none, or a
/// storage that counts bytes but holds no data.
inline bool has_usable_storage(const c10::TensorImpl& impl) {
  if (!impl.has_storage() || impl.is_python_dispatch() || impl.key_set().has(c10::DispatchKey::Functionalize)) {
    return false;
  }
  auto* storage = impl.unsafe_storage().unsafeGetStorageImpl();
  return storage != nullptr && (storage->nbytes() == 0 || storage->_mutable_data_ptr_no_checks().get() != nullptr);
}

/// The hooks object autograd holds for one saved tensor under a manager.
template <class Core>
class Hooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit Hooks(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  /// Hooks whose pack already ran (ManagerInterface::pack_passing).
  Hooks(std::shared_ptr<Core> core, typename Core::Packed packed)
      : core_(std::move(core)), packed_(std::move(packed)) {}
  void call_pack_hook(const at::Tensor& tensor) override { packed_ = core_->pack(tensor); }
  at::Tensor call_unpack_hook() override { return core_->unpack(packed_); }

 private:
  std::shared_ptr<Core> core_;
  typename Core::Packed packed_;
};

/// The shared state of one Manager. Hooks objects hold it by shared_ptr, so
/// backward works after the Manager handle is gone.
template <class Device, class Storage, class Sync>
class Core final : public ManagerInterface, public std::enable_shared_from_this<Core<Device, Storage, Sync>> {
 public:
  using SyncState = typename Sync::template State<Device>;
  using Entry = detail::Entry<typename SyncState::EntryState>;
  using Packed = detail::Packed<Entry>;
  /// Whether the sync policy opted into the step callbacks.
  static constexpr bool steps = requirement::declares_steps<SyncState>;
  /// Whether the sync policy tells a device-memory target what device
  /// memory it holds (sync_state_for_target: sync::Streamed's stash and
  /// prefetch window).
  static constexpr bool serves_target = requirement::declares_target<SyncState>;

  Core(const Options& options, Storage storage)
      : options_(options),
        storage_(std::move(storage)),
        sync_(options_),
        planner_(options_.device_target_bytes, serves_target ? options_.prefetch_depth : 0,
                 serves_target ? options_.prefetch_bytes : 0),
        blocks_(options_.device_target_bytes > 0
                    ? std::make_shared<BlockPlanner>(
                          options_.device_target_bytes, /*overlaps=*/serves_target,
                          [](int index) { return peak_on(static_cast<c10::DeviceIndex>(index)); },
                          options_.prefetch_depth, options_.prefetch_bytes, options_.max_fwd_stash,
                          [](int index) { return allocated_on(static_cast<c10::DeviceIndex>(index)); },
                          // Cleared by ~Core: the planner may outlive it
                          // (block_planner() hands it out).
                          [this] { relieve_forward(); })
                    : nullptr) {}

  ~Core() override {
    if (blocks_) blocks_->set_relieve({});
  }
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<Hooks<Core>>(this->shared_from_this());
  }
  std::string describe() const override {
    return "Manager<" + std::string(Device::name) + ", " + std::string(Storage::name) + ", " + std::string(Sync::name) +
           ">";
  }

  /// Packs one saved tensor: keeps it where it is (with the reason
  /// counted) or offloads it. `known`: the caller already knows it stays
  /// (pack_passing), unless it is on another device type.
  Packed pack(const at::Tensor& t, std::optional<PassReason> known = std::nullopt) {
    if (!t.defined()) return pass(t, pass_.undefined);
    // Pass-through first: every decision is made before the lock and before
    // anything an offloaded tensor needs is allocated.
    if (auto* reason = stays(t, known)) return pass(t, *reason);
    try {
      return offload(t);
    } catch (...) {
      pass_.failed.fetch_add(1, std::memory_order_relaxed);  // seen, neither passed nor offloaded
      throw;
    }
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks> pack_passing(const at::Tensor& t, PassReason why) override {
    return std::make_unique<Hooks<Core>>(this->shared_from_this(), pack(t, why));
  }

  /// Offloads `t` (eligible: on the device, strided, with a storage of its
  /// own, not a parameter, not small, not excluded) unless the
  /// device-memory plan or the host budget keeps it: a storage offloaded
  /// already (same version) gains a view, any other is copied to the host.
  Packed offload(const at::Tensor& t) {
    Packed packed;
    auto view = offloaded_view(t);
    const auto version = static_cast<std::int64_t>(t._version());
    const Piece piece = piece_for(t);

    const std::lock_guard lock(mutex_);
    // Saved outside the automatic plan's blocks: kept where the plan says
    // so while the device is under the target (else it goes the way of any
    // other tensor), and counted (storage bytes) where the plan measures
    // (keeps_outside() and saved_outside() tell inside from outside).
    if (blocks_ && blocks_->keeps_outside()) {
      const auto allocated = allocated_on(t.device().index());
      if (allocated < 0 || allocated <= options_.device_target_bytes) return pass(t, pass_.target, std::move(packed));
    }
    if (planner_.active() && keep_for_target(t, version, packed)) return pass(t, pass_.target, std::move(packed));
    auto entry = offloaded_already(t, version);
    if (!entry) {
      entry = copy_to_host(t, piece, version, packed.ticket);
      if (entry && blocks_) blocks_->saved_outside(static_cast<std::int64_t>(t.storage().nbytes()));
    } else if (!add_view(entry, t, piece)) {
      entry = nullptr;
    }
    if (!entry) return pass(t, pass_.budget, std::move(packed));  // the host budget forbids
    ++stats_.tensors_offloaded;
    relieve_if_over(t.device().index());
    view->entry = std::move(entry);
    packed.offloaded = std::move(view);
    return packed;
  }

  at::Tensor unpack(const Packed& packed) {
    if (!packed.offloaded) {
      if (packed.ticket.index >= 0) {
        const std::lock_guard lock(mutex_);
        const auto allocated = observe(packed.kept.tensor().device().index());
        planner_.at_unpack(packed.ticket, allocated, prefetched_bytes());
        note_still_allocated();
        watch_backward_end();
      }
      return packed.kept.unpack();
    }
    const auto& view = *packed.offloaded;
    const auto& entry = view.entry;
    TORCH_CHECK(!capturing_on(entry->device.index()), "offload: a saved tensor that ", describe(),
                " offloaded is needed while the current stream of ", entry->device,
                " captures a graph (a captured backward): the copy back, its event waits and its allocation cannot "
                "be captured; run the forward of a captured backward outside the manager's scope (or inside "
                "offload::NoOffload / torch_offload.no_offload)");
    const auto device_bytes = bring_back(*entry, packed.ticket);
    const c10::DeviceGuard guard(entry->device);
    auto out =
        view_of(device_bytes.storage(), entry->device, view.dtype, view.storage_offset, view.sizes, view.strides);
    if (view.conj) out._set_conj(true);
    if (view.neg) out._set_neg(true);
    view.check.check(out, view.version_counter);
    return out;
  }

  Stats stats() const override {
    const std::lock_guard lock(mutex_);
    Stats out = stats_;
    const auto passed = pass_.since(pass_base_);
    out.tensors_seen = passed.seen() + stats_.tensors_offloaded;
    out.passed_other_device = passed.other_device + passed.undefined;
    out.passed_layout = passed.layout;
    out.passed_subclass = passed.subclass;
    out.passed_leaf = passed.leaf;
    out.passed_small = passed.small;
    out.passed_excluded = passed.excluded;
    out.passed_budget = passed.budget;
    out.passed_target = passed.target;
    out.passed_capture = passed.capture;
    out.bytes_kept = passed.kept_bytes;
    if constexpr (steps) sync_.add_stats(out);
    planner_.add_stats(out);
    if (blocks_) blocks_->add_stats(out);
    return out;
  }
  void reset_stats() override {
    const std::lock_guard lock(mutex_);
    const auto in_use = stats_.host_bytes_in_use;
    const auto reserved = stats_.host_bytes_reserved;
    stats_ = Stats{};
    pass_base_ = pass_.since(PassCounts{});
    planner_.reset_stats();
    stats_.host_bytes_in_use = in_use;
    stats_.host_bytes_peak = in_use;
    stats_.host_bytes_reserved = reserved;
    stats_.host_bytes_reserved_peak = reserved;
  }
  void exclude(at::TensorList tensors) override {
    const std::unique_lock lock(excluded_mutex_);
    for (const auto& t : tensors) {
      if (!t.defined() || !t.has_storage()) continue;
      auto* impl = t.storage().unsafeGetStorageImpl();
      excluded_.try_emplace(impl, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
    }
  }
  const Options& options() const noexcept override { return options_; }
  std::shared_ptr<BlockPlanner> block_planner() override { return blocks_; }
  ScopeMark on_scope_enter() noexcept override {
    const std::lock_guard lock(mutex_);
    if (planner_.active()) {
      kept_.clear();
      planned_offloads_.clear();
      // With planned blocks the automatic plan gives its own warning (the
      // per-tensor plan's reserve then counts a recomputation's block).
      const bool blocks = blocks_->has_blocks();
      const auto index = target_index();
      const auto peak = peak_on(index);
      const auto allocated = allocated_on(index);
      if (open_scopes_ == 0) {
        step_start_peak_ = peak;
        step_start_allocated_ = allocated;
      }
      if (const auto warning = planner_.begin_step(peak, allocated); !warning.empty() && !blocks) warn(warning);
      // The automatic plan, from the peak of the step before (its own, or
      // the per-tensor plan's model of it with every eligible tensor
      // offloaded): where it changes what blocks save, the record the
      // per-tensor plan was made from no longer applies.
      // Only the outermost scope of this manager starts the plan's step.
      const bool own_peak = planner_.recorded_peak() >= 0;
      const auto needed = own_peak ? planner_.recorded_peak() : planner_.least_peak();
      try {
        if (open_scopes_++ == 0) {
          forward_open_ = true;
          if (blocks_->begin_step(needed, step_start_allocated_, step_start_peak_, own_peak)) planner_.forget();
        }
      } catch (...) {  // out of memory for the plan: the per-tensor plan starts over, as the first step
        planner_.forget();
      }
      if (const auto warning = blocks_->take_warning(); !warning.empty()) warn(warning);
    }
    return scope_mark();
  }
  void on_scope_exit(const ScopeMark& opened, bool in_order) noexcept override {
    const std::lock_guard lock(mutex_);
    // Under capture the stash stays (its event waits would be captured);
    // the next end of a forward or backward releases it.
    if constexpr (steps) {
      if (!capturing_here()) sync_.end_forward();
    }
    if (planner_.active()) {
      planner_.end_forward(observe(target_index()));
      note_still_allocated();
      const auto peak = peak_on(target_index());
      if (open_scopes_ > 0 && --open_scopes_ == 0) end_blocks_forward(peak);
    }
    // Scopes on other threads may pack meanwhile: a tensor on the device
    // seen by any of them silences the first warning (never a false alarm
    // from this scope's own tensors).
    const auto now = scope_mark();
    const auto saved = now.saved - opened.saved;
    if (saved > 0 && now.on_device == opened.on_device && !warned_off_device_) {
      warned_off_device_ = true;
      warn("offload::Scope: ", saved, " tensors were saved for backward in a scope of ", describe(),
           " and none was on a ", Device::name,
           " device, so nothing was offloaded: is the model (and its input) on the device? (warned once "
           "per manager)");
    }
    if (!in_order && !warned_order_) {
      warned_order_ = true;
      warn("offload::Scope: a scope of ", describe(),
           " was closed while a scope opened after it on the same thread was still open; close scopes "
           "innermost first (warned once per manager)");
    }
  }

 private:
  // Why `t` (defined) stays where it is, as the counter of that reason, or
  // null when it is eligible for offloading. The rule of docs/guide.md
  // ("What is never offloaded"), in its order; takes no lock but a shared
  // one for the excluded storages.
  std::atomic<std::int64_t>* stays(const at::Tensor& t, std::optional<PassReason> known) {
    const auto* impl = t.unsafeGetTensorImpl();
    if (impl->device_type() != Device::device_type) return &pass_.other_device;
    seen_on_device_.fetch_add(1, std::memory_order_relaxed);
    if (known) {
      return *known == PassReason::parameter  ? &pass_.leaf
             : *known == PassReason::subclass ? &pass_.subclass
                                              : &pass_.excluded;
    }
    if (impl->layout() != c10::kStrided || impl->is_quantized() || impl->is_nested()) return &pass_.layout;
    if (!has_usable_storage(*impl)) return &pass_.subclass;
    if (is_parameter(t)) return &pass_.leaf;
    const auto& storage = impl->storage();
    if (static_cast<std::int64_t>(storage.nbytes()) < options_.min_offload_bytes) return &pass_.small;
    if (is_excluded(storage.unsafeGetStorageImpl())) return &pass_.excluded;
    if (capturing_on(impl->device().index())) return &pass_.capture;
    return nullptr;
  }
  // Whether the current stream of device `index` is capturing a graph (the
  // device policy's capturing(), where it has one). Never throws.
  static bool capturing_on(c10::DeviceIndex index) noexcept {
    if constexpr (requirement::capturing<Device>) {
      return Device::capturing(index);
    } else {
      return false;
    }
  }
  // The same for the current device of Device's type (a scope's close).
  static bool capturing_here() noexcept {
    if constexpr (requirement::capturing<Device>) {
      try {
        return Device::capturing(c10::impl::getDeviceGuardImpl(Device::device_type)->getDevice().index());
      } catch (...) {
        return false;
      }
    } else {
      return false;
    }
  }
  // Keeps `t` where it is (detail::KeptTensor), counted under `reason`
  // (with what `packed` already holds: a plan ticket).
  Packed pass(const at::Tensor& t, std::atomic<std::int64_t>& reason) { return pass(t, reason, Packed{}); }
  // Counts `t` as kept for `reason` (a strided tensor's own bytes where it
  // is on the manager's device type: Stats::bytes_kept; a sparse tensor has
  // no such figure, nbytes() refuses it).
  Packed pass(const at::Tensor& t, std::atomic<std::int64_t>& reason, Packed packed) {
    reason.fetch_add(1, std::memory_order_relaxed);
    if (&reason != &pass_.undefined && &reason != &pass_.other_device && t.layout() == c10::kStrided) {
      pass_.kept_bytes.fetch_add(static_cast<std::int64_t>(t.nbytes()), std::memory_order_relaxed);
    }
    packed.kept = KeptTensor(t);
    return packed;
  }
  // How to rebuild `t` from its entry's storage (the entry is set later).
  static std::unique_ptr<OffloadedView<Entry>> offloaded_view(const at::Tensor& t) {
    auto view = std::make_unique<OffloadedView<Entry>>();
    view->version_counter = t.unsafeGetTensorImpl()->version_counter();
    view->check.note(t);
    view->dtype = t.scalar_type();
    view->sizes.assign(t.sizes().begin(), t.sizes().end());
    view->strides.assign(t.strides().begin(), t.strides().end());
    view->storage_offset = t.storage_offset();
    view->conj = t.is_conj();
    view->neg = t.is_neg();
    return view;
  }
  // The live entry of `t`'s storage when it was offloaded at `version`, or
  // null. The entry's weak reference to its source keeps the StorageImpl's
  // address from being reused, so a live entry with this key is this very
  // storage; the version tells whether it changed since.
  std::shared_ptr<Entry> offloaded_already(const at::Tensor& t, std::int64_t version) const {
    const auto found = aliases_.find(t.storage().unsafeGetStorageImpl());
    if (found == aliases_.end()) return nullptr;
    auto entry = found->second.lock();
    return entry && entry->version == version ? entry : nullptr;
  }
  // Another saved view `t` (reading `piece`) of the storage of `entry`:
  // false when it reads bytes the entry lacks and the host budget forbids
  // adding them.
  bool add_view(const std::shared_ptr<Entry>& entry, const at::Tensor& t, const Piece& piece) {
    if (!entry->covers(piece) && !extend(entry, t.storage(), t.device(), piece)) return false;
    ++stats_.tensors_aliased;
    ++entry->views;
    return true;
  }
  HostRequest host_request(std::int64_t nbytes, c10::Device device) const {
    HostRequest request{nbytes, device, options_.pin_memory};
    if constexpr (requirement::numa_node<Device>) {
      if (request.pin) request.numa_node = Device::numa_node(device.index());
    }
    return request;
  }
  // Whether `more` reserved host bytes would take this manager past
  // Options::host_budget_bytes.
  bool over_host_budget(std::int64_t more) const {
    return options_.host_budget_bytes != 0 && stats_.host_bytes_reserved + more > options_.host_budget_bytes;
  }
  // The same, for host buffers already allocated.
  bool over_host_budget(const std::vector<HostBuffer>& more) const {
    std::int64_t reserved = 0;
    for (const auto& host : more) reserved += host.reserved_nbytes();
    return over_host_budget(reserved);
  }
  // What a host buffer for `request` will set aside: the storage policy's
  // reserved_for(), or without one the request's size.
  std::int64_t reserved_for(const HostRequest& request) const {
    if constexpr (reserving_storage_policy<Storage>) {
      return storage_.reserved_for(request);
    } else {
      return request.nbytes;
    }
  }
  void count_reserved(const HostBuffer& host) {
    stats_.host_bytes_reserved += host.reserved_nbytes();
    stats_.host_bytes_reserved_peak = std::max(stats_.host_bytes_reserved_peak, stats_.host_bytes_reserved);
  }
  // A new entry for the storage of `t`: `piece` of it copied (or being
  // copied, as the sync policy decides) into a host buffer from the
  // storage policy. Null when the host budget forbids.
  std::shared_ptr<Entry> copy_to_host(const at::Tensor& t, const Piece& piece, std::int64_t version,
                                      const PlanTicket& ticket) {
    const auto piece_bytes = piece.nbytes();
    const auto request = host_request(piece_bytes, t.device());
    if (over_host_budget(reserved_for(request))) return nullptr;
    const c10::DeviceGuard guard(t.device());
    auto host = storage_.allocate(request);
    // The buffer may set aside more than reserved_for() said (a policy
    // without it, a cache that hands out a larger block): checked again,
    // and over the budget it goes back and the tensor stays on the device.
    if (over_host_budget(host.reserved_nbytes())) return nullptr;
    const auto& storage = t.storage();
    auto entry = make_entry();
    entry->device = t.device();
    entry->device_nbytes = piece_end(piece);
    entry->piece = piece;
    entry->seq = next_seq_++;
    entry->version = version;
    entry->source.emplace(c10::weak_intrusive_ptr<c10::StorageImpl>(
        c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage.unsafeGetStorageImpl())));
    // Counted before the copy: if copying throws, the entry's release gives
    // the bytes back and the counters stay balanced.
    stats_.host_bytes_in_use += piece_bytes;
    entry->host = std::move(host);
    count_reserved(entry->host);
    sync_.offload(transfer_of(*entry), view_of(storage, t.device(), at::kByte, 0, {entry->device_nbytes}, {1}));
    if (Storage::prefers_pinned && options_.pin_memory && !entry->host.pinned) ++stats_.pinned_fallbacks;
    ++stats_.storages_offloaded;
    stats_.bytes_offloaded += piece_bytes;
    stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, stats_.host_bytes_in_use);
    prune_aliases();
    if (ticket.index >= 0) planned_offloads_.emplace_back(ticket, entry);
    aliases_[storage.unsafeGetStorageImpl()] = entry;
    return entry;
  }
  // The bytes of `entry`'s storage on the device, 1-D uint8 from byte 0:
  // those a saved view of it still uses, or a reload by the sync policy.
  // Several views of one storage: it stays on the device until each was
  // unpacked in this backward pass (or the pass ends).
  at::Tensor bring_back(Entry& entry, const PlanTicket& ticket) {
    const std::lock_guard lock(mutex_);
    const c10::DeviceGuard guard(entry.device);
    at::Tensor device_bytes;
    if (auto impl = entry.reloaded ? entry.reloaded->lock() : c10::intrusive_ptr<c10::StorageImpl>()) {
      device_bytes = view_of(c10::Storage(std::move(impl)), entry.device, at::kByte, 0, {entry.device_nbytes}, {1});
      ++stats_.reloads_shared;
      // This consumer may be on another stream than the first one.
      if constexpr (steps) sync_.on_shared(transfer_of(entry), device_bytes);
    } else {
      auto reloaded = sync_.reload(transfer_of(entry));
      device_bytes = std::move(reloaded.bytes);
      entry.reloaded.emplace(c10::weak_intrusive_ptr<c10::StorageImpl>(
          c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(device_bytes.storage().unsafeGetStorageImpl())));
      if (reloaded.copied) {  // else the policy still had the bytes (it counts that itself)
        ++stats_.tensors_reloaded;
        stats_.bytes_reloaded += entry.host_nbytes();
      }
    }
    if (entry.views > 1) {
      const bool more = ++entry.unpacked < entry.views;
      entry.keep = more ? device_bytes : at::Tensor();
      if (!more) entry.unpacked = 0;
    }
    if (planner_.active()) plan_unpack(ticket, entry.device.index());
    if constexpr (steps) sync_.on_unpack(transfer_of(entry));
    if (planner_.active()) observe(entry.device.index());
    watch_backward_end();
    return device_bytes;
  }
  // Once per backward pass: when it ends, drop storages kept for views that
  // were not unpacked, and tell the sync policy.
  void watch_backward_end() {
    const int id = current_backward_id();
    if (id < 0 || id == watched_backward_) return;
    watched_backward_ = id;
    // A backward pass inside the step's scope (`loss.backward()` under
    // `with manager:`) ends the step's forward: the automatic plan's
    // forward peak is the one before it, not the step's.
    if (planner_.active() && open_scopes_ > 0) end_blocks_forward(peak_on(target_index()));
    std::weak_ptr<Core> weak = this->shared_from_this();
    at_backward_end([weak] {
      if (auto core = weak.lock()) {
        const std::lock_guard lock(core->mutex_);
        for (auto& [key, weak_entry] : core->aliases_) {
          if (auto entry = weak_entry.lock()) {
            entry->keep = at::Tensor();
            entry->unpacked = 0;
          }
        }
        if constexpr (steps) core->sync_.end_backward();
        if (core->planner_.active()) {
          core->observe(core->target_index());
          core->planner_.end_backward(peak_on(core->target_index()));
        }
      }
    });
  }
  // The end of the step's forward for the automatic plan, at `peak` (the
  // device's running peak then): at the first backward pass inside the
  // outermost scope, else at its exit; once per step.
  void end_blocks_forward(std::int64_t peak) {
    if (!std::exchange(forward_open_, false)) return;
    blocks_->end_forward(peak > step_start_peak_ && step_start_allocated_ >= 0 ? peak - step_start_allocated_ : -1);
  }
  // Device bytes allocated on `index` now, or -1 when the device policy
  // reports no memory statistics or cannot read them now (a call that
  // throws: CUDA's allocator before its lazy initialisation, a pluggable
  // allocator without statistics). Never throws: the scope hooks that call
  // it are noexcept.
  static std::int64_t allocated_on(c10::DeviceIndex index) noexcept {
    if constexpr (memory_stats_device_policy<Device>) {
      try {
        return Device::memory_allocated(index);
      } catch (...) {
        return -1;
      }
    } else {
      return -1;
    }
  }
  // The most bytes allocated on `index` at once so far, or -1 (as above).
  static std::int64_t peak_on(c10::DeviceIndex index) noexcept {
    if constexpr (requires { Device::memory_peak(index); }) {
      try {
        return Device::memory_peak(index);
      } catch (...) {
        return -1;
      }
    } else {
      return -1;
    }
  }
  // With a device-memory target: the device's allocated bytes on `index`
  // now (-1: not reported), told to the planner with its peak
  // (Planner::observe).
  std::int64_t observe(c10::DeviceIndex index) {
    const auto allocated = allocated_on(index);
    planner_.observe(allocated, peak_on(index));
    return allocated;
  }
  // The automatic plan's guard (BlockPlanner, relieve): the forward
  // stash's copies end now, as at the end of forward.
  void relieve_forward() {
    if constexpr (steps) {
      const std::lock_guard lock(mutex_);
      sync_.end_forward();
    }
  }
  // Forward backpressure under a target: a sync policy whose copies lag
  // behind compute (a loaded host, a slow link) holds more of its forward
  // stash than the step the plan was made from showed; when allocated
  // device memory leaves less than the reserve under the target, its stash
  // is released now, as at the end of forward (the compute stream waits
  // for those copies).
  void relieve_if_over(c10::DeviceIndex index) {
    if constexpr (steps) {
      if (planner_.active() && planner_.over(allocated_on(index))) sync_.end_forward();
    }
  }
  // The device whose memory the target counts: that of the tensors this
  // manager planned last, else (before its first planned tensor) the
  // current device of its type: a step that begins on another device
  // (one process per accelerator, `set_device(rank)`) must not read
  // device 0's memory.
  c10::DeviceIndex target_index() const {
    if (target_index_ >= 0) return target_index_;
    try {
      return c10::impl::getDeviceGuardImpl(Device::device_type)->getDevice().index();
    } catch (...) {
      return 0;
    }
  }
  // Device bytes the sync policy brought back ahead of need, not yet used.
  std::int64_t prefetched_bytes() const {
    if constexpr (serves_target) {
      return sync_.prefetched_bytes();
    } else {
      return 0;
    }
  }
  // With a device-memory target, after the planner recorded a point: tells
  // it which tensors offloaded in this step still have their device
  // storage allocated, held by the model (Planner::still_allocated) or
  // only by the sync policy for its copy (Planner::in_flight, their bytes
  // together), and forgets those whose storage is freed.
  void note_still_allocated() {
    std::int64_t in_flight = 0;
    std::erase_if(planned_offloads_, [&](const auto& planned) {
      const auto entry = planned.second.lock();
      if (!entry || !entry->source) return true;
      const auto uses = entry->source->use_count();
      std::uint32_t held = 0;  // by the sync policy
      if constexpr (serves_target) held = sync_.holds_device_bytes(transfer_of(*entry)) ? 1 : 0;
      if (uses > held) {
        planner_.still_allocated(planned.first);
      } else if (uses > 0) {
        if (const auto storage = entry->source->lock()) in_flight += static_cast<std::int64_t>(storage->nbytes());
      } else {
        return true;
      }
      return false;
    });
    planner_.in_flight(in_flight);
  }
  // With a device-memory target, for a tensor that would be offloaded:
  // whether it stays on the device (a storage the plan kept earlier in
  // this step, or the plan keeps it now). Sets its ticket.
  bool keep_for_target(const at::Tensor& t, std::int64_t version, Packed& packed) {
    const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
    const auto nbytes = static_cast<std::int64_t>(t.storage().nbytes());
    target_index_ = t.device().index();
    const auto allocated = observe(target_index_);
    if (auto found = kept_.find(key); found != kept_.end() && !found->second.expired()) {
      packed.ticket = planner_.at_pack(0, /*eligible=*/false, allocated).ticket;
      note_still_allocated();
      return true;
    }
    const bool aliased = offloaded_already(t, version) != nullptr;  // no new storage
    const auto decision = planner_.at_pack(nbytes, !aliased, allocated);
    packed.ticket = decision.ticket;
    note_still_allocated();
    if (decision.offload || aliased) return false;
    kept_.insert_or_assign(key,
                           c10::weak_intrusive_ptr<c10::StorageImpl>(
                               c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(t.storage().unsafeGetStorageImpl())));
    return true;
  }
  // With a device-memory target, at the unpack of an offloaded tensor now
  // on the device: records the memory, and lets the sync policy bring back
  // as much ahead as the headroom under the target allows.
  void plan_unpack(const PlanTicket& ticket, c10::DeviceIndex index) {
    const auto allocated = observe(index);
    planner_.at_unpack(ticket, allocated, prefetched_bytes());
    note_still_allocated();
    if constexpr (serves_target) sync_.set_headroom(planner_.headroom(ticket, allocated));
  }
  template <class... Args>
  static void warn(const Args&... args) noexcept {
    try {
      TORCH_WARN(args...);
    } catch (...) {  // a warning handler that throws must not end the program here
    }
  }
  bool is_excluded(const c10::StorageImpl* key) const {
    const std::shared_lock lock(excluded_mutex_);
    return !excluded_.empty() && excluded_.count(key) != 0;
  }
  // A later saved view of an offloaded storage (same version) reads bytes
  // the entry lacks: add what is missing as extra pieces, and have the sync
  // policy copy them (Transfer::copy_to_host copies only those). A policy
  // with step callbacks first lets go of the entry (suspend: its copies
  // finish, its stash and prefetch are dropped), so no copy in flight sees
  // the entry change, and copies them in resume(); one without copies them
  // in offload(), called again. Rare: a model saves the head of a tensor,
  // then the whole of it. False, changing nothing, when the host budget
  // forbids.
  bool extend(const std::shared_ptr<Entry>& entry, const c10::Storage& storage, c10::Device device,
              const Piece& piece) {
    const auto parts = entry->missing(piece);
    if (parts.empty()) return true;  // covered by several pieces together
    std::int64_t bytes = 0;
    std::int64_t reserved = 0;
    for (const auto& part : parts) {
      bytes += part.nbytes();
      reserved += reserved_for(host_request(part.nbytes(), device));
    }
    if (over_host_budget(reserved)) return false;
    const c10::DeviceGuard guard(device);
    // Every buffer first: an allocation that throws, or buffers that set
    // aside more than the budget allows, leave the entry as it was (the
    // buffers go back as `hosts` does).
    std::vector<HostBuffer> hosts;
    hosts.reserve(parts.size());
    for (const auto& part : parts) hosts.push_back(storage_.allocate(host_request(part.nbytes(), device)));
    if (over_host_budget(hosts)) return false;
    if constexpr (steps) sync_.suspend(transfer_of(*entry));
    entry->reloaded.reset();
    entry->keep = at::Tensor();
    std::int64_t end = entry->device_nbytes;
    for (const auto& part : parts) end = std::max(end, piece_end(part));
    const auto device_bytes = view_of(storage, device, at::kByte, 0, {end}, {1});
    for (std::size_t i = 0; i < parts.size(); ++i) {
      entry->extra.push_back({parts[i], std::move(hosts[i])});
      stats_.host_bytes_in_use += parts[i].nbytes();  // given back by the entry's release from now on
      count_reserved(entry->extra.back().host);
    }
    entry->device_nbytes = end;
    if constexpr (steps) {
      sync_.resume(transfer_of(*entry), device_bytes);
    } else {
      sync_.offload(transfer_of(*entry), device_bytes);
    }
    stats_.bytes_offloaded += bytes;
    stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, stats_.host_bytes_in_use);
    return true;
  }
  std::shared_ptr<Entry> make_entry() {
    // The deleter returns the entry's host bytes to the accounting and lets
    // the sync policy forget it; it may run on any thread, also while this
    // thread holds mutex_ (a recursive mutex for that reason).
    std::weak_ptr<Core> weak = this->shared_from_this();
    return std::shared_ptr<Entry>(new Entry, [weak](Entry* e) {
      if (auto core = weak.lock()) core->on_release(*e);
      delete e;
    });
  }
  void on_release(Entry& e) noexcept {
    const std::lock_guard lock(mutex_);
    if constexpr (steps) sync_.release(transfer_of(e));
    stats_.host_bytes_in_use -= e.host_nbytes();
    stats_.host_bytes_reserved -= e.host_reserved();
  }
  void prune_aliases() {
    if (aliases_.size() < prune_at_) return;
    std::erase_if(aliases_, [](const auto& kv) { return kv.second.expired(); });
    {
      const std::unique_lock excluded_lock(excluded_mutex_);
      std::erase_if(excluded_, [](const auto& kv) { return kv.second.expired(); });
    }
    prune_at_ = std::max<std::size_t>(64, 2 * aliases_.size());
  }

  // Pass-through counters: atomics, so a tensor that stays where it is
  // never takes the lock, and each pack counts once: a saved tensor seen
  // is one passed through (for a reason), offloaded (Stats, under the
  // lock) or failed. They only grow (reset_stats() notes where they
  // stood), so that the scope warnings read the defined tensors saved
  // from them with no counter of their own on the pack path.
  struct PassCounts {
    std::int64_t undefined = 0, other_device = 0, layout = 0, subclass = 0, leaf = 0, small = 0, excluded = 0,
                 capture = 0, budget = 0, target = 0, failed = 0;
    std::int64_t kept_bytes = 0;  // of the kept ones on the device type (not a pack count)
    // Packs that did not offload.
    std::int64_t seen() const noexcept {
      return undefined + other_device + layout + subclass + leaf + small + excluded + capture + budget + target +
             failed;
    }
  };
  struct PassCounters {
    // undefined: undefined saved tensors (Stats counts them as another
    // device's); other_device: defined ones on another device type.
    std::atomic<std::int64_t> undefined{0}, other_device{0}, layout{0}, subclass{0}, leaf{0}, small{0}, excluded{0},
        capture{0}, budget{0}, target{0}, failed{0}, kept_bytes{0};
    // Each count minus `base`'s.
    PassCounts since(const PassCounts& base) const {
      const auto get = [](const std::atomic<std::int64_t>& c, std::int64_t from) {
        return c.load(std::memory_order_relaxed) - from;
      };
      return PassCounts{get(undefined, base.undefined), get(other_device, base.other_device),
                        get(layout, base.layout),       get(subclass, base.subclass),
                        get(leaf, base.leaf),           get(small, base.small),
                        get(excluded, base.excluded),   get(capture, base.capture),
                        get(budget, base.budget),       get(target, base.target),
                        get(failed, base.failed),       get(kept_bytes, base.kept_bytes)};
    }
  };
  // Defined saved tensors packed so far, and of them those on Device's
  // device type, for the scope warnings: those on another device type and
  // those on Device's (counted as stays() sees them), two counts that only
  // grow, each of defined tensors alone.
  ScopeMark scope_mark() const noexcept {
    const auto on_device = seen_on_device_.load(std::memory_order_relaxed);
    return ScopeMark{pass_.other_device.load(std::memory_order_relaxed) + on_device, on_device};
  }

  mutable std::recursive_mutex mutex_;
  mutable std::shared_mutex excluded_mutex_;  // guards excluded_
  PassCounters pass_;
  PassCounts pass_base_;                         // pass_ when reset_stats() ran (under mutex_)
  std::atomic<std::int64_t> seen_on_device_{0};  // defined saved tensors on Device's device type (scope warnings)
  Options options_;
  Storage storage_;
  SyncState sync_;
  Planner planner_;                         // Options::device_target_bytes
  std::shared_ptr<BlockPlanner> blocks_;    // the automatic plan, with a target; else null
  std::int64_t step_start_peak_ = -1;       // the device's peak when the step's scope opened
  std::int64_t step_start_allocated_ = -1;  // ... and its allocated bytes
  int open_scopes_ = 0;                     // scopes of this manager open now (the plan's step: the outermost)
  bool forward_open_ = false;               // the plan's step is in its forward (no backward pass yet)
  Stats stats_;
  bool warned_off_device_ = false;
  bool warned_order_ = false;
  std::uint64_t next_seq_ = 0;
  int watched_backward_ = -1;
  std::size_t prune_at_ = 64;
  std::unordered_map<const c10::StorageImpl*, std::weak_ptr<Entry>> aliases_;
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> excluded_;
  // Storages the plan kept on the device in this step (another saved view
  // of one stays too), and the device index of the planned tensors.
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> kept_;
  c10::DeviceIndex target_index_ = -1;  // target_index(): -1 until a tensor is planned
  // Tensors offloaded in this step whose device storage may still be
  // allocated (Planner::still_allocated).
  std::vector<std::pair<PlanTicket, std::weak_ptr<Entry>>> planned_offloads_;
};

}  // namespace offload::detail
