// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// detail::Core<Device, Storage, Sync>: the shared state behind one
/// offload::Manager. Decides which saved tensors leave the device, keeps
/// their host copies, and brings them back; the hooks objects autograd
/// holds per saved tensor. docs/internals.md explains it.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <offload/concepts.hpp>
#include <offload/detail/hook_source.hpp>
#include <offload/entry.hpp>
#include <offload/options.hpp>
#include <offload/stats.hpp>

namespace offload::detail {

/// The id of the backward pass running on this thread, or -1 outside one
/// (torch::autograd::get_current_graph_task_id()).
int current_backward_id() noexcept;

/// Inside a backward pass: queues `callback` to run once when that pass
/// ends (Engine::queue_callback) and returns true; outside one, returns
/// false and does nothing.
bool at_backward_end(std::function<void()> callback);

/// The weak form of the autograd node pointer Tensor::grad_fn() returns
/// (std::shared_ptr up to LibTorch 2.12, c10::intrusive_ptr from 2.13).
template <class P>
struct weak_of;
template <class T>
struct weak_of<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <class T>
struct weak_of<c10::intrusive_ptr<T>> {
  using type = c10::weak_intrusive_ptr<T>;
};
using NodeRef = std::remove_cvref_t<decltype(std::declval<const at::TensorBase&>().grad_fn())>;
using WeakNode = typename weak_of<NodeRef>::type;

/// Throws the c10::Error autograd raises when a saved tensor was modified
/// in place after it was saved (autograd skips that check when hooks are
/// installed, so the manager makes it). `unpacked` is the tensor rebuilt.
[[noreturn]] void throw_modified_inplace(const at::Tensor& unpacked, std::uint32_t current,
                                         std::uint32_t saved, const WeakNode& grad_fn,
                                         std::int64_t output_nr);

/// A tensor of `dtype` on `device` viewing `storage` with the given
/// storage offset, sizes and strides (no copy).
inline at::Tensor view_of(const c10::Storage& storage, c10::Device device, c10::ScalarType dtype,
                          std::int64_t storage_offset, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  auto out = at::empty({0}, at::TensorOptions().dtype(dtype).device(device));
  out.set_(storage, storage_offset, sizes, strides);
  return out;
}

/// What a hooks object keeps for one saved tensor; `E` is the manager's
/// Entry<...> type.
template <class E>
struct Packed {
  c10::VariableVersion version_counter;  ///< shared with the saved tensor (disabled by default)
  std::uint32_t saved_version = 0;       ///< its version at pack
  WeakNode grad_fn;                      ///< for the error message only
  std::int64_t output_nr = 0;
  at::Tensor passthrough;         ///< defined when the tensor was not offloaded
  std::shared_ptr<E> entry;       ///< defined when it was
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  c10::SmallVector<std::int64_t, 6> sizes;
  c10::SmallVector<std::int64_t, 6> strides;
  std::int64_t storage_offset = 0;
  bool conj = false;
  bool neg = false;
};

template <class Core>
class Hooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit Hooks(std::shared_ptr<Core> core) : core_(std::move(core)) {}
  void call_pack_hook(const at::Tensor& tensor) override { packed_ = core_->pack(tensor); }
  at::Tensor call_unpack_hook() override { return core_->unpack(packed_); }

 private:
  std::shared_ptr<Core> core_;
  typename Core::Packed packed_;
};

/// The shared state of one Manager. Hooks objects hold it by shared_ptr, so
/// backward works after the Manager handle is gone.
template <class Device, class Storage, class Sync>
class Core final : public HookSource, public std::enable_shared_from_this<Core<Device, Storage, Sync>> {
 public:
  using SyncState = typename Sync::template State<Device>;
  using Entry = offload::Entry<typename SyncState::EntryState>;
  using Packed = detail::Packed<Entry>;

  Core(const Options& options, Storage storage)
      : options_(options), storage_(std::move(storage)), sync_(options_) {}

  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override {
    return std::make_unique<Hooks<Core>>(this->shared_from_this());
  }
  std::string describe() const override {
    return "Manager<" + std::string(Device::name) + ", " + std::string(Storage::name) + ", " +
           std::string(Sync::name) + ">";
  }

