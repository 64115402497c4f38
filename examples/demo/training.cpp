// SPDX-License-Identifier: MIT
// The demo's one translation unit with the optimizer and the offload
// managers; the models are models/registry.hpp's.

#include "training.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iostream>
#include <random>

#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <offload/dispatch.hpp>
#include <offload/offload.hpp>

#include "../../models/char_model.hpp"
#include "../../models/registry.hpp"
#include "parallel.hpp"

namespace demo {
namespace {

/// The manager of `mode` for `device`: through the dispatcher when it picks
/// that device, else (--device sim while LibTorch reports another
/// accelerator) with device::Sim named directly.
offload::AnyManager make_manager(OffloadMode mode, const DeviceChoice& device, const offload::Options& options) {
  using offload::storage::PinnedHost;
  const bool blocking = mode == OffloadMode::blocking;
  if (device.dispatched) {
    return blocking ? offload::make_manager<PinnedHost, offload::sync::Blocking>(options)
                    : offload::make_manager<PinnedHost, offload::sync::Streamed>(options);
  }
  using offload::device::Sim;
  if (blocking) return offload::AnyManager(offload::Manager<Sim, PinnedHost, offload::sync::Blocking>(options));
  return offload::AnyManager(offload::Manager<Sim, PinnedHost, offload::sync::Streamed>(options));
}

/// The batches of step `step` are the same in every run: offsets from a
/// generator seeded with --seed, drawn in step order.
std::pair<torch::Tensor, torch::Tensor> batch(const Args& args, const torch::Tensor& tokens, c10::Device device,
                                              std::mt19937_64& rng) {
  std::uniform_int_distribution<std::int64_t> pick(0, tokens.size(0) - args.seq - 1);
  std::vector<torch::Tensor> xs, ys;
  for (std::int64_t b = 0; b < args.batch; ++b) {
    const auto at = pick(rng);
    xs.push_back(tokens.narrow(0, at, args.seq));
    ys.push_back(tokens.narrow(0, at + 1, args.seq));
  }
  return {torch::stack(xs).to(device), torch::stack(ys).to(device)};
}

void progress(const Args& args, const RunResult& r, const DeviceMemory& memory, std::int64_t step, double step_seconds,
              bool last, bool tty) {
  const std::int64_t every = args.log_every > 0 ? args.log_every : std::max<std::int64_t>(1, args.steps / 10);
  if (!tty && !last && step != 1 && step % every != 0) return;
  char line[256];
  const double tok_s = step_seconds > 0 ? static_cast<double>(args.batch * args.seq) / step_seconds : 0.0;
  std::snprintf(line, sizeof line, "[%-8s] step %*lld/%lld  loss %.4f  %8.0f tok/s  device %s (peak %s)",
                r.name.c_str(), static_cast<int>(std::to_string(args.steps).size()), static_cast<long long>(step),
                static_cast<long long>(args.steps), static_cast<double>(r.losses.back()), tok_s,
                mib(memory.current()).c_str(), mib(memory.peak()).c_str());
  if (tty) {
    std::cout << '\r' << line << "\033[K" << (last ? "\n" : "") << std::flush;
  } else {
    std::cout << line << '\n' << std::flush;
  }
}

/// After a step ran out of device memory in backward, the device's autograd
/// thread still holds that backward's graph task (and the gradients it had
/// buffered) until it runs its next one: a backward of a zero-element tensor
/// on `device` lets it go, so the next run starts from what it owns.
void release_failed_backward(c10::Device device) {
  auto z = torch::zeros({0}, torch::TensorOptions().device(device).requires_grad(true));
  z.sum().backward();
}

}  // namespace

std::string mib(std::int64_t bytes) {
  if (bytes < 0) return "n/a";
  char buf[64];
  const double m = static_cast<double>(bytes) / (1024.0 * 1024.0);
  if (m >= 1024)
    std::snprintf(buf, sizeof buf, "%.2f GiB", m / 1024.0);
  else
    std::snprintf(buf, sizeof buf, "%.1f MiB", m);
  return buf;
}

namespace {

// The run's name in the report: "none", the mode ("checkpoint+" before it
// if checkpointed), "target", or "auto" (the automatic plan).
std::string run_name(const RunSpec& run) {
  std::string name(mode_name(run.mode));
  if (run.checkpoint) name = run.mode == OffloadMode::none ? "checkpoint" : "checkpoint+" + name;
  if (run.mode != OffloadMode::none && run.options.device_target_bytes > 0) name = run.planned ? "auto" : "target";
  return name;
}

// A hash of the parameters' bytes (ranks compare their final parameters).
std::size_t parameters_hash(const std::vector<torch::Tensor>& parameters) {
  std::string bytes;
  for (const auto& p : parameters) {
    const auto host = p.detach().cpu().contiguous();
    bytes.append(static_cast<const char*>(host.data_ptr()), host.nbytes());
  }
  return std::hash<std::string>{}(bytes);
}

// One run's model, manager and optimizer, and its trace.
struct Trainer {
  const Session& session;
  std::shared_ptr<models::CharModel> model;
  std::optional<offload::AnyManager> manager;
  torch::optim::AdamW optimizer;
  MemoryTrace tracer;

