// SPDX-License-Identifier: MIT
#pragma once
// Include this instead of <doctest/doctest.h>: c10's logging header defines
// glog-style CHECK macros that would silently replace doctest's. It is
// included (and its macros removed) first, so doctest's definitions win.

#include <c10/util/Logging.h>

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LE
#undef CHECK_LT
#undef CHECK_GE
#undef CHECK_GT

#include <doctest/doctest.h>
