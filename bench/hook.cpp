// SPDX-License-Identifier: MIT
// offload-bench hook: host CPU ns per saved tensor of the C++ hooks (pack +
// unpack), end to end through the autograd engine and the hooks object
// alone, against Python's identity saved_tensors_hooks
// (bench/hook_overhead.py). Narrow ATen headers only.

#include <algorithm>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/ones.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>

#include <offload/offload.hpp>
#include <offload/sim.hpp>

#include "../cli/stats_json.hpp"
#include "bench.hpp"

namespace bench {
namespace {

const c10::Device kSim(c10::DeviceType::PrivateUse1, 0);

// One run: leaf [16] float -> x = leaf * 1.0 (saves nothing) -> 256 x
// x = x.sin() (each saves its input: one saved tensor of 64 bytes) ->
// x.sum().backward() (sum saves nothing). bench/hook_overhead.py runs the
// same ops and shapes in Python.
constexpr int kOps = 256;
constexpr std::int64_t kNumel = 16;

void chain(const at::Tensor& leaf) {
  at::Tensor x = leaf.mul(1.0);
  for (int i = 0; i < kOps; ++i) x = x.sin();
  x.sum().backward();
  leaf.mutable_grad() = at::Tensor();
}

struct HookCase {
  std::string key;   // JSON name
  std::string what;  // what the row measures
  c10::Device device;
  std::shared_ptr<offload::ManagerInterface> source;
  int rounds_divisor;  // slow cases run fewer rounds
};

template <class Sync>
std::shared_ptr<offload::ManagerInterface> sim_manager(std::int64_t min_offload_bytes) {
  offload::AnyManager manager = offload::Manager<offload::device::Sim, offload::storage::PinnedHost, Sync>(
      offload::Options{.min_offload_bytes = min_offload_bytes});
  return offload::interface_of(manager);
}

/// The C++ twin of Python's identity hooks: what the engine's hook path
/// costs with hooks that only keep the tensor (no manager at all).
class IdentitySource final : public offload::ManagerInterface {
  struct Hooks final : torch::autograd::SavedVariableHooks {
    explicit Hooks(IdentitySource* src) : source(src) {}
    void call_pack_hook(const at::Tensor& t) override {
      ++source->seen;
      saved = t;
    }
    at::Tensor call_unpack_hook() override { return saved; }
    IdentitySource* source;
    at::Tensor saved;
  };

 public:
  std::unique_ptr<torch::autograd::SavedVariableHooks> make_hooks() override { return std::make_unique<Hooks>(this); }
  std::string describe() const override { return "identity hooks"; }
  offload::Stats stats() const override {
    offload::Stats s;
    s.tensors_seen = seen;
    return s;
  }
  void reset_stats() override { seen = 0; }
  void exclude(at::TensorList /*tensors*/) override {}
  const offload::Options& options() const noexcept override { return options_; }

  std::int64_t seen = 0;  // only the forward thread packs

