// SPDX-License-Identifier: MIT
//
// The sim kernels: factories, views, resize/set_, local scalar and copies are
// native (they alias or allocate sim memory); every other operator runs on
// the CPU after the current stream of its device has drained, including
// those that other backends would run through a CompositeExplicitAutograd
// decomposition, so results match the CPU bit for bit. An operator that
// writes none of its arguments reads them in place through CPU views of sim
// memory; any other goes through the boxed CPU fallback, which copies its
// arguments to the CPU and back. Registered at install() time, not at load
// time.

#include "checker.hpp"
#include "runtime.hpp"

#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_local_scalar_dense.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace offload::sim::detail {
namespace {

constexpr auto kSimType = c10::DeviceType::PrivateUse1;
constexpr c10::DispatchKeySet kSimKeys(c10::DispatchKey::PrivateUse1);

bool is_sim(const at::Tensor& t) { return t.device().type() == kSimType; }

// True while the sim runs an operator on the CPU on this thread: the copies
// that move its arguments and results between sim memory and the CPU are
// the sim's own mechanism (its memory is host memory), not traffic over the
// link, so they take no link time.
thread_local bool t_inside_kernel = false;

class InsideKernel {
 public:
  InsideKernel() : previous_(std::exchange(t_inside_kernel, true)) {}
  ~InsideKernel() { t_inside_kernel = previous_; }
  InsideKernel(const InsideKernel&) = delete;
  InsideKernel& operator=(const InsideKernel&) = delete;

 private:
  bool previous_;
};

c10::Allocator* sim_allocator() { return c10::GetAllocator(kSimType); }

// A CPU tensor aliasing the memory of the sim tensor `t` (sim memory is host
// memory): same sizes, strides, dtype, neg/conj bits and wrapped-number
// flag (a Python scalar made a tensor, which type promotion treats as a
// number). Does not own it.
at::Tensor host_view(const at::Tensor& t) {
  auto view = at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(c10::kCPU));
  if (t.is_neg()) {
    view._set_neg(true);
  }
  if (t.is_conj()) {
    view._set_conj(true);
  }
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
    view.unsafeGetTensorImpl()->set_wrapped_number(true);
  }
  return view;
}

// Copies between CPU tensors (some of which alias sim memory).
void copy_host(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.dtype() == src.dtype() && dst.sizes().equals(src.sizes()) && dst.is_contiguous() && src.is_contiguous() &&
      !dst.is_neg() && !src.is_neg() && !dst.is_conj() && !src.is_conj()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  const_cast<at::Tensor&>(dst).copy_(src);
}

// ------------------------------------------------------------------ stream checking

// Declares, in checking mode, a kernel or copy named `op` on the current
// stream of sim device `index` reading `reads` and writing `writes`
// (undefined tensors are skipped); throws c10::Error on a report.
void declare(c10::DeviceIndex index, std::string_view op, std::initializer_list<const at::Tensor*> reads,
             std::initializer_list<const at::Tensor*> writes) {
  if (t_inside_kernel || !check::on()) {
    return;  // the copies inside an operator are part of it
  }
  std::vector<check::Touch> touches;
  for (const auto* t : reads) {
    touches.push_back({t, false});
  }
  for (const auto* t : writes) {
    touches.push_back({t, true});
  }
  check::launch(index, current_stream_id(index), op, touches);
}

// Adds the tensors of `v` (a tensor or a list of tensors and Nones).
void add_touches(const c10::IValue& v, bool write, std::vector<check::Touch>& touches) {
  if (v.isTensor()) {
    touches.push_back({&v.toTensor(), write});
  } else if (v.isList()) {
    for (const auto& element : v.toListRef()) {
      if (element.isTensor()) {
        touches.push_back({&element.toTensor(), write});
      }
    }
  }
}

