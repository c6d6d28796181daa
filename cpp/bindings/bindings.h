#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <functional>
#include <string>

namespace py = pybind11;

// Calls into llama.cpp without the GIL, counted: at interpreter exit Python waits until none is left
// (specllm.llm._wait_for_native_calls), since a daemon thread that comes back for the GIL while Python finalizes
// is ended in a way C++ cannot unwind (the process aborted: tokenize, memory, close from a daemon thread).
int native_calls_inside();

// Once the interpreter exits (set_exiting), a call from a thread other than the main one is refused (SpecLLMError)
// unless it frees something (a deleter, which cannot throw).
struct CountedCall {
    explicit CountedCall(bool may_refuse = true);
    ~CountedCall();
};

// py::gil_scoped_release, counted (the count taken with the GIL held, given back once it is held again)
struct released {
    CountedCall counted;
    py::gil_scoped_release release;
};

// the same for a deleter: never refused
struct released_to_free {
    CountedCall counted{false};
    py::gil_scoped_release release;
};

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
