#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <string>

namespace py = pybind11;

void register_errors(py::module_ & m);
void register_options(py::module_ & m);
void register_model(py::module_ & m);
void register_engine(py::module_ & m);
void register_policy(py::module_ & m);
void register_ngram(py::module_ & m);
void register_sampling(py::module_ & m);
void register_embed(py::module_ & m);

// generated text may end inside a UTF-8 sequence (max_tokens); never fail on it
inline py::str utf8_str(const std::string & s) {
    PyObject * o = PyUnicode_DecodeUTF8(s.data(), (Py_ssize_t) s.size(), "replace");
    if (!o) {
        throw py::error_already_set();
    }
    return py::reinterpret_steal<py::str>(o);
}

// a poll for a long C++ call made without the GIL (a prefill, an embedding): between its batches, Python's signal
// handlers run (Ctrl-C raises KeyboardInterrupt), then poll() unless it is None; either may throw to abandon it
inline std::function<void()> python_poll(const py::object & poll) {
    return [&poll] {
        py::gil_scoped_acquire gil;
        if (PyErr_CheckSignals() != 0) {
            throw py::error_already_set();
        }
        if (!poll.is_none()) {
            poll();
        }
    };
}
