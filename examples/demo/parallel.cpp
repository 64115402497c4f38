// SPDX-License-Identifier: MIT
// offload-demo's data-parallel side (see parallel.hpp): rendezvous, the
// ranks it starts, the process group and the gradient averaging.

#include "parallel.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/Logging.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#if OFFLOAD_DEMO_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <offload/sim_collectives.hpp>

extern char** environ;

namespace demo {
namespace {

constexpr std::int64_t bucket_bytes = 1 << 20;

/// A socket bound to 127.0.0.1 on a free port, listening (close-on-exec).
int listen_on_loopback(std::uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(fd >= 0, "socket: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd, 64) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    TORCH_CHECK(false, "binding 127.0.0.1: ", why);
  }
  port = ntohs(addr.sin_port);
  return fd;
}

/// Silences c10's log (c10d logs every failed connection attempt, with a
/// backtrace) while alive; the demo reports a failed rendezvous itself.
class QuietLog {
 public:
  QuietLog() : level_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = 3; }  // fatal only
  ~QuietLog() { FLAGS_caffe2_log_level = level_; }
  QuietLog(const QuietLog&) = delete;
  QuietLog& operator=(const QuietLog&) = delete;

 private:
  int level_;
};

/// "HOST:PORT" split; UsageError naming --rendezvous otherwise.
std::pair<std::string, std::uint16_t> split_address(const std::string& address) {
  const auto colon = address.rfind(':');
  const auto bad = [&] { return UsageError("--rendezvous: expected HOST:PORT, got '" + address + "'"); };
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) throw bad();
  const std::string digits = address.substr(colon + 1);
  if (digits.size() > 5 || digits.find_first_not_of("0123456789") != std::string::npos) throw bad();
  const long port = std::stol(digits);
  if (port < 1 || port > 65535) throw bad();
  return {address.substr(0, colon), static_cast<std::uint16_t>(port)};
}

c10::intrusive_ptr<c10d::ProcessGroup> make_group(const DeviceChoice& device, c10::intrusive_ptr<c10d::Store> store,
                                                  int rank, int size, std::chrono::milliseconds timeout,
                                                  std::string& backend) {
  if (device.sim) {
    backend = offload::sim::collective_backend_name;
    return offload::sim::make_process_group(std::move(store), rank, size, timeout);
  }
#if OFFLOAD_DEMO_NCCL
  if (device.device.is_cuda()) {
    backend = "nccl";
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout;
    auto nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
    auto group = c10::make_intrusive<c10d::ProcessGroup>(std::move(store), rank, size);
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
    return group;
  }
#endif
  throw UsageError("--ranks: no collective backend for " + device.label +
                   " in this build (sim: offload_sim; cuda: nccl, when built with NCCL)");
}

}  // namespace

