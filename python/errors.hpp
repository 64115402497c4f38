// SPDX-License-Identifier: MIT
#pragma once
// The one error path of both extension modules: c10::ValueError leaves as
// Python's ValueError, any other c10::Error as RuntimeError, each with the
// message alone (no C++ backtrace), so Python sees the C++ checks' text.

#include <exception>

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

namespace offload::python {

/// Registers the translation for the module being initialized.
inline void register_error_translator() {
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });
}

}  // namespace offload::python
