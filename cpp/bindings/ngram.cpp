// The n-gram index, exposed for model-free tests.
#include "bindings.h"

#include "specllm/ngram.h"

using namespace specllm;

void register_ngram(py::module_ & m) {
    py::class_<NgramIndex>(m, "NgramIndex")
        .def(py::init<int, int>(), py::arg("n_min") = 2, py::arg("n_max") = 4)
        .def("push", &NgramIndex::push)
        .def("extend", [](NgramIndex & ix, const std::vector<llama_token> & toks) {
            for (llama_token t : toks) {
                ix.push(t);
            }
        })
        .def("truncate", &NgramIndex::truncate)
        .def("clear", &NgramIndex::clear)
        .def_property_readonly("tokens", &NgramIndex::tokens)
        .def("lookup", [](const NgramIndex & ix, int n_draft) {
            std::vector<llama_token> out;
            return py::make_tuple(ix.lookup(n_draft, out).length, out);
        }, py::arg("n_draft"), "(match length, proposed tokens) for the current suffix")
        .def("match", [](const NgramIndex & ix) {
            std::vector<llama_token> out;
            const NgramMatch m = ix.lookup(1, out);
            return py::make_tuple(m.length, m.ambiguous, m.source);
        }, "(match length, ambiguous, source index) of the current suffix's match");
}