std::unique_ptr<DataParallel> DataParallel::join(const Args& args, DeviceChoice& device, char** argv) {
  if (args.ranks == 1) return nullptr;
  std::unique_ptr<DataParallel> dp(new DataParallel);
  dp->rank_ = static_cast<int>(args.rank);
  dp->size_ = static_cast<int>(args.ranks);
  dp->timeout_ = std::chrono::milliseconds(args.rendezvous_timeout * 1000);
  const std::string seconds = std::to_string(args.rendezvous_timeout) + " s";
  c10d::TCPStoreOptions options;
  options.numWorkers = static_cast<std::size_t>(dp->size_);
  options.waitWorkers = false;
  options.timeout = dp->timeout_;
  if (!args.rendezvous) {
    std::uint16_t port = 0;
    const int fd = listen_on_loopback(port);
    dp->address_ = "127.0.0.1:" + std::to_string(port);
    options.port = port;
    options.isServer = true;
    options.masterListenFd = fd;
    dp->store_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
    std::vector<std::string> args_of_rank;
    for (char** a = argv; *a != nullptr; ++a) args_of_rank.emplace_back(*a);
    args_of_rank.insert(args_of_rank.end(), {"--rendezvous", dp->address_, "--rank", ""});
    posix_spawn_file_actions_t quiet;
    posix_spawn_file_actions_init(&quiet);
    posix_spawn_file_actions_addopen(&quiet, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    for (int r = 1; r < dp->size_; ++r) {
      args_of_rank.back() = std::to_string(r);
      std::vector<char*> child_argv;
      for (auto& a : args_of_rank) child_argv.push_back(a.data());
      child_argv.push_back(nullptr);
      pid_t pid = 0;
      const int rc = posix_spawn(&pid, "/proc/self/exe", &quiet, nullptr, child_argv.data(), environ);
      TORCH_CHECK(rc == 0, "starting rank ", r, ": ", std::strerror(rc));
      dp->children_.push_back(pid);
    }
    posix_spawn_file_actions_destroy(&quiet);
  } else {
    dp->address_ = *args.rendezvous;
    const auto [host, port] = split_address(dp->address_);
    options.port = port;
    // A started rank ends with the rank that started it.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    try {
      const QuietLog quiet;
      dp->store_ = c10::make_intrusive<c10d::TCPStore>(host, options);
    } catch (const c10::Error&) {
      throw UsageError("--rendezvous " + dp->address_ + ": rank " + std::to_string(dp->rank_) +
                       " could not reach rank 0's store within " + seconds);
    }
  }
  // Everyone arrives: each rank sets its key and waits for all of them.
  std::vector<std::string> keys;
  for (int r = 0; r < dp->size_; ++r) keys.push_back("demo/arrived/" + std::to_string(r));
  dp->store_->set(keys[dp->rank_], std::vector<std::uint8_t>{1});
  try {
    dp->store_->wait(keys, dp->timeout_);
  } catch (const c10::Error&) {
    throw UsageError("--rendezvous " + dp->address_ + ": not all " + std::to_string(dp->size_) +
                     " ranks arrived within " + seconds);
  }
  if (device.device.is_cuda() && !device.device.has_index()) {
    device.device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(dp->rank_));
    device.label = device.device.str();
  }
  dp->group_ = make_group(device, c10::make_intrusive<c10d::PrefixStore>("group", dp->store_), dp->rank_, dp->size_,
                          dp->timeout_, dp->backend_);
  return dp;
}

DataParallel::~DataParallel() {
  for (const int pid : children_) ::kill(pid, SIGTERM);
  wait_for_ranks();
}

at::Tensor DataParallel::shard(const at::Tensor& tokens) const {
  const auto part = tokens.size(0) / size_;
  return tokens.narrow(0, part * rank_, part);
}

void DataParallel::broadcast_parameters(const std::vector<at::Tensor>& parameters) const {
  torch::NoGradGuard no_grad;
  for (const auto& p : parameters) {
    std::vector<at::Tensor> one{p.detach()};
    group_->broadcast(one, c10d::BroadcastOptions{.rootRank = 0})->wait();
  }
}

void DataParallel::average_gradients(const std::vector<at::Tensor>& parameters) const {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> bucket;
  std::int64_t bytes = 0;
  const auto flush = [&] {
    if (bucket.empty()) return;
    std::vector<at::Tensor> flat_views;
    for (const auto& g : bucket) flat_views.push_back(g.reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flat_views)};
    group_->allreduce(flat, c10d::AllreduceOptions{.reduceOp = c10d::ReduceOp::SUM})->wait();
    flat[0].div_(static_cast<double>(size_));
    std::int64_t at = 0;
    for (auto& g : bucket) {
      g.copy_(flat[0].narrow(0, at, g.numel()).view(g.sizes()));
      at += g.numel();
    }
    bucket.clear();
    bytes = 0;
  };
  for (const auto& p : parameters) {
    const auto& g = p.grad();
    TORCH_CHECK(g.defined(), "offload-demo: a parameter has no gradient after backward");
    bucket.push_back(g);
    bytes += static_cast<std::int64_t>(g.nbytes());
    if (bytes >= bucket_bytes) flush();
  }
  flush();
}

std::vector<std::string> DataParallel::gather(const std::string& key, const std::string& text) const {
  const std::string prefix = "demo/" + key + "/";
  store_->set(prefix + std::to_string(rank_), std::vector<std::uint8_t>(text.begin(), text.end()));
  std::vector<std::string> out;
  if (rank_ != 0) return out;
  for (int r = 0; r < size_; ++r) {
    const auto bytes = store_->get(prefix + std::to_string(r));
    out.emplace_back(bytes.begin(), bytes.end());
  }
  return out;
}

bool DataParallel::wait_for_ranks() {
  bool ok = true;
  for (const int pid : children_) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  children_.clear();
  return ok;
}

}  // namespace demo
