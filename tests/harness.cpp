// SPDX-License-Identifier: MIT
#include "harness.hpp"

#include <algorithm>
#include <sstream>

#include <torch/torch.h>

#include "../models/gpt.hpp"

#if OFFLOAD_HAS_SIM
#include <iostream>

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>
#endif

namespace harness {

GradPair grads_plain_and_wrapped(const at::Tensor& w, const std::function<at::Tensor(const at::Tensor&)>& loss_of,
                                 const Wrap& wrap) {
  auto& grad = const_cast<at::Tensor&>(w).mutable_grad();
  grad = at::Tensor();
  loss_of(w).backward();
  GradPair out;
  out.plain = w.grad().clone();
  grad = at::Tensor();
  wrap([&] { return loss_of(w); }).backward();
  out.wrapped = w.grad();
  return out;
}

std::string_view name(ModelKind kind) {
  switch (kind) {
    case ModelKind::mlp:
      return "mlp";
    case ModelKind::block:
      return "block";
    case ModelKind::gpt:
      return "gpt";
  }
  return "?";
}

namespace {

struct Mlp : torch::nn::Module {
  Mlp()
      : fc1(register_module("fc1", torch::nn::Linear(32, 64))), fc2(register_module("fc2", torch::nn::Linear(64, 8))) {}
  torch::Tensor forward(const torch::Tensor& x) { return fc2(torch::gelu(fc1(x))); }
  torch::nn::Linear fc1, fc2;
};

}  // namespace

RunResult train(ModelKind kind, c10::Device device, int steps, const Wrap& wrap, const OnParams& on_params) {
  torch::manual_seed(0);
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor()> forward;
  torch::Tensor x, y;
  gpt::Config config{.vocab = 16, .layers = 2, .width = 32, .heads = 4, .seq = 8};
  switch (kind) {
    case ModelKind::mlp: {
      auto m = std::make_shared<Mlp>();
      x = torch::randn({16, 32});
      y = torch::randn({16, 8});
      m->to(device);
      x = x.to(device);
      y = y.to(device);
      forward = [m, &x, &y] { return torch::mse_loss(m->forward(x), y); };
      module = m;
      break;
    }
    case ModelKind::block: {
      auto m = gpt::Block(config);
      x = torch::randn({2, config.seq, config.width});
      m->to(device);
      x = x.to(device);
      forward = [m, &x]() mutable { return m->forward(x).pow(2).mean(); };
      module = m.ptr();
      break;
    }
    case ModelKind::gpt: {
      auto m = gpt::Model(config);
      auto data = torch::randint(config.vocab, {2, config.seq + 1}, torch::kLong);
      m->to(device);
      x = data.narrow(1, 0, config.seq).to(device);
      y = data.narrow(1, 1, config.seq).to(device);
      forward = [m, &x, &y]() mutable { return m->loss(x, y); };
      module = m.ptr();
      break;
    }
  }
  return train_params(module->parameters(), forward, steps, wrap, on_params);
}

RunResult train_params(const std::vector<at::Tensor>& params, const Forward& forward, int steps, const Wrap& wrap,
                       const OnParams& on_params, const std::function<void(int)>& after_step) {
  if (on_params) on_params(params);
  // AdamW's default eps (1e-8) is 0 in fp16, where a parameter whose
  // gradient is 0 or underflows when squared would step by x / 0.
  const bool half =
      std::any_of(params.begin(), params.end(), [](const at::Tensor& p) { return p.scalar_type() == at::kHalf; });
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-2).eps(half ? 1e-4 : 1e-8));
  RunResult result;
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss = wrap ? wrap(forward) : forward();
    loss.backward();
    result.losses.push_back(loss.item<float>());
    if (step + 1 == steps) {
      for (const auto& p : params) {
        result.last_grads.push_back(p.grad().defined() ? p.grad().to(torch::kCPU) : torch::Tensor());
      }
    }
    optimizer.step();
    if (after_step) after_step(step);
  }
  for (const auto& p : params) result.params.push_back(p.detach().to(torch::kCPU));
  return result;
}

namespace {
struct ScaleByCpu : torch::autograd::Function<ScaleByCpu> {
  static inline c10::Device seen{c10::DeviceType::CPU};
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& c) {
    ctx->save_for_backward({x, c});
    return x * c.to(x.device());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    seen = saved[1].device();
    return {grads[0] * saved[1].to(saved[0].device()), torch::Tensor()};
  }
};
}  // namespace

CustomFunctionResult custom_function_saving_cpu(c10::Device device, const Wrap& wrap) {
  torch::manual_seed(1);
  auto x = torch::randn({64, 64}).to(device).requires_grad_();
  auto c = torch::randn({64, 64});
  Forward forward = [&] { return ScaleByCpu::apply(x * 1, c).sum(); };
  auto loss = wrap ? wrap(forward) : forward();
  loss.backward();
  return {x.grad().to(torch::kCPU), ScaleByCpu::seen};
}

