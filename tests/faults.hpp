// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Fault injection for tests of the library and of the `sim` substrate.
/// A correct program never arms a fault. Arming one makes the next copy
/// that can exhibit it break a synchronisation rule on purpose, so a test
/// can prove that the substrate turns that bug into wrong numbers.

namespace offload::testing {

/// The synchronisation mistakes the library can make on purpose.
enum class Fault {
  none,
  /// Skip one wait: a host-to-device copy in backward is issued on a side
  /// stream and the compute stream does not wait for it.
  skip_wait,
  /// Free one buffer early: a device-to-host copy in forward is issued on a
  /// side stream and the device memory is released before it has run.
  free_early,
};

/// Arms `fault` for the next `count` copies that can exhibit it (count >= 1).
/// Thread-safe. Throws c10::ValueError for count < 1.
void arm_fault(Fault fault, int count = 1);

/// Disarms every fault. Thread-safe.
void disarm_faults() noexcept;

/// Consumes one armed `fault`; true when the caller must exhibit it.
/// Thread-safe; lock-free when nothing is armed.
bool take_fault(Fault fault) noexcept;

/// How many armed faults have fired since the process started.
int faults_fired() noexcept;

}  // namespace offload::testing