// Declares, in checking mode, what a boxed operator on sim device `index`
// touches: `before` (its arguments on `stack`, before it runs: those its
// schema marks written are writes, views of them nothing, the others reads,
// as CSAN parses them) or its results after (new tensors: writes).
void declare_boxed(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, c10::DeviceIndex index,
                   bool before) {
  if (!check::on()) {
    return;
  }
  const auto& params = before ? schema.arguments() : schema.returns();
  const auto values = torch::jit::last(stack, params.size());
  std::vector<check::Touch> touches;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto* alias = params[i].alias_info();
    if (alias != nullptr && !alias->isWrite()) {
      continue;  // a view: metadata only
    }
    if (!before && alias != nullptr) {
      continue;  // returns an argument, declared with it
    }
    add_touches(values[i], !before || alias != nullptr, touches);
  }
  if (!touches.empty()) {
    check::launch(index, current_stream_id(index), schema.name(), touches);
  }
}

// ------------------------------------------------------------------ factories

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == kSimType, "offload::sim: empty on ", dev);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "offload::sim: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "offload::sim: only CPU tensors can be pinned");
  const c10::DeviceGuard guard(dev);
  return at::Tensor(
      at::detail::empty_generic(size, sim_allocator(), kSimKeys, c10::dtype_or_default(dtype), memory_format));
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(dev.type() == kSimType, "offload::sim: empty_strided on ", dev);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "offload::sim: only strided tensors are supported");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "offload::sim: only CPU tensors can be pinned");
  const c10::DeviceGuard guard(dev);
  return at::Tensor(
      at::detail::empty_strided_generic(size, stride, sim_allocator(), kSimKeys, c10::dtype_or_default(dtype)));
}

// ------------------------------------------------------------------ views and metadata

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) { return at::native::view(self, size); }

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  drain_current(self.device().index());  // growing copies the old bytes
  return at::native::resize_(self, size, memory_format);
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) { return at::native::set_(self, source); }

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, int64_t storage_offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  const c10::DeviceGuard guard(self.device());
  return at::native::set_storage_cpu_(self, source, storage_offset, size, stride);
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceGuard guard(self.device());
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, sim_allocator(), /*resizable=*/true);
  return at::native::set_storage_cpu_(self, storage, 0, {0}, {});
}

bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  const auto dense = [](const at::Tensor& t) { return t.layout() == c10::kStrided && (t.is_cpu() || is_sim(t)); };
  return self.key_set() == from.key_set() || (dense(self) && dense(from));
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  c10::getDeviceAllocator(kSimType)->recordStream(self.storage().data_ptr(), stream);
}

// ------------------------------------------------------------------ data

c10::Scalar local_scalar_dense(const at::Tensor& self) {
  const auto index = self.device().index();
  declare(index, "aten::_local_scalar_dense", {&self}, {});
  drain_current(index);
  // The host waits for the value, as CUDA's item() synchronizes the stream.
  if (!t_inside_kernel && check::on()) {
    check::synchronize_stream(index, current_stream_id(index));
  }
  return at::_local_scalar_dense(host_view(self));
}

// A copy between sim devices (or within one) in checking mode: on the
// source device's current stream, ordered after the destination's current
// stream and before its later work (as a peer copy's events order them).
void declare_device_copy(const at::Tensor& self, const at::Tensor& dst) {
  if (t_inside_kernel || !check::on()) {
    return;
  }
  const auto from = self.device().index();
  const auto to = dst.device().index();
  if (from != to) {
    check::wait(*check::record(to, current_stream_id(to)), from, current_stream_id(from));
  }
  declare(from, "aten::copy_", {&self}, {&dst});
  if (from != to) {
    check::wait(*check::record(from, current_stream_id(from)), to, current_stream_id(to));
  }
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "offload::sim: copy of an undefined tensor");
  const bool src_sim = is_sim(self);
  const bool dst_sim = is_sim(dst);
  TORCH_CHECK((src_sim || self.is_cpu()) && (dst_sim || dst.is_cpu()), "offload::sim: copies are supported between ",
              c10::get_privateuse1_backend(), " devices and the CPU only, got ", self.device(), " -> ", dst.device());
  if (dst.numel() == 0) {
    return dst;
  }
  const at::Tensor src_host = src_sim ? host_view(self) : self;
  const at::Tensor dst_host = dst_sim ? host_view(dst) : dst;
  if (src_sim && dst_sim) {
    declare_device_copy(self, dst);
    drain_current(self.device().index());
    if (dst.device() != self.device()) {
      drain_current(dst.device().index());
    }
    copy_host(dst_host, src_host);
    return dst;
  }
  // Either way the copy crosses the link and takes its link time. A blocking
  // copy runs once the current stream has drained (it is next on it): it
  // moves its bytes, then holds the host until the link time has passed.
  const auto index = src_sim ? self.device().index() : dst.device().index();
  const auto link_ns = t_inside_kernel ? 0 : link_time_ns(dst.nbytes());
  declare(index, non_blocking ? "aten::copy_ (non_blocking)" : "aten::copy_", {&self}, {&dst});
  if (!non_blocking) {
    if (!t_inside_kernel && check::on()) {
      check::synchronize_stream(index, current_stream_id(index));  // the host waits for a blocking copy
    }
    drain_current(index);
    const auto start_ns = steady_now_ns();
    copy_host(dst_host, src_host);
    wait_until_ns(start_ns + link_ns);
    return dst;
  }
  // Queued on the current stream of the sim device; its bytes move at the
  // end of its link time, so a reader that does not wait for the copy sees
  // the old destination, and a source freed too early is read poisoned.
  // The CPU tensor is kept alive by the task (as a pinned host block is by
  // CUDA's host allocator); the sim memory is not: freeing it early is the
  // fault this must expose.
  enqueue(index, current_stream_id(index), [dst_host, src_host, link_ns] {
    wait_until_ns(link_slot_end_ns(link_ns));
    copy_host(dst_host, src_host);
  });
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (!dst.sizes().equals(self.sizes())) {
    dst.resize_(self.sizes());
  }
  return copy_from(self, dst, false);
}

