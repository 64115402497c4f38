// SPDX-License-Identifier: MIT
// The one main() of the doctest suites. At the end it prints the line CI
// reads: "N passed, N failed" (test cases).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  return rc;
}