#if OFFLOAD_HAS_SIM
Step train_step(const std::vector<at::Tensor>& params, c10::Device device, const Forward& loss,
                const offload::AnyManager* manager) {
  for (const auto& p : params) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
  synchronize(device);
  reset_peak(device);
  std::optional<offload::Scope> scope;
  if (manager != nullptr) scope.emplace(*manager);
  auto value = loss();
  scope.reset();
  Step out;
  out.forward_peak = peak_bytes(device);
  value.backward();
  synchronize(device);
  out.peak = peak_bytes(device);
  out.loss = value.item<float>();
  for (const auto& p : params) out.grads.push_back(p.grad().to(at::kCPU));
  return out;
}

bool same(const Step& a, const Step& b) {
  if (a.loss != b.loss || a.grads.size() != b.grads.size()) return false;
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    if (!at::equal(a.grads[i], b.grads[i])) return false;
  }
  return true;
}

void synchronize(c10::Device device) {
  if (device.type() == c10::DeviceType::PrivateUse1) {
    offload::sim::synchronize();
  } else {
    c10::impl::getDeviceGuardImpl(device.type())->synchronizeDevice(device.index());
    // A caching allocator stops counting a block freed while a side stream
    // still used it (record_stream) as active only when it next processes
    // its events (allocated bytes dropped at the free): this does, so the
    // counts below are exact.
    c10::getDeviceAllocator(device.type())->emptyCache();
  }
}

// Another device's active bytes: what a target steers by (blocks held
// for a recorded stream included), as device::Cuda reads them.
std::int64_t device_bytes(c10::Device device) {
  if (device.type() == c10::DeviceType::PrivateUse1) return offload::sim::device_memory(device.index()).current_bytes;
  return c10::getDeviceAllocator(device.type())->getDeviceStats(device.index()).active_bytes[0].current;
}

std::int64_t peak_bytes(c10::Device device) {
  if (device.type() == c10::DeviceType::PrivateUse1) return offload::sim::device_memory(device.index()).peak_bytes;
  return c10::getDeviceAllocator(device.type())->getDeviceStats(device.index()).active_bytes[0].peak;
}

void reset_peak(c10::Device device) {
  if (device.type() == c10::DeviceType::PrivateUse1) {
    offload::sim::reset_peak(device.index());
  } else {
    c10::getDeviceAllocator(device.type())->resetPeakStats(device.index());
  }
}

std::int64_t settled_device_bytes(c10::Device device) {
  {
    const offload::NoOffload no_offload;
    const auto leaf = torch::zeros({0}, torch::TensorOptions().device(device)).requires_grad_();
    (leaf * 2).backward(torch::zeros_like(leaf));
  }
  synchronize(device);
  return device_bytes(device);
}

ReadmeRun run_readme_snippet() {
  offload::sim::install();
  const c10::Device device(c10::DeviceType::PrivateUse1, 0);
  auto data = torch::randint(16, {2, 9}, torch::kLong);
  auto inputs = data.narrow(1, 0, 8).to(device);
  auto targets = data.narrow(1, 1, 8).to(device);
  const int steps = 2;
  auto fresh = [&] {
    torch::manual_seed(0);
    auto m = gpt::Model(gpt::Config{.vocab = 16, .layers = 2, .width = 32, .heads = 4, .seq = 8});
    m->to(device);
    return m;
  };
  ReadmeRun out;
  {
    auto model = fresh();
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
#include "readme_snippet.inc"
    out.with_snippet = model->loss(inputs, targets).item<float>();
    out.stats = manager.stats();
  }
  auto model = fresh();
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    model->loss(inputs, targets).backward();
    optimizer.step();
  }
  out.without = model->loss(inputs, targets).item<float>();
  return out;
}
#endif

bool bitwise_equal(const RunResult& a, const RunResult& b, std::string* why) {
  std::ostringstream out;
  bool ok = true;
  if (a.losses.size() != b.losses.size()) {
    out << "step counts differ";
    ok = false;
  }
  for (std::size_t i = 0; ok && i < a.losses.size(); ++i) {
    if (std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)) != 0) {
      out << "loss of step " << i << ": " << a.losses[i] << " vs " << b.losses[i];
      ok = false;
    }
  }
  auto same = [&](const std::vector<at::Tensor>& p, const std::vector<at::Tensor>& q, const char* what) {
    if (!ok) return;
    if (p.size() != q.size()) {
      out << what << " counts differ";
      ok = false;
      return;
    }
    for (std::size_t i = 0; i < p.size(); ++i) {
      if (!p[i].defined() || !q[i].defined()) {
        if (p[i].defined() != q[i].defined()) {
          out << what << " " << i << " is defined in one run only";
          ok = false;
          return;
        }
        continue;
      }
      if (p[i].sizes() != q[i].sizes() || p[i].scalar_type() != q[i].scalar_type() ||
          std::memcmp(p[i].contiguous().data_ptr(), q[i].contiguous().data_ptr(), p[i].nbytes()) != 0) {
        out << what << " " << i << " differs (max abs diff "
            << (p[i].to(torch::kDouble) - q[i].to(torch::kDouble)).abs().max().item<double>() << ")";
        ok = false;
        return;
      }
    }
  };
  same(a.last_grads, b.last_grads, "gradient");
  same(a.params, b.params, "parameter");
  if (why != nullptr) *why = out.str();
  return ok;
}

}  // namespace harness
