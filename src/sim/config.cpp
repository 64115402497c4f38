// SPDX-License-Identifier: MIT
//
// The sim's Config: its checks (install() and the setters validate with
// them) and the knobs that may change after install().

#include "checker.hpp"
#include "internal.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <sstream>
#include <string>

namespace offload::sim {
namespace detail {
namespace {

bool valid_backend_name(const std::string& name) {
  static const std::array<const char*, 24> in_tree = {
      "cpu", "cuda", "ipu",    "xpu", "mkldnn", "opengl", "opencl", "ideep",         "hip",   "ve",  "fpga",  "maia",
      "xla", "lazy", "vulkan", "mps", "meta",   "hpu",    "mtia",   "privateuseone", "msnpu", "ort", "metal", "mkl"};
  if (name.empty() || name.size() > 32 || name[0] < 'a' || name[0] > 'z') {
    return false;
  }
  for (char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
    if (!ok) {
      return false;
    }
  }
  return std::none_of(in_tree.begin(), in_tree.end(), [&](const char* t) { return name == t; });
}

}  // namespace

void check_latency(std::int64_t us, const char* where) {
  TORCH_CHECK_VALUE(us >= 0 && us <= kMaxCopyLatencyUs, where, ": copy_latency_us must be in [0, ", kMaxCopyLatencyUs,
                    "], got ", us);
}

void check_bandwidth(double gbps, const char* where) {
  // Written so that NaN fails too.
  TORCH_CHECK_VALUE(gbps > 0.0 && gbps <= kMaxCopyBandwidthGbps, where, ": copy_bandwidth_gbps must be in (0, ",
                    kMaxCopyBandwidthGbps, "], got ", gbps);
}

void check_pinned_alloc(std::int64_t us, const char* where) {
  TORCH_CHECK_VALUE(us >= 0 && us <= kMaxPinnedAllocUs, where, ": pinned_alloc_us must be in [0, ", kMaxPinnedAllocUs,
                    "], got ", us);
}

void check_capacity(std::int64_t bytes, const char* where) {
  TORCH_CHECK_VALUE(bytes >= 0, where, ": capacity_bytes must be >= 0 (0 = unlimited), got ", bytes);
}

void validate(const Config& c) {
  constexpr const char* where = "offload::sim::Config";
  TORCH_CHECK_VALUE(valid_backend_name(c.backend_name), where,
                    ": backend_name must be 1 to 32 characters from [a-z0-9_], start with a letter "
                    "and not name an in-tree device type, got '",
                    c.backend_name, "'");
  TORCH_CHECK_VALUE(c.num_devices >= 1 && c.num_devices <= kMaxDevices, where, ": num_devices must be in [1, ",
                    kMaxDevices, "], got ", c.num_devices);
  check_capacity(c.capacity_bytes, where);
  check_latency(c.copy_latency_us, where);
  check_bandwidth(c.copy_bandwidth_gbps, where);
  check_pinned_alloc(c.pinned_alloc_us, where);
}

std::string differences(const Config& have, const Config& want) {
  std::ostringstream out;
  const char* sep = "";
  const auto field = [&](const char* name, const auto& a, const auto& b) {
    if (!(a == b)) {
      out << sep << name << ": installed " << a << ", requested " << b;
      sep = "; ";
    }
  };
  field("backend_name", "'" + have.backend_name + "'", "'" + want.backend_name + "'");
  field("num_devices", have.num_devices, want.num_devices);
  field("capacity_bytes", have.capacity_bytes, want.capacity_bytes);
  field("copy_latency_us", have.copy_latency_us, want.copy_latency_us);
  field("copy_bandwidth_gbps", have.copy_bandwidth_gbps, want.copy_bandwidth_gbps);
  field("poison_freed", have.poison_freed, want.poison_freed);
  field("host_power_of_two", have.host_power_of_two, want.host_power_of_two);
  field("pinned_alloc_us", have.pinned_alloc_us, want.pinned_alloc_us);
  field("check_streams", have.check_streams, want.check_streams);
  return out.str();
}

}  // namespace detail

Config config() {
  auto& rt = detail::runtime();
  Config out = rt.installed;
  out.copy_latency_us = rt.copy_latency_us.load();
  out.copy_bandwidth_gbps = rt.copy_bandwidth_gbps.load();
  out.poison_freed = rt.poison.load();
  out.capacity_bytes = detail::device_capacity();
  out.host_power_of_two = rt.host_power_of_two.load();
  out.pinned_alloc_us = rt.pinned_alloc_us.load();
  out.check_streams = detail::check::on();
  return out;
}

void set_copy_latency_us(std::int64_t us) {
  detail::check_latency(us, "offload::sim::set_copy_latency_us");
  detail::runtime().copy_latency_us.store(us);
}

void set_copy_bandwidth_gbps(double gbps) {
  detail::check_bandwidth(gbps, "offload::sim::set_copy_bandwidth_gbps");
  detail::runtime().copy_bandwidth_gbps.store(gbps);
}

void set_poison_freed(bool on) { detail::runtime().poison.store(on); }

void set_host_power_of_two(bool on) { detail::runtime().host_power_of_two.store(on); }

void set_pinned_alloc_us(std::int64_t us) {
  detail::check_pinned_alloc(us, "offload::sim::set_pinned_alloc_us");
  detail::runtime().pinned_alloc_us.store(us);
}

void set_check_streams(bool on) {
  (void)detail::runtime();
  detail::check::set_on(on);
}

void set_capacity_bytes(std::int64_t bytes) {
  detail::check_capacity(bytes, "offload::sim::set_capacity_bytes");
  (void)detail::runtime();
  detail::set_device_capacity(bytes);
}

ScopedKnobs::ScopedKnobs() {
  const auto c = config();
  copy_latency_us_ = c.copy_latency_us;
  copy_bandwidth_gbps_ = c.copy_bandwidth_gbps;
  capacity_bytes_ = c.capacity_bytes;
  poison_freed_ = c.poison_freed;
  host_power_of_two_ = c.host_power_of_two;
  pinned_alloc_us_ = c.pinned_alloc_us;
  check_streams_ = c.check_streams;
}

ScopedKnobs::~ScopedKnobs() {
  auto* rt = detail::g_runtime.load();
  rt->copy_latency_us.store(copy_latency_us_);
  rt->copy_bandwidth_gbps.store(copy_bandwidth_gbps_);
  rt->poison.store(poison_freed_);
  rt->host_power_of_two.store(host_power_of_two_);
  rt->pinned_alloc_us.store(pinned_alloc_us_);
  detail::set_device_capacity(capacity_bytes_);
  detail::check::set_on(check_streams_);
}

}  // namespace offload::sim