 private:
  offload::Options options_;
};

std::vector<HookCase> hook_cases() {
  const c10::Device cpu(c10::DeviceType::CPU);
  return {
      {"cpu_identity",
       "C++ identity hooks on CPU tensors (no manager): the engine's own hook path, the C++ twin of the Python row",
       cpu, std::make_shared<IdentitySource>(), 1},
      {"a_cpu_passthrough",
       "(a) CPU tensors through a Manager<Sim, PinnedHost, Blocking> (not its device: passed through). "
       "Pure bookkeeping on the same tensors as the Python row",
       cpu, sim_manager<offload::sync::Blocking>(1024), 1},
      {"a_sim_below_min", "(a') sim tensors under min_offload_bytes (1 MiB): passed through after the size check", kSim,
       sim_manager<offload::sync::Blocking>(std::int64_t{1} << 20), 1},
      {"b_sim_blocking",
       "(b) sim tensors offloaded with sync::Blocking, free link: pinned host alloc + D2H copy at pack, "
       "device alloc + H2D copy at unpack",
       kSim, sim_manager<offload::sync::Blocking>(0), 1},
      {"b_sim_streamed", "(b') as (b) with sync::Streamed (side stream, events, stash, prefetch), free link", kSim,
       sim_manager<offload::sync::Streamed>(0), 6},
  };
}

/// CPU ns per saved tensor of the hooks alone, engine not involved: one
/// hooks object made, packed with `t` (under no-grad, as the engine does),
/// unpacked and destroyed per iteration. Median of `reps` batches.
Summary direct_ns(offload::ManagerInterface& source, const at::Tensor& t, int iterations, int reps) {
  std::vector<double> per;
  for (int r = 0; r < reps + 1; ++r) {
    const double ns = cpu_ns([&] {
      for (int i = 0; i < iterations; ++i) {
        auto hooks = source.make_hooks();
        {
          const at::NoGradGuard no_grad;
          hooks->call_pack_hook(t);
        }
        auto back = hooks->call_unpack_hook();
      }
    });
    if (r > 0) per.push_back(ns / iterations);
  }
  offload::sim::synchronize(0);
  return summarize(per);
}

// Python's numbers, from the file bench/hook_overhead.py wrote (flat keys).
std::optional<double> read_number(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  const auto j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains(key) || !j.at(key).is_number()) return std::nullopt;
  return j.at(key).get<double>();
}

/// What bench/hook_overhead.py measured (absent: no --python file, or no such key).
struct PythonNumbers {
  explicit PythonNumbers(const std::string& file)
      : ns(read_number(file, "python_ns_per_tensor")),
        q1(read_number(file, "python_ns_per_tensor_q1")),
        q3(read_number(file, "python_ns_per_tensor_q3")),
        base(read_number(file, "python_baseline_ns_per_op")) {}
  std::optional<double> ns, q1, q3, base;
};

void print_intro(int rounds, int warmup) {
  std::cout << "## Hook overhead per saved tensor (pack + unpack)\n\n"
            << "End to end: leaf[" << kNumel << "] float -> *1.0 -> " << kOps
            << " x sin() (one 64-byte saved tensor each) -> sum().backward(). Per round, the same run "
            << "with and without the hooks; ns per tensor = (t_hooks - t_none) / " << kOps
            << ", t = process CPU time (all threads; robust to other processes on the cores). " << rounds
            << " rounds after " << warmup << " warm-up rounds, 1 intra-op thread. Direct: the hooks object "
            << "alone (make_hooks + pack + unpack + destroy in a loop, no engine), a tensor of the same shape "
            << "saved as an op's input (the case of every sin() above; the target's figure) and as an op's "
            << "output.\n\n";
}

/// A direct-cost column: median (q1..q3) of the summary under `key`.
Column direct_column(const std::string& title, const std::string& key) {
  return {title, "", [key](const Json& row) {
            if (!has(row, key)) return std::string();
            const auto& d = row.at(key);
            return fixed(number(d, "median"), 0) + " (" + fixed(number(d, "q1"), 0) + ".." + fixed(number(d, "q3"), 0) +
                   ")";
          }};
}

std::vector<Column> hook_columns() {
  return {
      text_column("case", "case"),
      fixed_column("end-to-end ns/tensor (median)", "", "cpp_ns_per_tensor", 0),
      iqr_column("IQR", "", "cpp_ns_per_tensor_spread", 0),
      direct_column("direct ns/tensor (saved input)", "direct_ns_per_tensor"),
      direct_column("direct, saved output", "direct_output_ns_per_tensor"),
      fixed_column("no-hooks ns/op", "", "baseline_ns_per_op", 0),
      {"Python / this", "",
       [](const Json& row) {
         if (has(row, "ratio_text")) return row.at("ratio_text").get<std::string>();
         return has(row, "ratio") ? fixed(number(row, "ratio"), 2) + "x" : std::string("n/a");
       }},
  };
}

/// Per round, ns per saved tensor with the hooks less without (CPU and
/// wall time), and ns per op without.
struct EndToEnd {
  std::vector<double> per_tensor, base_per_op, wall_per_tensor;
};

/// `warmup` rounds, then `n_rounds` rounds of the run with and without `c`'s
/// hooks, alternating which goes first.
EndToEnd time_end_to_end(const HookCase& c, const at::Tensor& leaf, int warmup, int n_rounds) {
  auto hooked = [&] {
    offload::Scope scope(offload::any_manager_of(c.source));
    at::Tensor x = leaf.mul(1.0);
    for (int i = 0; i < kOps; ++i) x = x.sin();
    scope.close();
    x.sum().backward();
    leaf.mutable_grad() = at::Tensor();
  };
  auto plain = [&] { chain(leaf); };
  for (int i = 0; i < warmup; ++i) {
    plain();
    hooked();
  }
  c.source->reset_stats();
  EndToEnd e;
  for (int r = 0; r < n_rounds; ++r) {
    double t_hook = 0, t_none = 0, w_hook = 0, w_none = 0;
    if (r % 2 == 0) {
      w_none = time_ns([&] { t_none = cpu_ns(plain); });
      w_hook = time_ns([&] { t_hook = cpu_ns(hooked); });
    } else {
      w_hook = time_ns([&] { t_hook = cpu_ns(hooked); });
      w_none = time_ns([&] { t_none = cpu_ns(plain); });
    }
    e.per_tensor.push_back((t_hook - t_none) / kOps);
    e.base_per_op.push_back(t_none / kOps);
    e.wall_per_tensor.push_back((w_hook - w_none) / kOps);
  }
  offload::sim::synchronize(0);
  return e;
}

/// The row of `c`, end to end and direct; nullopt (after saying why on
/// stderr) when the hooks did not see every saved tensor.
std::optional<Json> case_row(const HookCase& c, const Args& args, int warmup, int rounds,
                             const std::optional<double>& python_ns) {
  auto leaf = at::ones({kNumel}, at::TensorOptions().dtype(at::kFloat).device(c.device)).requires_grad_();
  const int n_rounds = std::max(10, rounds / c.rounds_divisor);
  const EndToEnd e = time_end_to_end(c, leaf, warmup, n_rounds);
  const auto stats = c.source->stats();
  if (stats.tensors_seen != static_cast<std::int64_t>(n_rounds) * kOps) {
    std::cerr << "offload-bench hook: " << c.key << " saw " << stats.tensors_seen << " tensors, expected "
              << n_rounds * kOps << "\n";
    return std::nullopt;
  }
  // Direct: a tensor with a grad_fn, like those the engine hands over. A
  // saved input (as every sin() above saves), whose grad_fn is not the
  // newest node; then a saved output (its grad_fn the newest node), which a
  // tensor passed through is held without (detail::KeptTensor).
  const int iterations = c.rounds_divisor > 1 ? 500 : (args.quick ? 2000 : 20000);
  const int reps = args.quick ? 5 : 15;
  const at::Tensor input = leaf.mul(1.0).sin();
  const at::Tensor consumer = input.sin();
  const auto direct = direct_ns(*c.source, input, iterations, reps);
  const at::Tensor output = leaf.mul(1.0).sin();
  const auto direct_output = direct_ns(*c.source, output, iterations, reps);

  const auto s = summarize(e.per_tensor);
  const auto base = summarize(e.base_per_op);
  std::optional<double> ratio;
  if (python_ns && s.median > 0) ratio = *python_ns / s.median;
  return Json::object({
      {"case", Json(c.key)},
      {"what", Json(c.what)},
      {"cpp_ns_per_tensor", Json(s.median)},
      {"cpp_ns_per_tensor_spread", summary_json(s)},
      {"cpp_wall_ns_per_tensor", summary_json(summarize(e.wall_per_tensor))},
      {"direct_ns_per_tensor", summary_json(direct)},
      {"direct_output_ns_per_tensor", summary_json(direct_output)},
      {"baseline_ns_per_op", Json(base.median)},
      {"python_ns_per_tensor", python_ns ? Json(*python_ns) : Json(nullptr)},
      {"ratio", ratio ? Json(*ratio) : Json(nullptr)},
      {"rounds", Json(n_rounds)},
      {"tensors_seen_per_run", Json(stats.tensors_seen / n_rounds)},
      {"tensors_offloaded_per_run", Json(stats.tensors_offloaded / n_rounds)},
      {"stats", offload_json::stats(stats)},
  });
}

/// The table: the rows, and the Python floor as a row of the table only
/// (its numbers are the Python run's file, and this file's
/// python_ns_per_tensor).
void print_table(const std::vector<Json>& rows, const PythonNumbers& python) {
  std::vector<Json> shown = rows;
  if (python.ns) {
    Json floor = Json::object({{"case", Json("Python identity hooks (CPU)")},
                               {"cpp_ns_per_tensor", Json(*python.ns)},
                               {"baseline_ns_per_op", python.base ? Json(*python.base) : Json(nullptr)},
                               {"ratio_text", Json("1.00x (the floor)")}});
    if (python.q1 && python.q3)
      floor["cpp_ns_per_tensor_spread"] = Json::object({{"q1", *python.q1}, {"q3", *python.q3}});
    shown.push_back(floor);
  }
  print_rows(hook_columns(), shown);
}

}  // namespace

