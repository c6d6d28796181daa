// The engine, its statistics and step results. Every call that loads, decodes or frees releases the GIL.
#include "bindings.h"

#include "specllm/engine.h"

#include <cmath>
#include <string>

using namespace specllm;

namespace {
// freeing the llama contexts takes time: do it without the GIL
struct EngineDeleter {
    void operator()(Engine * e) const {
        released_to_free release;
        delete e;
    }
};

// (token, logprob, [(token, logprob), ...] most likely first) per entry
py::list logprob_list(const std::vector<TokenLogprob> & entries) {
    py::list out;
    for (const TokenLogprob & t : entries) {
        py::list top;
        for (const TopLogprob & a : t.top) {
            top.append(py::make_tuple(a.token, a.logprob));
        }
        out.append(py::make_tuple(t.token, t.logprob, top));
    }
    return out;
}
} // namespace

void register_engine(py::module_ & m) {
    py::class_<EngineOptions>(m, "EngineOptions")
        .def(py::init<>())
        .def_readwrite("target", &EngineOptions::target)
        .def_readwrite("draft", &EngineOptions::draft)
        .def_readwrite("draft_kind", &EngineOptions::draft_kind)
        .def_readwrite("ngram", &EngineOptions::ngram)
        .def_readwrite("verify_rows", &EngineOptions::verify_rows)
        .def_readwrite("memory_tokens", &EngineOptions::memory_tokens)
        .def_readwrite("sentence_boundaries", &EngineOptions::sentence_boundaries);
    m.attr("exact_verify_rows") = exact_verify_rows;
    m.attr("max_threads") = max_threads;
    m.attr("max_ctx") = max_ctx;

    py::class_<Stats>(m, "Stats")
        .def_readonly("n_prompt", &Stats::n_prompt)
        .def_readonly("n_cached", &Stats::n_cached)
        .def_readonly("n_restored", &Stats::n_restored)
        .def_readonly("n_shifted", &Stats::n_shifted)
        .def_readonly("restored_from_disk", &Stats::restored_from_disk)
        .def_readonly("n_grammar_steps", &Stats::n_grammar_steps)
        .def_readonly("n_generated", &Stats::n_generated)
        .def_readonly("n_steps", &Stats::n_steps)
        .def_readonly("n_drafted", &Stats::n_drafted)
        .def_readonly("n_accepted", &Stats::n_accepted)
        .def_readonly("n_ngram_steps", &Stats::n_ngram_steps)
        .def_readonly("n_memory_steps", &Stats::n_memory_steps)
        .def_readonly("n_verify_rows", &Stats::n_verify_rows)
        .def_readonly("n_pad_rows", &Stats::n_pad_rows)
        .def_readonly("n_plain_steps", &Stats::n_plain_steps)
        .def_readonly("plain_steps_ms", &Stats::plain_steps_ms)
        .def_readonly("prefill_ms", &Stats::prefill_ms)
        .def_readonly("draft_ms", &Stats::draft_ms)
        .def_readonly("verify_ms", &Stats::verify_ms)
        .def_readonly("sample_ms", &Stats::sample_ms)
        .def_readonly("generate_ms", &Stats::generate_ms)
        .def_readonly("seed", &Stats::seed)
        .def_readonly("k_hist", &Stats::k_hist)
        .def_readonly("n_drafted_at", &Stats::n_drafted_at)
        .def_readonly("n_accepted_at", &Stats::n_accepted_at);

    py::class_<StepResult>(m, "StepResult")
        .def_property_readonly("text", [](const StepResult & r) { return utf8_str(r.text); })
        .def_readonly("tokens", &StepResult::tokens)
        .def_readonly("done", &StepResult::done)
        .def_readonly("finish_reason", &StepResult::finish_reason)
        .def_readonly("n_drafted", &StepResult::n_drafted)
        .def_readonly("n_accepted", &StepResult::n_accepted)
        // (token, logprob, [(token, logprob), ...] most likely first) per token, when asked for
        .def_property_readonly("logprobs", [](const StepResult & r) { return logprob_list(r.logprobs); });

    py::class_<Engine, std::unique_ptr<Engine, EngineDeleter>>(m, "Engine")
        .def(py::init<const EngineOptions &>(), py::call_guard<released>())
        .def_property_readonly("target", &Engine::target, py::return_value_policy::reference_internal)
        .def_property_readonly("draft", &Engine::draft_model, py::return_value_policy::reference_internal,
                               "the draft model (None without one)")
        .def_property_readonly("draft_kind", &Engine::draft_kind)
        .def_property_readonly("active", &Engine::active)
        .def_property_readonly("stats", &Engine::stats, py::return_value_policy::copy)
        .def_property_readonly("prompt_logprobs", [](const Engine & e) { return logprob_list(e.prompt_logprobs()); },
                               "entries for prompt tokens 1.. after start() with prompt_logprobs >= 0")
        .def("start", [](Engine & e, const std::vector<llama_token> & prompt, const GenerateOptions & opts,
                         py::object poll) {
            const auto check = python_poll(poll); // between prefill batches
            released nogil;
            e.start(prompt, opts, check);
        }, py::arg("prompt"), py::arg("opts"), py::arg("poll") = py::none())
        .def("step", &Engine::step, py::call_guard<released>())
        .def("set_drafter", &Engine::set_drafter, py::arg("kind"), py::arg("draft"), py::arg("ngram"),
             py::call_guard<released>())
        .def("cancel", &Engine::cancel, py::call_guard<released>())
        .def("interrupt", &Engine::interrupt, "from any thread: stop the running generation at its next prompt "
             "batch or step")
        .def("clear_interrupt", &Engine::clear_interrupt)
        .def_property_readonly("interrupted", &Engine::interrupted)
        .def("reset", &Engine::reset, py::arg("keep_memory") = false, py::call_guard<released>())
        .def("memory", &Engine::memory, py::call_guard<released>())
        .def("set_memory", &Engine::set_memory, py::arg("tokens"), py::call_guard<released>())
        .def("clear_memory", &Engine::clear_memory, py::call_guard<released>())
        .def("set_memory_tokens", &Engine::set_memory_tokens, py::arg("n"), py::call_guard<released>())
        .def_property_readonly("memory_tokens", &Engine::memory_tokens)
        .def("set_memory_ambiguous_drafts", &Engine::set_memory_ambiguous_drafts, py::arg("on"),
             py::call_guard<released>(),
             "draft from a memory match whose key the memory continues in more than one way (default: off)")
        .def_property_readonly("memory_ambiguous_drafts", &Engine::memory_ambiguous_drafts)
        .def("set_prompt_cache_bytes", &Engine::set_prompt_cache_bytes, py::arg("bytes"),
             py::call_guard<released>())
        .def_property_readonly("prompt_cache_bytes", &Engine::prompt_cache_bytes)
        .def("set_grammar_drafts", &Engine::set_grammar_drafts, py::arg("on"))
        .def_property_readonly("prompt_cache_used", &Engine::prompt_cache_used)
        .def_property_readonly("prompt_cache_entries", &Engine::prompt_cache_entries)
        .def("set_prompt_store", &Engine::set_prompt_store, py::arg("dir"), py::arg("max_bytes"), py::arg("identity"),
             py::call_guard<released>())
        .def_property_readonly("prompt_store_dir", &Engine::prompt_store_dir)
        .def("flush_prompt_store", &Engine::flush_prompt_store, py::call_guard<released>())
        .def_property_readonly("prompt_store_entries", &Engine::prompt_store_entries)
        .def_property_readonly("prompt_store_bytes", &Engine::prompt_store_bytes)
        .def("set_sentence_boundaries", &Engine::set_sentence_boundaries, py::arg("on"),
             py::call_guard<released>())
        .def_property_readonly("sentence_boundaries", &Engine::sentence_boundaries)
        .def("profile_verify", &Engine::profile_verify, py::arg("sizes"), py::arg("n_reps") = 2, py::arg("n_prefix") = 32,
             py::call_guard<released>())
        .def("profile_draft", &Engine::profile_draft, py::arg("n_reps") = 3, py::call_guard<released>())
        .def("set_verify_costs", [](Engine & e, const std::vector<double> & c) { e.auto_policy().set_verify_costs(c); })
        .def("verify_costs", [](Engine & e) { return e.auto_policy().verify_costs(); })
        .def("set_draft_token_cost", [](Engine & e, double ms) {
            if (!std::isfinite(ms) || ms < 0.0) {
                throw py::value_error("the draft token cost must be a finite number of ms >= 0");
            }
            e.auto_policy().set_draft_token_cost(ms);
        })
        .def("set_context_row_cost", [](Engine & e, double ms) {
            if (!std::isfinite(ms) || ms < 0.0) {
                throw py::value_error("the context row cost must be a finite number of ms >= 0");
            }
            e.auto_policy().set_context_row_cost(ms);
        })
        .def("policy_state", &Engine::policy_state, py::call_guard<released>(),
             "a copy of what \"auto\" has learned so far (acceptance estimates, costs, level); set_policy_state puts "
             "it back, so that a prompt run again (a benchmark's rounds) starts where its first run started")
        .def("step_level", &Engine::step_level, py::call_guard<released>(),
             "(level, steps): \"auto\"'s plain steps' measured / profiled cost, and how many steps taught it")
        .def("batch_shape", &Engine::batch_shape, py::call_guard<released>(),
             "(shape, batches): what verify batches cost against the plain steps of their moment, each measured / "
             "profiled (1 = the profile's shape), and how many batches taught it since the costs were set")
        .def("set_policy_state", &Engine::set_policy_state, py::arg("state"), py::call_guard<released>())
        .def("set_learn_batch_costs", [](Engine & e, bool on) { e.auto_policy().set_learn_batch_costs(on); },
             py::arg("on"), "learn what verify batches cost against a plain step from their timing (default: off)")
        .def_property_readonly("learn_batch_costs", [](Engine & e) { return e.auto_policy().learn_batch_costs(); })
        .def("batch_cost_factor", [](Engine & e, int n) { return e.auto_policy().batch_factor(n); }, py::arg("n"),
             "what a verify batch of n rows costs now against the profile's shape (1 = as profiled)")
        .def("acceptance_estimate", [](Engine & e, int source) {
            if (source < 0 || source >= AutoPolicy::n_sources) {
                throw py::index_error("source must be in [0, " + std::to_string(AutoPolicy::n_sources) + "), got " +
                                      std::to_string(source));
            }
            auto a = e.auto_policy().acceptance(source);
            return std::vector<double>(a.begin(), a.end());
        })
        .def("set_wrong_sampling_for_tests", &Engine::set_wrong_sampling_for_tests)
        .def("set_grammar_full_mask_for_tests", &Engine::set_grammar_full_mask_for_tests);
}
