// SPDX-License-Identifier: MIT
// doctest main for scripts/dev-sim-build only; not part of the meson build.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
