#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

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