// native_batch_norm updates running_mean and running_var in place, but its
// schema does not mark them as written, so the CPU fallback (which copies
// back only arguments marked so) would leave sim's running statistics
// untouched. Run on CPU views of the sim memory instead: the CPU kernel
// updates the statistics where they live.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(const at::Tensor& input,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias,
                                                                 const std::optional<at::Tensor>& running_mean,
                                                                 const std::optional<at::Tensor>& running_var,
                                                                 bool training, double momentum, double eps) {
  const auto host = [&](const std::optional<at::Tensor>& t) -> std::optional<at::Tensor> {
    if (!t.has_value() || !t->defined()) {
      return t;
    }
    TORCH_CHECK(t->device() == input.device(),
                "Expected all tensors to be on the same device, but found at least two devices, ", input.device(),
                " and ", t->device(), "! (when checking arguments for aten::native_batch_norm)");
    return host_view(*t);
  };
  const c10::DeviceGuard guard(input.device());
  const auto index = input.device().index();
  const at::Tensor none;
  const auto& mean_in = running_mean.has_value() ? *running_mean : none;
  const auto& var_in = running_var.has_value() ? *running_var : none;
  // Read, as the schema says and CSAN takes it (training also updates the
  // running statistics in place: autograd saves them unversioned, and
  // backward in training ignores them).
  declare(index, "aten::native_batch_norm",
          {&input, weight.has_value() ? &*weight : &none, bias.has_value() ? &*bias : &none, &mean_in, &var_in}, {});
  drain_current(index);
  std::tuple<at::Tensor, at::Tensor, at::Tensor> results;
  {
    const InsideKernel inside;
    const auto [out, mean, invstd] = at::native_batch_norm(
        host_view(input), host(weight), host(bias), host(running_mean), host(running_var), training, momentum, eps);
    results = {out.to(input.device()), mean.to(input.device()), invstd.to(input.device())};
  }
  declare(index, "aten::native_batch_norm", {}, {&std::get<0>(results), &std::get<1>(results), &std::get<2>(results)});
  return results;
}

// ------------------------------------------------------------------ fallback

// Ops that legitimately take CPU index tensors next to device tensors.
bool mixing_allowed(std::string_view name) {
  return name == "aten::index" || name == "aten::index_put_" || name == "aten::_index_put_impl_" ||
         name == "aten::index_put";
}

