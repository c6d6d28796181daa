#include "bindings.h"

#include "specllm/logprobs.h"
#include "specllm/options.h"

using namespace specllm;

void register_options(py::module_ & m) {
    m.attr("max_top_logprobs") = max_top_logprobs;
    py::class_<ModelOptions>(m, "ModelOptions")
        .def(py::init<>())
        .def_readwrite("path", &ModelOptions::path)
        .def_readwrite("n_ctx", &ModelOptions::n_ctx)
        .def_readwrite("n_threads", &ModelOptions::n_threads)
        .def_readwrite("n_gpu_layers", &ModelOptions::n_gpu_layers)
        .def_readwrite("n_batch", &ModelOptions::n_batch)
        .def_readwrite("repack", &ModelOptions::repack)
        .def_readwrite("cache_type_k", &ModelOptions::cache_type_k)
        .def_readwrite("cache_type_v", &ModelOptions::cache_type_v)
        .def_readwrite("flash_attn", &ModelOptions::flash_attn);

    py::enum_<DraftKind>(m, "DraftKind")
        .value("none", DraftKind::none)
        .value("model", DraftKind::model)
        .value("ngram", DraftKind::ngram)
        .value("hybrid", DraftKind::hybrid);

    py::enum_<PolicyKind>(m, "PolicyKind")
        .value("fixed", PolicyKind::fixed)
        .value("heuristic", PolicyKind::heuristic)
        .value("auto", PolicyKind::automatic);

    py::class_<SamplingOptions>(m, "SamplingOptions")
        .def(py::init<>())
        .def_readwrite("temperature", &SamplingOptions::temperature)
        .def_readwrite("top_k", &SamplingOptions::top_k)
        .def_readwrite("top_p", &SamplingOptions::top_p)
        .def_readwrite("min_p", &SamplingOptions::min_p)
        .def_readwrite("temperature_last", &SamplingOptions::temperature_last)
        .def_readwrite("seed", &SamplingOptions::seed)
        .def_readwrite("repeat_penalty", &SamplingOptions::repeat_penalty)
        .def_readwrite("frequency_penalty", &SamplingOptions::frequency_penalty)
        .def_readwrite("presence_penalty", &SamplingOptions::presence_penalty)
        .def_readwrite("penalty_last_n", &SamplingOptions::penalty_last_n)
        .def_readwrite("logit_bias", &SamplingOptions::logit_bias)
        .def_readwrite("rejection", &SamplingOptions::rejection);

    py::class_<GenerateOptions>(m, "GenerateOptions")
        .def(py::init<>())
        .def_readwrite("max_tokens", &GenerateOptions::max_tokens)
        .def_readwrite("cache_reuse", &GenerateOptions::cache_reuse)
        .def_readwrite("sampling", &GenerateOptions::sampling)
        .def_readwrite("stop", &GenerateOptions::stop)
        .def_readwrite("policy", &GenerateOptions::policy)
        .def_readwrite("draft_length", &GenerateOptions::draft_length)
        .def_readwrite("draft_p_min", &GenerateOptions::draft_p_min)
        .def_readwrite("ignore_eos", &GenerateOptions::ignore_eos)
        .def_readwrite("logprobs", &GenerateOptions::logprobs)
        .def_readwrite("prompt_logprobs", &GenerateOptions::prompt_logprobs)
        .def_readwrite("grammar", &GenerateOptions::grammar)
        .def_readwrite("grammar_triggers", &GenerateOptions::grammar_triggers)
        .def_readwrite("grammar_trigger_patterns", &GenerateOptions::grammar_trigger_patterns);

    py::class_<NgramOptions>(m, "NgramOptions")
        .def(py::init<>())
        .def_readwrite("n_min", &NgramOptions::n_min)
        .def_readwrite("n_max", &NgramOptions::n_max)
        .def_readwrite("hybrid_min_match", &NgramOptions::hybrid_min_match);
}