  Trainer(const Session& s, const RunSpec& run, std::shared_ptr<models::CharModel> m)
      : session(s),
        model(std::move(m)),
        optimizer(prepare(s, run, *model, manager), torch::optim::AdamWOptions(s.args.lr)),
        tracer(s.device, s.memory) {}

  // The model on the device (rank 0's weights with --ranks > 1), the
  // manager made and told the parameters; the parameters to optimize.
  static std::vector<torch::Tensor> prepare(const Session& s, const RunSpec& run, models::CharModel& model,
                                            std::optional<offload::AnyManager>& manager) {
    if (run.mode != OffloadMode::none) manager.emplace(make_manager(run.mode, s.device, run.options));
    model.to(s.device.device);
    if (s.dp) s.dp->broadcast_parameters(model.parameters());
    if (manager) manager->exclude(model.parameters());
    return model.parameters();
  }

  // Forward (inside a Scope with a manager), backward, gradient averaging
  // and the optimizer step; marks the trace when `tracing`. Returns the loss.
  float step(const torch::Tensor& x, const torch::Tensor& y, bool tracing, RunResult& r) {
    try {
      optimizer.zero_grad();
      torch::Tensor loss;
      if (manager) {
        offload::Scope scope(*manager);
        loss = model->loss(x, y);
      } else {
        loss = model->loss(x, y);
      }
      if (tracing) r.forward_end_ms = tracer.ms_since_start();
      loss.backward();
      if (session.dp) session.dp->average_gradients(model->parameters());
      if (tracing) r.backward_end_ms = tracer.ms_since_start();
      optimizer.step();
      return loss.item<float>();
    } catch (const c10::OutOfMemoryError&) {
      // Stop the trace here, while the model and optimizer still hold
      // their memory (the caller's handler runs after they are gone).
      if (tracing) {
        r.oom_ms = tracer.ms_since_start();
        r.trace = tracer.stop();
      }
      throw;
    }
  }
};

}  // namespace

RunResult train(const Session& session, const RunSpec& run) {
  const Args& args = session.args;
  RunResult r;
  r.name = run_name(run);
  auto tokens = torch::tensor(session.corpus.ids, torch::kLong);
  if (session.dp) tokens = session.dp->shard(tokens);
  torch::manual_seed(static_cast<std::uint64_t>(args.seed));
  std::mt19937_64 rng(static_cast<std::uint64_t>(args.seed));
  const std::int64_t traced = std::min<std::int64_t>(2, args.steps);
  session.memory.reset_peak();
  std::int64_t step = 0;
  std::optional<Trainer> trainer;
  try {
    trainer.emplace(session, run,
                    models::model_kind(args.model)
                        .make(models::ModelShape{.vocab = static_cast<std::int64_t>(session.corpus.vocab.size()),
                                                 .layers = args.layers,
                                                 .width = args.width,
                                                 .heads = args.heads,
                                                 .seq = args.seq,
                                                 .checkpoint = run.checkpoint,
                                                 .planned = run.planned}));
    if (trainer->manager) r.manager = trainer->manager->describe();
    for (step = 1; step <= args.steps; ++step) {
      const auto [x, y] = batch(args, tokens, session.device.device, rng);
      const bool tracing = session.trace && step <= traced;
      if (tracing) {
        trainer->tracer.start();
        r.traced_step = step;
        r.forward_end_ms = r.backward_end_ms = r.step_end_ms = r.oom_ms = -1;
      }
      const auto t0 = Clock::now();
      r.losses.push_back(trainer->step(x, y, tracing, r));
      const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      r.seconds += seconds;
      if (tracing) {
        r.step_end_ms = trainer->tracer.ms_since_start();
        r.trace = trainer->tracer.stop();
      }
      progress(args, r, session.memory, step, seconds, step == args.steps, session.tty);
    }
    if (trainer->manager) r.stats = trainer->manager->stats();
    if (session.dp) r.parameters_hash = parameters_hash(trainer->model->parameters());
  } catch (const c10::OutOfMemoryError& e) {
    if (trainer) trainer->tracer.stop();
    trainer.reset();
    if (session.tty) std::cout << '\n';
    r.oom_step = step;
    r.oom_message = e.what_without_backtrace();
    std::cout << "[" << r.name << "] ran out of device memory at step " << step << " of " << args.steps << "\n";
    release_failed_backward(session.device.device);
  }
  if (trainer) trainer->tracer.stop();
  r.peak_bytes = session.memory.peak();
  return r;
}

Comparison compare(const RunResult& a, const RunResult& b) {
  Comparison c;
  c.common = std::min(a.losses.size(), b.losses.size());
  for (std::size_t i = 0; i < c.common; ++i) {
    if (std::memcmp(&a.losses[i], &b.losses[i], sizeof(float)) != 0) c.bitwise_equal = false;
    c.max_abs_diff = std::max(c.max_abs_diff, std::abs(static_cast<double>(a.losses[i]) - b.losses[i]));
  }
  return c;
}

}  // namespace demo