// Whether a return of this type holds no tensor, or only tensors that
// run_on_host_views() copies: an object (a prepacked weight, say) could keep a view
// of sim memory past the arguments' life.
bool copyable_return(const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::TensorType:
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
    case c10::TypeKind::ComplexType:
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
    case c10::TypeKind::NumberType:
    case c10::TypeKind::ScalarTypeType:
    case c10::TypeKind::StringType:
    case c10::TypeKind::NoneType:
      return true;
    case c10::TypeKind::OptionalType:
      return copyable_return(type->castRaw<c10::OptionalType>()->getElementType());
    case c10::TypeKind::ListType: {
      const auto element = type->castRaw<c10::ListType>()->getElementType()->kind();
      return element == c10::TypeKind::TensorType || element == c10::TypeKind::IntType ||
             element == c10::TypeKind::SymIntType || element == c10::TypeKind::FloatType ||
             element == c10::TypeKind::BoolType;
    }
    default:
      return false;
  }
}

// Whether an operator can run on CPU views of its sim arguments: it writes
// none of them and returns nothing that aliases them, so it only reads sim
// memory and returns new tensors (most of a model's operators) or plain
// values. (sim_fallback also sends there only operators whose arguments
// carry no math bit, which the CPU fallback's copy resolves and a view would
// not, and name no device, which the CPU fallback runs on the CPU and
// returns there.)
bool runs_on_host_views(const c10::FunctionSchema& schema) {
  if (schema.is_mutable()) {
    return false;
  }
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr || !copyable_return(ret.real_type())) {
      return false;
    }
  }
  return true;
}

// `f` applied to every tensor of `v` (a tensor, a tensor list or an
// optional-tensor list; undefined tensors and Nones are kept as they are);
// anything else stays.
template <class F>
c10::IValue map_tensors(const c10::IValue& v, const F& f) {
  const auto apply = [&](const at::Tensor& t) { return t.defined() ? f(t) : t; };
  if (v.isTensor()) {
    return c10::IValue(apply(v.toTensor()));
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    out.reserve(v.toTensorList().size());
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(apply(t));
    }
    return c10::IValue(std::move(out));
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      out.push_back(t.has_value() ? std::optional<at::Tensor>(apply(*t)) : t);
    }
    return c10::IValue(std::move(out));
  }
  return v;
}

// Runs a read-only operator (runs_on_host_views) on CPU views of its sim
// arguments, without the CPU fallback's copy of every input: the CPU kernel
// reads sim memory where it lies (sim memory is host memory) and sees the
// same sizes, strides and bits as on the CPU, so results are the CPU's bit
// for bit. Only the results are copied to the device.
void run_on_host_views(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::Device device) {
  const auto num_args = op.schema().arguments().size();
  const auto first = stack->size() - num_args;
  // The views do not own the memory: the arguments stay alive here until
  // the kernel has run (a temporary's only reference may be the stack's).
  std::vector<c10::IValue> arguments(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (std::size_t i = first; i < stack->size(); ++i) {
    (*stack)[i] = map_tensors((*stack)[i], [](const at::Tensor& t) { return is_sim(t) ? host_view(t) : t; });
  }
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  // Each CPU result goes to the device (a copy, as the CPU fallback makes,
  // taking no link time).
  const auto num_returns = op.schema().returns().size();
  for (std::size_t i = stack->size() - num_returns; i < stack->size(); ++i) {
    (*stack)[i] = map_tensors((*stack)[i], [&](const at::Tensor& t) { return t.is_cpu() ? t.to(device) : t; });
  }
}

// Runs a boxed operator with the CPU kernel, on CPU views of its sim
// arguments where it can (`views_possible` and runs_on_host_views), else
// through the CPU fallback; then declares its results (checking mode).
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack, std::optional<c10::Device> sim_device,
                bool views_possible) {
  {
    const InsideKernel inside;
    if (sim_device && views_possible && runs_on_host_views(op.schema())) {
      run_on_host_views(op, stack, *sim_device);
    } else {
      at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
    }
  }
  if (sim_device) {
    declare_boxed(op.schema(), *stack, sim_device->index(), /*before=*/false);
  }
}

