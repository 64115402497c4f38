// SPDX-License-Identifier: MIT

#include "plot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "../../models/registry.hpp"
#include "demo_config.hpp"  // OFFLOAD_DEMO_VENV_PYTHON, OFFLOAD_DEMO_SOURCE_DIR (examples/meson.build)

extern char** environ;

namespace demo {
namespace {

namespace fs = std::filesystem;

constexpr const char* plot_script_name = "plot_memory.py";

/// The python that renders plots: $OFFLOAD_DEMO_PYTHON, else the project's
/// venv python (its path is compiled in), else python3 from PATH.
std::string plot_python() {
  if (const char* env = std::getenv("OFFLOAD_DEMO_PYTHON"); env != nullptr && *env != '\0') return env;
  if (::access(OFFLOAD_DEMO_VENV_PYTHON, X_OK) == 0) return OFFLOAD_DEMO_VENV_PYTHON;
  return "python3";
}

/// plot_memory.py next to this executable (the build copies it there),
/// else in the source tree; empty when neither exists.
std::string plot_script() {
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  for (const auto& dir : {ec ? fs::path() : exe.parent_path(), fs::path(OFFLOAD_DEMO_SOURCE_DIR)}) {
    if (!dir.empty() && fs::is_regular_file(dir / plot_script_name, ec)) return (dir / plot_script_name).string();
  }
  return {};
}

/// Runs argv (argv[0] looked up in PATH) and returns its exit status, or -1
/// when it could not be started. With `quiet`, its stdout and stderr go to
/// /dev/null.
int spawn(const std::vector<std::string>& argv, bool quiet) {
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (quiet) {
    posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  }
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, cargv[0], &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The shortest text that reads back as exactly `v` ("nan" never occurs:
/// the traces hold finite values).
std::string number(double v) {
  std::array<char, 64> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), v);
  return ec == std::errc() ? std::string(buf.data(), end) : std::string("0");
}

/// PATH with its extension replaced by .csv (PATH.csv when that is PATH).
std::string csv_path_for(const std::string& png) {
  fs::path p(png);
  p.replace_extension(".csv");
  return p.string() == png ? png + ".csv" : p.string();
}

}  // namespace

void check_plot_tool() {
  if (plot_script().empty()) {
    throw UsageError(std::string("--plot: cannot find ") + plot_script_name + " next to the executable or in " +
                     OFFLOAD_DEMO_SOURCE_DIR);
  }
  const auto python = plot_python();
  const int rc = spawn({python, "-c", "import matplotlib"}, /*quiet=*/true);
  if (rc == -1 || rc == 127) {
    throw UsageError("--plot: cannot run '" + python + "'; set OFFLOAD_DEMO_PYTHON to a python3 with matplotlib");
  }
  if (rc != 0) {
    throw UsageError("--plot: matplotlib is not installed for '" + python +
                     "'; install it (scripts/setup, or pip install matplotlib) or set OFFLOAD_DEMO_PYTHON");
  }
}

std::string write_plot(const std::string& png, const Args& args, const DeviceChoice& device,
                       const std::vector<const RunResult*>& runs) {
  const auto csv = csv_path_for(png);
  {
    std::ofstream out(csv, std::ios::trunc);
    out << "run,event,t_ms,mib\n";
    for (const auto* r : runs) {
      const std::string label = r->name == "none"         ? "without offloading"
                                : r->name == "checkpoint" ? "checkpoint, without offloading"
                                                          : "with offloading (" + r->name + ")";
      const std::string run = "\"" + label + ", step " + std::to_string(r->traced_step) +
                              (r->oom_step && *r->oom_step == r->traced_step ? " (ran out of memory)" : "") + "\"";
      for (const auto& s : r->trace) {
        out << run << ",sample," << number(s.t_ms) << "," << number(static_cast<double>(s.bytes) / (1024.0 * 1024.0))
            << "\n";
      }
      const std::pair<const char*, double> marks[] = {{"forward done", r->forward_end_ms},
                                                      {"backward done", r->backward_end_ms},
                                                      {"optimizer done", r->step_end_ms},
                                                      {"out of memory", r->oom_ms}};
      for (const auto& [event, ms] : marks) {
        if (ms >= 0) out << run << "," << event << "," << number(ms) << ",\n";
      }
    }
    out.close();
    if (!out) throw std::runtime_error("--plot: cannot write '" + csv + "': " + std::strerror(errno));
  }
  std::ostringstream title;
  title << "Device memory over one training step: " << models::model_kind(args.model).title << ", layers "
        << args.layers << ", width " << args.width << ", batch " << args.batch << " x seq " << args.seq << ", on "
        << device.label;
  const double cap_mib = static_cast<double>(args.device_memory_cap) / (1024.0 * 1024.0);
  const auto python = plot_python();
  const int rc = spawn({python, plot_script(), csv, png, title.str(), number(cap_mib)}, false);
  if (rc != 0) {
    throw std::runtime_error("--plot: rendering '" + png + "' with " + python + " failed (exit status " +
                             std::to_string(rc) + "); the samples are in '" + csv + "'");
  }
  return csv;
}

}  // namespace demo