  Packed pack(const at::Tensor& t) {
    Packed packed;
    if (t.defined()) {
      packed.version_counter = t.unsafeGetTensorImpl()->version_counter();
      packed.saved_version = packed.version_counter.enabled() ? packed.version_counter.current_version() : 0;
      if (auto fn = t.grad_fn()) {
        packed.grad_fn = fn;
        packed.output_nr = t.output_nr();
      }
    }
    const std::lock_guard lock(mutex_);
    ++stats_.tensors_seen;
    if (t.defined()) ++seen_defined_;
    if (!t.defined() || t.device().type() != Device::device_type) {
      ++stats_.passed_other_device;
      packed.passthrough = t;
      return packed;
    }
    ++seen_on_device_;
    if (t.layout() != c10::kStrided || t.is_quantized() || t.is_nested() || !t.has_storage()) {
      ++stats_.passed_layout;
      packed.passthrough = t;
      return packed;
    }
    // Parameters: leaves that require grad, and views of them (Linear saves
    // weight.t()).
    if (t.requires_grad() && (t.is_leaf() || (t.is_view() && t._base().is_leaf()))) {
      ++stats_.passed_leaf;
      packed.passthrough = t;
      return packed;
    }
    const auto& storage = t.storage();
    const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    if (excluded_.count(key) != 0) {
      ++stats_.passed_excluded;
      packed.passthrough = t;
      return packed;
    }
    const auto nbytes = static_cast<std::int64_t>(storage.nbytes());
    if (nbytes < options_.min_offload_bytes) {
      ++stats_.passed_small;
      packed.passthrough = t;
      return packed;
    }
    packed.dtype = t.scalar_type();
    packed.sizes.assign(t.sizes().begin(), t.sizes().end());
    packed.strides.assign(t.strides().begin(), t.strides().end());
    packed.storage_offset = t.storage_offset();
    packed.conj = t.is_conj();
    packed.neg = t.is_neg();
    const auto version = static_cast<std::int64_t>(t._version());

    if (auto found = aliases_.find(key); found != aliases_.end()) {
      // The entry's weak reference to its source keeps the StorageImpl's
      // address from being reused, so a live entry with this key is this
      // very storage; the version tells whether it changed since.
      if (auto entry = found->second.lock(); entry && entry->version == version) {
        ++stats_.tensors_offloaded;
        ++stats_.tensors_aliased;
        ++entry->views;
        packed.entry = std::move(entry);
        return packed;
      }
    }
    if (options_.host_budget_bytes != 0 &&
        stats_.host_bytes_in_use + nbytes > options_.host_budget_bytes) {
      ++stats_.passed_budget;
      packed.passthrough = t;
      return packed;
    }

    auto entry = make_entry();
    entry->device = t.device();
    entry->nbytes = nbytes;
    entry->seq = next_seq_++;
    entry->version = version;
    entry->source.emplace(c10::weak_intrusive_ptr<c10::StorageImpl>(
        c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage.unsafeGetStorageImpl())));
    // Counted before the copy: if allocating or copying throws, the entry's
    // release gives the bytes back and the counter stays balanced.
    stats_.host_bytes_in_use += nbytes;
    const c10::DeviceGuard guard(t.device());
    entry->host = storage_.allocate(nbytes, Device::device_type, options_);
    const auto device_bytes = view_of(storage, t.device(), at::kByte, 0, {nbytes}, {1});
    sync_.offload(entry, device_bytes);
    if (Storage::prefers_pinned && options_.pin_memory && !entry->host.pinned) ++stats_.pinned_fallbacks;
    ++stats_.tensors_offloaded;
    ++stats_.storages_offloaded;
    stats_.bytes_offloaded += nbytes;
    stats_.host_bytes_peak = std::max(stats_.host_bytes_peak, stats_.host_bytes_in_use);
    prune_aliases();
    aliases_[key] = entry;
    packed.entry = std::move(entry);
    return packed;
  }

  at::Tensor unpack(const Packed& packed) {
    if (!packed.entry) {
      check_version(packed, packed.passthrough);
      return packed.passthrough;
    }
    const auto& entry = packed.entry;
    at::Tensor device_bytes;
    {
      const std::lock_guard lock(mutex_);
      const c10::DeviceGuard guard(entry->device);
      if (entry->reloaded) {
        if (auto impl = entry->reloaded->lock()) {
          device_bytes = view_of(c10::Storage(std::move(impl)), entry->device, at::kByte, 0, {entry->nbytes}, {1});
          ++stats_.reloads_shared;
        }
      }
      if (!device_bytes.defined()) {
        auto reloaded = sync_.reload(entry);
        device_bytes = std::move(reloaded.bytes);
        entry->reloaded.emplace(c10::weak_intrusive_ptr<c10::StorageImpl>(
            c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(device_bytes.storage().unsafeGetStorageImpl())));
        if (reloaded.copied) {  // else the policy still had the bytes (it counts that itself)
          ++stats_.tensors_reloaded;
          stats_.bytes_reloaded += entry->nbytes;
        }
      }
      // Several views of one storage: keep it on the device until each of
      // them was unpacked in this backward pass (or the pass ends).
      if (entry->views > 1) {
        if (++entry->unpacked < entry->views) {
          entry->keep = device_bytes;
        } else {
          entry->keep = at::Tensor();
          entry->unpacked = 0;
        }
      }
      sync_.on_unpack(entry);
      watch_backward_end();
    }
    const c10::DeviceGuard guard(entry->device);
    auto out = view_of(device_bytes.storage(), entry->device, packed.dtype, packed.storage_offset, packed.sizes,
                       packed.strides);
    if (packed.conj) out._set_conj(true);
    if (packed.neg) out._set_neg(true);
    check_version(packed, out);
    return out;
  }

  Stats stats() const override {
    const std::lock_guard lock(mutex_);
    Stats out = stats_;
    sync_.add_stats(out);
    return out;
  }
  void reset_stats() override {
    const std::lock_guard lock(mutex_);
    const auto in_use = stats_.host_bytes_in_use;
    stats_ = Stats{};
    stats_.host_bytes_in_use = in_use;
    stats_.host_bytes_peak = in_use;
  }
  void exclude(at::TensorList tensors) override {
    const std::lock_guard lock(mutex_);
    for (const auto& t : tensors) {
      if (!t.defined() || !t.has_storage()) continue;
      auto* impl = t.storage().unsafeGetStorageImpl();
      excluded_.try_emplace(impl, c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl));
    }
  }
  const Options& options() const noexcept override { return options_; }
  ScopeMark on_scope_enter() noexcept override {
    const std::lock_guard lock(mutex_);
    return ScopeMark{seen_defined_, seen_on_device_};
  }
  void on_scope_exit(const ScopeMark& opened, bool in_order) noexcept override {
    const std::lock_guard lock(mutex_);
    sync_.settle();
    // Scopes on other threads may pack meanwhile: a tensor on the device
    // seen by any of them silences the first warning (never a false alarm
    // from this scope's own tensors).
    const auto saved = seen_defined_ - opened.saved;
    if (saved > 0 && seen_on_device_ == opened.on_device && !warned_off_device_) {
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
  // Once per backward pass: when it ends, drop storages kept for views that
  // were not unpacked, and let the sync policy settle.
  void watch_backward_end() {
    const int id = current_backward_id();
    if (id < 0 || id == watched_backward_) return;
    watched_backward_ = id;
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
        core->sync_.end_backward();
      }
    });
  }
  template <class... Args>
  static void warn(const Args&... args) noexcept {
    try {
      TORCH_WARN(args...);
    } catch (...) {  // a warning handler that throws must not end the program here
    }
  }
  static void check_version(const Packed& packed, const at::Tensor& unpacked) {
    if (!packed.version_counter.enabled()) return;
    const auto current = packed.version_counter.current_version();
    if (current != packed.saved_version) {
      throw_modified_inplace(unpacked, current, packed.saved_version, packed.grad_fn, packed.output_nr);
    }
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
    sync_.release(e);
    stats_.host_bytes_in_use -= e.nbytes;
  }
  void prune_aliases() {
    if (aliases_.size() < prune_at_) return;
    std::erase_if(aliases_, [](const auto& kv) { return kv.second.expired(); });
    std::erase_if(excluded_, [](const auto& kv) { return kv.second.expired(); });
    prune_at_ = std::max<std::size_t>(64, 2 * aliases_.size());
  }

  mutable std::recursive_mutex mutex_;
  Options options_;
  Storage storage_;
  SyncState sync_;
  Stats stats_;
  std::int64_t seen_defined_ = 0;    // defined saved tensors packed (for the scope warnings)
  std::int64_t seen_on_device_ = 0;  // of them, on Device's device type
  bool warned_off_device_ = false;
  bool warned_order_ = false;
  std::uint64_t next_seq_ = 0;
  int watched_backward_ = -1;
  std::size_t prune_at_ = 64;
  std::unordered_map<const c10::StorageImpl*, std::weak_ptr<Entry>> aliases_;
  std::unordered_map<const c10::StorageImpl*, c10::weak_intrusive_ptr<c10::StorageImpl>> excluded_;
};

}  // namespace offload::detail