void sim_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto args = torch::jit::last(*stack, schema.arguments().size());
  std::optional<c10::Device> sim_device;
  std::optional<c10::Device> other_device;
  bool views_possible = true;  // no sim tensor with a math bit, no Device argument (runs_on_host_views)
  const auto visit = [&](const c10::IValue& v) {
    if (v.isDevice()) {
      views_possible = false;
    }
    if (!v.isTensor()) {
      return;
    }
    const auto& t = v.toTensor();
    if (!t.defined()) {
      return;
    }
    if (is_sim(t)) {
      TORCH_CHECK(!sim_device || *sim_device == t.device(),
                  "Expected all tensors to be on the same device, but found at least two devices, ", *sim_device,
                  " and ", t.device(), "! (when checking arguments for ", schema.name(), ")");
      sim_device = t.device();
      views_possible = views_possible && !t.is_conj() && !t.is_neg();
    } else if (t.dim() > 0) {
      other_device = t.device();  // 0-dim CPU tensors are scalars, as on CUDA
    }
  };
  for (const auto& arg : args) {
    if (arg.isList()) {
      for (const auto& element : arg.toListRef()) {
        visit(element);
      }
    } else {
      visit(arg);
    }
  }
  if (sim_device) {
    TORCH_CHECK(!other_device || mixing_allowed(schema.name()),
                "Expected all tensors to be on the same device, but found at least two devices, ", *sim_device, " and ",
                *other_device, "! (when checking arguments for ", schema.name(), ")");
    declare_boxed(schema, *stack, sim_device->index(), /*before=*/true);
    drain_current(sim_device->index());
  }
  // The CPU fallback runs the operator on the CPU: without a CPU kernel it
  // would fail with an error about the CPU, so say which device asked.
  TORCH_CHECK_NOT_IMPLEMENTED(
      op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional),
      "offload::sim: operator ", schema.name(), schema.overload_name().empty() ? "" : ".", schema.overload_name(),
      " cannot run on ", sim_device ? sim_device->str() : c10::get_privateuse1_backend(),
      ": it has no kernel for this device, and none for the CPU that the sim could run instead");
  run_on_cpu(op, stack, sim_device, views_possible);
}

// View operators that only have backend kernels (unfold, view_as_real,
// view_as_complex): their CPU kernels only compute metadata and share the
// input's storage and key set, so they are run on the sim tensor directly.
bool is_view(const c10::FunctionSchema& schema) {
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) {
      return true;
    }
  }
  return false;
}

bool needs_cpu_view_kernel(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  return schema.name().rfind("aten::", 0) == 0 && schema.name().rfind("aten::_nested", 0) != 0 && is_view(schema) &&
         op.hasKernelForDispatchKey(c10::DispatchKey::CPU) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) &&
         !op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
}

void view_via_cpu_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  for (const auto& ret : torch::jit::last(*stack, op.schema().returns().size())) {
    TORCH_INTERNAL_ASSERT(!ret.isTensor() || is_sim(ret.toTensor()), "offload::sim: view ", op.schema().name(),
                          " did not stay on the device");
  }
}

// Operators the CPU runs with its own kernel but other backends run through
// a composite decomposition (native_layer_norm has a CompositeExplicitAutograd
// one, mish_backward a CompositeImplicitAutograd one): the sim sends them to
// the CPU kernel too, so results match the CPU bit for bit. As on the CPU
// and CUDA, a backend kernel of a CompositeImplicitAutograd operator is not
// differentiated through (those are backward helpers). Views, factories and
// the copy machinery keep their composite kernels.
bool needs_cpu_kernel(const c10::OperatorHandle& op) {
  const auto& schema = op.schema();
  if (schema.name().rfind("aten::", 0) != 0 || op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1) ||
      !op.hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
      !(op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional) ||
        op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))) {
    return false;
  }
  static constexpr std::string_view keep_composite[] = {
      "aten::copy_", "aten::copy",        "aten::_to_copy",
      "aten::to",    "aten::_copy_from",  "aten::_copy_from_and_resize",
      "aten::lift",  "aten::lift_fresh",  "aten::lift_fresh_copy",
      "aten::clone", "aten::_pin_memory", "aten::is_pinned"};
  for (const auto name : keep_composite) {
    if (schema.name() == name) {
      return false;
    }
  }
  bool takes_tensor = false;
  for (const auto& arg : schema.arguments()) {
    const auto& type = arg.real_type();
    if (type->kind() == c10::TypeKind::TensorType) {
      takes_tensor = true;
    } else if (const auto list = type->cast<c10::ListType>()) {
      takes_tensor = takes_tensor || list->getElementType()->kind() == c10::TypeKind::TensorType;
    } else if (const auto opt = type->cast<c10::OptionalType>()) {
      takes_tensor = takes_tensor || opt->getElementType()->kind() == c10::TypeKind::TensorType;
    }
  }
  // A factory's composite creates sim tensors; a view's composite aliases.
  return takes_tensor && !is_view(schema);
}

