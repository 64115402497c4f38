// SPDX-License-Identifier: MIT
#pragma once
// The one error path of both extension modules: c10::ValueError leaves as
// Python's ValueError, any other c10::Error as RuntimeError, each with the
// message alone (no C++ backtrace), so Python sees the C++ checks' text.

#include <exception>
#include <new>

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

namespace offload::python {

/// Sets the Python error for a C++ exception (the GIL held): c10::ValueError
/// -> ValueError, other c10::Error -> RuntimeError (message without the
/// backtrace), std::bad_alloc -> MemoryError, other std::exception ->
/// RuntimeError. Rethrows anything else.
inline void set_error(std::exception_ptr p) {
  try {
    std::rethrow_exception(p);
  } catch (const c10::ValueError& e) {
    PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
  } catch (const c10::Error& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

/// Registers the translation for the module being initialized (c10 errors
/// as set_error; every other exception goes on to pybind11's own).
inline void register_error_translator() {
  pybind11::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::Error&) {
      set_error(std::current_exception());
    }
  });
}

}  // namespace offload::python
