// C++ errors become the Python classes defined in specllm/errors.py.
#include "bindings.h"

#include "specllm/errors.h"
#include "specllm/log.h"

#include <new>
#include <string>

void register_errors(py::module_ & m) {
    py::register_exception_translator([](std::exception_ptr p) {
        if (!p) {
            return;
        }
        auto raise = [](const char * name, const std::exception & e) {
            py::object cls = py::module_::import("specllm.errors").attr(name);
            PyErr_SetString(cls.ptr(), e.what());
        };
        try {
            std::rethrow_exception(p);
        } catch (const specllm::ModelLoadError & e) {
            raise("ModelLoadError", e);
        } catch (const specllm::IncompatibleDraftError & e) {
            raise("IncompatibleDraftError", e);
        } catch (const specllm::ContextOverflowError & e) {
            raise("ContextOverflowError", e);
        } catch (const specllm::DecodeError & e) {
            raise("DecodeError", e);
        } catch (const specllm::Cancelled & e) {
            raise("Cancelled", e);
        } catch (const specllm::InvalidArgument & e) {
            raise("InvalidOptionError", e);
        } catch (const specllm::Error & e) {
            raise("SpecLLMError", e);
        } catch (const py::builtin_exception &) { // pybind11's own (IndexError, ValueError...): its translator
            throw;
        } catch (const py::error_already_set &) { // a Python exception passing through (a callback's)
            throw;
        } catch (const std::bad_alloc &) { // MemoryError
            throw;
        } catch (const std::exception & e) {
            // anything else escaping llama.cpp (a std::out_of_range from a damaged vocabulary's byte lookup, ...)
            py::object cls = py::module_::import("specllm.errors").attr("SpecLLMError");
            PyErr_SetString(cls.ptr(), (std::string("llama.cpp failed: ") + e.what()).c_str());
        }
    });
    m.def("log_drain", [] {
        py::list out;
        for (auto & r : specllm::log_drain()) {
            out.append(py::make_tuple(r.level, utf8_str(r.text)));
        }
        return out;
    }, "take llama.cpp's captured log lines as (level, text); levels 1 debug, 2 info, 3 warn, 4 error");
    m.def("log_capture_install", &specllm::log_capture_install);
}