// torch.autocast("sim"): PyTorch's own op lists and cast policies
// (ATen/autocast_mode.h, those CUDA registers), every other operator
// passing through, so mixed precision runs on sim as on an accelerator.
void register_autocast() {
  using at::DimnameList, at::IntArrayRef, at::Scalar, at::ScalarType, at::Tensor;  // the lists' signatures
  auto* all = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
  all->fallback(torch::CppFunction::makeFallthrough());
  auto& m =
      *new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutocastPrivateUse1, __FILE__, __LINE__);
#define OFFLOAD_SIM_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define OFFLOAD_SIM_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define OFFLOAD_SIM_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define OFFLOAD_SIM_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
  AT_FORALL_LOWER_PRECISION_FP(OFFLOAD_SIM_LOWER)
  AT_FORALL_FP32(OFFLOAD_SIM_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(OFFLOAD_SIM_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(OFFLOAD_SIM_PROMOTE)
#undef OFFLOAD_SIM_LOWER
#undef OFFLOAD_SIM_FP32
#undef OFFLOAD_SIM_FP32_SET_OPT_DTYPE
#undef OFFLOAD_SIM_PROMOTE
}

}  // namespace

void register_kernels() {
  // Leaked: registrations stay for the life of the process.
  auto* aten = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  aten->impl("empty.memory_format", TORCH_FN(empty_memory_format));
  aten->impl("empty_strided", TORCH_FN(empty_strided));
  aten->impl("as_strided", TORCH_FN(as_strided));
  aten->impl("view", TORCH_FN(view));
  aten->impl("_reshape_alias", TORCH_FN(reshape_alias));
  aten->impl("resize_", TORCH_FN(resize_));
  aten->impl("set_.source_Storage", TORCH_FN(set_storage));
  aten->impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  aten->impl("set_.source_Tensor", TORCH_FN(set_tensor));
  aten->impl("set_", TORCH_FN(set_empty));
  aten->impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  aten->impl("record_stream", TORCH_FN(record_stream));
  aten->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  aten->impl("_copy_from", TORCH_FN(copy_from));
  aten->impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  aten->impl("native_batch_norm", TORCH_FN(native_batch_norm));

  for (const auto& name : c10::Dispatcher::singleton().getAllOpNames()) {
    const auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op) {
      continue;
    }
    const bool view = needs_cpu_view_kernel(*op);
    if (!view && !needs_cpu_kernel(*op)) {
      continue;
    }
    auto qualified = name.name.substr(std::string_view("aten::").size());  // both predicates check it
    if (!name.overload_name.empty()) {
      qualified += "." + name.overload_name;
    }
    aten->impl(qualified.c_str(), view ? torch::CppFunction::makeFromBoxedFunction<&view_via_cpu_kernel>()
                                       : torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
  }

  // Operators whose CompositeExplicitAutograd kernel picks an algorithm by
  // the device type: for any accelerator but CUDA, convolution ends in
  // convolution_overrideable, which only the backend implements. The sim
  // runs them on the CPU, which picks the CPU's algorithm, so results are
  // the CPU's bit for bit (channels_last kept: the fallback copies back
  // with the CPU result's strides).
  for (const char* name : {"convolution", "convolution_backward", "_convolution", "_convolution.deprecated"}) {
    aten->impl(name, torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());
  }
  register_cell_kernels(*aten);

  // A copy from or to a conjugated or negated sim tensor goes through
  // _copy_from, which no math-bit kernel handles: the Conjugate and Negative
  // fallbacks would materialise the source with clone(), which copies
  // through _copy_from again, without end. copy_from() honours both bits
  // itself (host_view keeps them), so those keys pass the call through.
  for (const auto key : {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative}) {
    auto* bits = new torch::Library(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
    bits->impl("_copy_from", torch::CppFunction::makeFallthrough());
    bits->impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
  }

  auto* all = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  all->fallback(torch::CppFunction::makeFromBoxedFunction<&sim_fallback>());

  register_autocast();
}

}  // namespace offload::sim::detail
