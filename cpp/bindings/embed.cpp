// The Embedder (embed.h): a context of its own over the target's weights or over an embedding model's.
#include "bindings.h"

#include "specllm/embed.h"

#include <pybind11/numpy.h>

using namespace specllm;

namespace {
struct EmbedderDeleter { // freeing a llama context (and model) takes time: without the GIL
    void operator()(Embedder * e) const {
        released_to_free release;
        delete e;
    }
};
} // namespace

void register_embed(py::module_ & m) {
    py::class_<Embedder, std::unique_ptr<Embedder, EmbedderDeleter>>(m, "Embedder")
        .def(py::init<const Model &, int, int>(), py::arg("target"), py::arg("n_ctx"), py::arg("n_threads"),
             py::keep_alive<1, 2>(), py::call_guard<released>(),
             "over the target's weights (kept alive while this lives)")
        .def(py::init<const ModelOptions &>(), py::arg("opts"), py::call_guard<released>(),
             "an embedding model of its own")
        .def_property_readonly("n_embd", &Embedder::n_embd)
        .def_property_readonly("n_ctx", &Embedder::n_ctx)
        .def_property_readonly("pooling", &Embedder::pooling)
        .def_property_readonly("description", &Embedder::description)
        .def_property_readonly("path", &Embedder::path)
        .def("tokenize", &Embedder::tokenize, py::arg("text"), py::arg("add_special") = true)
        .def("embed", [](Embedder & e, const std::vector<std::vector<llama_token>> & inputs, bool normalize,
                         py::object poll) {
            const auto check = python_poll(poll); // before every decode batch
            std::vector<std::vector<float>> v;
            {
                released nogil;
                v = e.embed(inputs, normalize, check);
            }
            py::array_t<float> out({(py::ssize_t) v.size(), (py::ssize_t) e.n_embd()});
            auto a = out.mutable_unchecked<2>();
            for (size_t i = 0; i < v.size(); ++i) {
                std::copy(v[i].begin(), v[i].end(), a.mutable_data((py::ssize_t) i, 0));
            }
            return out;
        }, py::arg("inputs"), py::arg("normalize") = true, py::arg("poll") = py::none(),
        "(len(inputs), n_embd) float32");
}