int run_hook(const Args& args) {
  at::set_num_threads(1);  // tiny tensors; the Python side does the same
  free_link();             // the hooks' host cost, not the link's
  const int warmup = args.quick ? 5 : 20;
  const int rounds = static_cast<int>(args.get_int("rounds", args.quick ? 100 : 600));
  const PythonNumbers python(args.get("python", ""));

  print_intro(rounds, warmup);
  std::vector<Json> rows;
  double headline_cpp = 0, headline_direct = 0;  // of case a_cpu_passthrough
  for (const auto& c : hook_cases()) {
    auto row = case_row(c, args, warmup, rounds, python.ns);
    if (!row) return 1;
    if (c.key == "a_cpu_passthrough") {
      headline_cpp = number(*row, "cpp_ns_per_tensor");
      headline_direct = number(row->at("direct_ns_per_tensor"), "median");
    }
    rows.push_back(std::move(*row));
  }
  print_table(rows, python);
  std::optional<double> headline_ratio, direct_ratio;
  if (python.ns && headline_cpp > 0) headline_ratio = *python.ns / headline_cpp;
  if (python.ns && headline_direct > 0) direct_ratio = *python.ns / headline_direct;
  auto verdict = [](const std::optional<double>& r) {
    return r ? (*r >= 10 ? "met (" : "MISSED (") + fixed(*r, 1) + "x)" : std::string("no Python number");
  };
  std::cout << "\nTarget: C++ (a) >= 10x lower than the Python floor. End to end (a_cpu_passthrough, engine "
            << "hook path included): " << verdict(headline_ratio)
            << "; the manager's hooks alone (direct): " << verdict(direct_ratio) << "\n";

  auto fields = header(args, torch_version());
  fields.push_back({"ops_per_run", Json(kOps)});
  fields.push_back({"tensor", Json("float32[16] (64 bytes)")});
  fields.push_back({"clock", Json("process CPU time (CLOCK_PROCESS_CPUTIME_ID / time.process_time_ns)")});
  fields.push_back({"rounds", Json(rounds)});
  fields.push_back({"cpp_ns_per_tensor", Json(headline_cpp)});
  fields.push_back({"cpp_direct_ns_per_tensor", Json(headline_direct)});
  fields.push_back({"python_ns_per_tensor", python.ns ? Json(*python.ns) : Json(nullptr)});
  fields.push_back({"ratio", headline_ratio ? Json(*headline_ratio) : Json(nullptr)});
  fields.push_back({"ratio_direct", direct_ratio ? Json(*direct_ratio) : Json(nullptr)});
  fields.push_back({"target", Json("python_ns_per_tensor >= 10 * cpp_ns_per_tensor (case a_cpu_passthrough)")});
  fields.push_back({"target_met", Json(headline_ratio && *headline_ratio >= 10)});
  fields.push_back({"cases", Json(rows)});
  write_result(args, "hook_overhead.json", fields);
  return 0;
}

}  // namespace bench
