// SPDX-License-Identifier: MIT
#pragma once
// offload-demo's command line: every flag, its default and accepted range
// (CLI11 generates --help from them), parsed into Args.

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <offload/options.hpp>

namespace demo {

inline constexpr std::string_view program = "offload-demo";
inline constexpr const char* default_data_dir = "/usr/share/common-licenses";

/// Bad command-line input: main() prints "offload-demo: WHAT" as one line on
/// stderr and exits with status 2, before any training.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class OffloadMode { none, blocking, streamed, compare };

/// "none", "blocking", "streamed" or "compare".
std::string_view mode_name(OffloadMode mode);

/// Everything the command line sets. Defaults are the demo's defaults; they
/// train both runs in well under 3 minutes on 2 CPU cores on `sim`.
struct Args {
  std::string model = "gpt";  ///< a name of models::model_kinds()
  std::int64_t layers = 0;    ///< after parsing: --layers, else the model's default
  std::int64_t width = 128;
  std::int64_t heads = 4;  ///< gpt only
  std::int64_t seq = 128;
  std::int64_t batch = 8;
  std::int64_t steps = 50;
  double lr = 3e-3;
  std::int64_t seed = 0;
  OffloadMode offload = OffloadMode::compare;
  bool checkpoint = false;  ///< also the runs with each block checkpointed (alone and with offloading)
  std::string device = "auto";
  std::int64_t device_memory_cap = 0;  ///< bytes; 0 = no cap
  std::optional<double> link_gbps;  ///< sim: the host link's bandwidth in GB/s (offload::sim::set_copy_bandwidth_gbps)
  std::optional<std::string> data;  ///< --data FILE; default: the license texts
  std::optional<std::string> summary_json;
  std::optional<std::string> plot;
  std::int64_t min_offload_bytes = offload::Options{}.min_offload_bytes;
  std::int64_t max_fwd_stash = offload::Options{}.max_fwd_stash;
  std::int64_t prefetch_depth = offload::Options{}.prefetch_depth;
  std::int64_t prefetch_bytes = offload::Options{}.prefetch_bytes;
  std::int64_t host_budget_bytes = offload::Options{}.host_budget_bytes;
  std::int64_t device_target = 0;         ///< bytes; > 0: one more offloaded run, with Options::device_target_bytes
  std::string plan = "off";               ///< "auto": one more run under the target, every block planned
  std::int64_t log_every = 0;             ///< 0 = about ten lines per run when stdout is not a terminal
  std::int64_t ranks = 1;                 ///< data-parallel processes (see parallel.hpp)
  std::int64_t rank = 0;                  ///< this process's rank; > 0 only with --rendezvous
  std::optional<std::string> rendezvous;  ///< HOST:PORT of rank 0's store (the ranks rank 0 starts)
  std::int64_t rendezvous_timeout = 60;   ///< seconds
};

/// Parses argv and checks every value and the combinations that need
/// neither the data nor the device. Returns std::nullopt when it printed
/// --help. Throws UsageError naming the flag.
std::optional<Args> parse_args(int argc, char** argv);

}  // namespace demo
