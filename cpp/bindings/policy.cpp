// The draft-length policies, exposed for model-free tests and experiments.
#include "bindings.h"

#include "specllm/auto_policy.h"

using namespace specllm;

namespace {

StepContext context(int k_max, bool has_model, bool has_ngram, int ngram_match, int model_lag, bool doubtful) {
    StepContext c;
    c.ngram_doubtful = doubtful;
    c.model_lag = model_lag;
    c.k_max = k_max;
    c.has_model = has_model;
    c.has_ngram = has_ngram;
    c.ngram_match = ngram_match;
    return c;
}

StepOutcome outcome(int n_drafted, int n_accepted, bool from_ngram, double draft_ms, double verify_ms,
                    int n_catchup, int n_verified) {
    StepOutcome o;
    o.n_verified = n_verified;
    o.n_catchup = n_catchup;
    o.n_drafted = n_drafted;
    o.n_accepted = n_accepted;
    o.from_ngram = from_ngram;
    o.draft_ms = draft_ms;
    o.verify_ms = verify_ms;
    return o;
}

template <class P> void def_policy(py::class_<P> & c) {
    c.def("choose", [](P & p, int k_max, bool has_model, bool has_ngram, int ngram_match, int model_lag,
                       bool ngram_doubtful) {
         Choice ch = p.choose(context(k_max, has_model, has_ngram, ngram_match, model_lag, ngram_doubtful));
         return py::make_tuple(ch.k, ch.ngram);
     }, py::arg("k_max") = 8, py::arg("has_model") = true, py::arg("has_ngram") = false, py::arg("ngram_match") = 0,
        py::arg("model_lag") = 1, py::arg("ngram_doubtful") = false)
        .def("update", [](P & p, int n_drafted, int n_accepted, bool from_ngram, double draft_ms, double verify_ms,
                          int n_catchup, int n_verified) {
            p.update(outcome(n_drafted, n_accepted, from_ngram, draft_ms, verify_ms, n_catchup, n_verified));
        }, py::arg("n_drafted"), py::arg("n_accepted"), py::arg("from_ngram") = false, py::arg("draft_ms") = 0.0,
            py::arg("verify_ms") = 0.0, py::arg("n_catchup") = 0, py::arg("n_verified") = 0);
}

} // namespace

void register_policy(py::module_ & m) {
    py::class_<AutoPolicy> a(m, "AutoPolicy");
    a.def(py::init<>())
        .def("set_verify_costs", &AutoPolicy::set_verify_costs)
        .def("verify_costs", &AutoPolicy::verify_costs)
        .def("set_draft_token_cost", &AutoPolicy::set_draft_token_cost)
        .def("set_k_limit", &AutoPolicy::set_k_limit)
        .def("set_verify_rows", &AutoPolicy::set_verify_rows)
        .def("acceptance", [](const AutoPolicy & p, int source) {
            auto a = p.acceptance(source);
            return std::vector<double>(a.begin(), a.end());
        })
        .def("viable", &AutoPolicy::viable)
        .def("new_generation", &AutoPolicy::new_generation, py::arg("carry") = AutoPolicy::default_carry,
             py::arg("keep") = AutoPolicy::default_keep)
        .def_static("source_of", &AutoPolicy::source_of, py::arg("ngram"), py::arg("match"),
                    py::arg("doubtful") = false)
        .def("observe_shadow", &AutoPolicy::observe_shadow, py::arg("ngram_match"), py::arg("doubtful"),
             py::arg("would_accept"))
        .def_readonly_static("n_max", &AutoPolicy::n_max)
        .def_readonly_static("n_sources", &AutoPolicy::n_sources);
    def_policy(a);
    py::class_<FixedPolicy> f(m, "FixedPolicy");
    f.def(py::init<int>());
    def_policy(f);
    py::class_<HeuristicPolicy> h(m, "HeuristicPolicy");
    h.def(py::init<int, int>());
    def_policy(h);
}
