// Plain option structs with defaults; the bindings expose them once instead of copying arguments around.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace specllm {

struct ModelOptions {
    std::string path;          // GGUF file
    int n_ctx = 4096;          // context window in tokens
    int n_threads = 0;         // CPU threads for decoding; 0 = all hardware threads
    int n_gpu_layers = 0;      // layers offloaded to the GPU (CUDA/Metal builds of llama.cpp); -1 = all
    int n_batch = 512;         // most tokens in one llama_decode while processing a prompt
    bool repack = false;       // let llama.cpp repack weights for its CPU GEMM kernels (specllm.LLM always does: its
                               // batches of 4+ rows then round differently; exact mode verifies <= 3 rows a decode)
    // the KV cache's types (llama-server's --cache-type-k/-v): f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl.
    // q8_0 halves the cache's memory (and a prompt state's bytes); a quantized V cache needs flash attention
    std::string cache_type_k = "f16";
    std::string cache_type_v = "f16";
    int flash_attn = -1;       // -1 auto (llama.cpp's choice for the device: on for CPUs), 0 off, 1 on
};

enum class DraftKind {
    none,   // plain decoding
    model,  // a smaller model of the same family
    ngram,  // prompt lookup: continuation of the longest earlier match of the current suffix
    hybrid, // n-gram when it has a long match, the draft model otherwise
};

enum class PolicyKind {
    fixed,     // always draft_length tokens
    heuristic, // +2 after a fully accepted draft, -1 otherwise (HF transformers' schedule)
    automatic, // cost model: the k that maximizes expected tokens per second, 0 when nothing beats plain
};

struct SamplingOptions {
    float temperature = 0.0f;  // 0 = greedy (argmax)
    int top_k = 0;             // keep the k most likely tokens; 0 = all
    float top_p = 1.0f;        // keep the smallest set with this much probability mass; 1 = all
    float min_p = 0.0f;        // drop tokens below min_p times the top probability; 0 = off
    // false: temperature first, then top-k, top-p and min-p on the scaled distribution (HF's and vLLM's order);
    // true: the filters on the unscaled one and temperature last (llama.cpp's default sampler chain, llama-server's)
    bool temperature_last = false;
    uint64_t seed = 0;         // random seed (the caller draws one when the user gave none)
    // repetition penalties, as llama.cpp's penalties sampler (penalties.h), before the above; 1 / 0 / 0 = off
    float repeat_penalty = 1.0f;    // a logit of a token in the window divided by this (multiplied when <= 0)
    float frequency_penalty = 0.0f; // ... minus this times the token's count in the window
    float presence_penalty = 0.0f;  // ... minus this once
    int penalty_last_n = 64;        // the window: the last this many tokens of the context; -1 = all, 0 = off
    // (token id, bias) pairs: each bias is added to that token's logit after the penalties (OpenAI's and
    // llama-server's logit_bias; -inf bans the token). Target and draft model alike, so output stays plain's
    std::vector<std::pair<int32_t, float>> logit_bias;
    // how a sampled draft is accepted. coupled: the target's token at each position is a draw keyed by (seed,
    // position), and the draft (sampled with the same key) is accepted iff it equals it, so the text a seed gives
    // is plain sampling's, whatever k, drafter or machine load. rejection: Leviathan et al.'s rejection sampling
    // (accepts a draft model's tokens more often; the text then depends on k)
    bool rejection = false;
};

struct GenerateOptions {
    int max_tokens = 256;               // most tokens to generate (0: process the prompt only)
    int cache_reuse = 0;                // > 0: llama-server's --cache-reuse, runs of at least this many cached
                                        // tokens moved to where the prompt holds them (Model::keep_shifted)
    SamplingOptions sampling;           // how target and draft tokens are chosen
    std::vector<std::string> stop;      // generation ends before the first occurrence of any of these
    PolicyKind policy = PolicyKind::automatic; // how many tokens to draft each step
    int draft_length = 4;               // k for the fixed policy; the largest k for the others
    float draft_p_min = 0.0f;           // stop drafting when the draft's top probability falls below this
    bool ignore_eos = false;            // keep generating past end-of-generation tokens (benchmarks)
    int logprobs = -1;                  // -1: none; n >= 0: each emitted token's log-probability and the n most
                                        // likely tokens at its position (logprobs.h), up to max_top_logprobs
    int prompt_logprobs = -1;           // -1: none; n >= 0: the same for every prompt token after the first
                                        // (Engine::prompt_logprobs); the prompt is then decoded whole, no cached
                                        // prefix reused, with logits for every row
    std::string grammar;                // GBNF rules (a "root" rule) the output must follow; empty: none (grammar.h)
    std::vector<std::string> grammar_triggers; // a lazy grammar: the output is free until one of these words, and
                                        // the grammar holds from the word on (its root begins with it)
    std::vector<std::string> grammar_trigger_patterns; // ... or where one of these regular expressions matched
                                        // (^...$: the whole output; the grammar from the first group on)
};

struct NgramOptions {
    int n_min = 2;            // shortest suffix to look up
    int n_max = 4;            // longest suffix to look up
    int hybrid_min_match = 3; // hybrid drafting uses the n-gram proposal when its match is at least this long
};

} // namespace specllm
