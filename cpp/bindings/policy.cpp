// The draft-length policies, exposed for model-free tests and experiments.
#include "bindings.h"

#include "specllm/auto_policy.h"

#include <cmath>
#include <string>

using namespace specllm;

namespace {

void check_source(int source) {
    if (source < 0 || source >= AutoPolicy::n_sources) {
        throw py::index_error("source must be in [0, " + std::to_string(AutoPolicy::n_sources) + "), got " +
                              std::to_string(source));
    }
}

void check_range(const char * name, long long v, long long lo, long long hi) {
    if (v < lo || v > hi) {
        throw py::value_error(std::string(name) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                              "], got " + std::to_string(v));
    }
}

void check_ms(const char * name, double v) {
    if (!std::isfinite(v) || v < 0.0) {
        throw py::value_error(std::string(name) + " must be a finite number of ms >= 0, got " + std::to_string(v));
    }
}

StepContext context(int k_max, bool has_model, bool has_ngram, int ngram_match, int model_lag, bool doubtful,
                    bool memory, int n_past = 0, int boundary = -1) {
    StepContext c;
    c.ngram_boundary = boundary;
    c.n_past = n_past;
    c.ngram_memory = memory;
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
    check_range("n_drafted", n_drafted, 0, AutoPolicy::n_max);
    check_range("n_accepted", n_accepted, 0, n_drafted);
    check_range("n_catchup", n_catchup, 0, 1 << 24);
    check_range("n_verified", n_verified, 0, AutoPolicy::n_max + 1);
    check_ms("draft_ms", draft_ms);
    check_ms("verify_ms", verify_ms);
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
                       bool ngram_doubtful, bool ngram_memory, int n_past, int ngram_boundary) {
         check_range("k_max", k_max, 0, AutoPolicy::n_max);
         check_range("ngram_boundary", ngram_boundary, -1, 1 << 24);
         check_range("ngram_match", ngram_match, 0, 1 << 24);
         check_range("model_lag", model_lag, 0, 1 << 24);
         check_range("n_past", n_past, 0, 1 << 24);
         Choice ch = p.choose(context(k_max, has_model, has_ngram, ngram_match, model_lag, ngram_doubtful,
                                      ngram_memory, n_past, ngram_boundary));
         return py::make_tuple(ch.k, ch.ngram);
     }, py::arg("k_max") = 8, py::arg("has_model") = true, py::arg("has_ngram") = false, py::arg("ngram_match") = 0,
        py::arg("model_lag") = 1, py::arg("ngram_doubtful") = false, py::arg("ngram_memory") = false,
        py::arg("n_past") = 0, py::arg("ngram_boundary") = -1)
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
        .def("padded_rows", &AutoPolicy::padded_rows, py::arg("n"))
        .def("set_learn_batch_costs", &AutoPolicy::set_learn_batch_costs, py::arg("on"))
        .def_property_readonly("learn_batch_costs", &AutoPolicy::learn_batch_costs)
        .def("batch_factor", &AutoPolicy::batch_factor, py::arg("n"))
        .def("first_rows", &AutoPolicy::first_rows)
        .def("forced_choice", [](AutoPolicy & p, int m) {
            check_range("m", m, 0, 1 << 24);
            return p.forced_choice(m).k;
        }, py::arg("m"))
        .def("step_level", &AutoPolicy::step_level)
        .def("step_level_observations", &AutoPolicy::step_level_observations)
        .def("batch_shape", &AutoPolicy::batch_shape)
        .def("batch_shape_observations", &AutoPolicy::batch_shape_observations)
        .def("set_context_row_cost", [](AutoPolicy & p, double ms) {
            check_ms("ms", ms);
            p.set_context_row_cost(ms);
        })
        .def("context_row_cost", &AutoPolicy::context_row_cost)
        .def("set_row_read_cost", [](AutoPolicy & p, double ms) {
            check_ms("ms", ms);
            p.set_row_read_cost(ms);
        })
        .def("set_draft_token_cost", [](AutoPolicy & p, double ms) {
            check_ms("ms", ms);
            p.set_draft_token_cost(ms);
        })
        .def("set_k_limit", [](AutoPolicy & p, int k) {
            check_range("k", k, 0, AutoPolicy::n_max);
            p.set_k_limit(k);
        })
        .def("set_verify_rows", [](AutoPolicy & p, int n) {
            check_range("n", n, 0, AutoPolicy::n_max + 1);
            p.set_verify_rows(n);
        })
        .def("acceptance", [](const AutoPolicy & p, int source) {
            check_source(source);
            auto a = p.acceptance(source);
            return std::vector<double>(a.begin(), a.end());
        })
        .def("viable", [](const AutoPolicy & p, int source) {
            check_source(source);
            return p.viable(source);
        })
        .def("pays", [](const AutoPolicy & p, int source) {
            check_source(source);
            return p.pays(source);
        })
        .def("left_out_draft_model", &AutoPolicy::left_out_draft_model, py::arg("keep") = AutoPolicy::default_keep)
        .def("new_generation", &AutoPolicy::new_generation, py::arg("carry") = AutoPolicy::default_carry,
             py::arg("keep") = AutoPolicy::memory_keep, py::arg("text_carry") = 0, py::arg("text_keep") = 0.0)
        .def_static("source_of", [](bool ngram, int match, bool doubtful, bool memory) {
            check_range("match", match, 0, 1 << 24);
            return AutoPolicy::source_of(ngram, match, doubtful, memory);
        }, py::arg("ngram"), py::arg("match"), py::arg("doubtful") = false, py::arg("memory") = false)
        .def("observe_shadow", [](AutoPolicy & p, int ngram_match, bool doubtful, bool would_accept, bool memory,
                                  bool boundary) {
            check_range("ngram_match", ngram_match, 0, 1 << 24);
            p.observe_shadow(ngram_match, doubtful, would_accept, memory, boundary);
        }, py::arg("ngram_match"), py::arg("doubtful"), py::arg("would_accept"), py::arg("memory") = false,
            py::arg("boundary") = false)
        .def("boundary_acceptance", &AutoPolicy::boundary_acceptance)
        .def_readonly_static("alpha_prior_boundary", &AutoPolicy::alpha_prior_boundary)
        .def_readonly_static("n_max", &AutoPolicy::n_max)
        .def_readonly_static("n_sources", &AutoPolicy::n_sources);
    def_policy(a);
    py::class_<FixedPolicy> f(m, "FixedPolicy");
    f.def(py::init([](int k) {
        check_range("k", k, 0, AutoPolicy::n_max);
        return FixedPolicy(k);
    }));
    def_policy(f);
    py::class_<HeuristicPolicy> h(m, "HeuristicPolicy");
    h.def(py::init([](int k_start, int k_max) {
        check_range("k_max", k_max, 1, AutoPolicy::n_max);
        check_range("k_start", k_start, 0, k_max);
        return HeuristicPolicy(k_start, k_max);
    }));
    def_policy(h);
}
