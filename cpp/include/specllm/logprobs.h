// Log-probabilities of the tokens a generation emits, for callers that ask for them (the OpenAI API's logprobs):
// the target's own distribution at each emitted position, log_softmax of its raw logits (temperature 1, no top-k /
// top-p / min-p), whatever the sampling options. A speculative step reads them from the verify batch's rows, so
// they are the logits plain decoding would see up to the batch's rounding (exact mode: the same kernels).
#pragma once

#include "specllm/verifier.h"

#include <functional>
#include <vector>

namespace specllm {

constexpr int max_top_logprobs = 20; // what the OpenAI API allows

struct TopLogprob {
    llama_token token = -1;
    float logprob = 0.0f;
};

struct TokenLogprob {
    llama_token token = -1;
    float logprob = 0.0f;
    std::vector<TopLogprob> top; // the n most likely tokens at this position, most likely first
};

// one row of logits: its log-sum-exp and its n_top most likely tokens (ties: the lower id first)
struct RowLogprobs {
    double lse = 0.0;
    std::vector<TopLogprob> top;
    float logprob(const float * logits, llama_token t) const { return (float) (logits[t] - lse); }
};

RowLogprobs row_logprobs(const float * logits, int n_vocab, int n_top);

class Model;

// the prompt's own log-probabilities (an eval harness's loglikelihood requests, OpenAI's echo with logprobs):
// decodes tokens into `model` from its n_past() with logits for every row, in batches of at most
// prompt_logprob_rows (a batch's logits are rows x n_vocab floats, 39 MB for Qwen2.5's vocabulary, which llama.cpp
// keeps for the context's life; on 2 cores a 512-token prompt took 1.3 x a plain prefill with 64 rows, 1.5 x with 32,
// about 1.25 x with 128: bench.logprobs --scoring), calling poll before every batch but the
// first. Entry i is the log-probability, at tokens[i]'s position, of the token after it: tokens[i + 1], and `next`
// after the last. The rows go through the batched kernels, so they can differ from a single-token step's in the
// last digits (as the verify rows' do)
constexpr int prompt_logprob_rows = 64;
std::vector<TokenLogprob> decode_scored(Model & model, const std::vector<llama_token> & tokens, llama_token next,
                                        int n_top, const std::function<void()> & poll);

// what a speculative step needs: each verify row summed up when the verifier first reads it (a later chunk's decode
// overwrites the logits), then one entry per emitted token. The verifiers read rows in order and stop at the row
// that gives the target's own token, whose logits are still the last decode's
class LogprobRecorder {
  public:
    // row, reading through this recorder; draft: the step's drafted tokens (row i proposes draft[i])
    LogitsRow wrap(const LogitsRow & row, const std::vector<llama_token> & draft, int n_vocab, int n_top);
    // row i gives emitted token i: the drafted token while accepted, then the target's token `next`
    std::vector<TokenLogprob> emitted(const std::vector<llama_token> & draft, int n_accepted, llama_token next) const;

  private:
    std::vector<RowLogprobs> rows_;
    std::vector<float> drafted_; // the drafted token's log-probability in each row read
    const float * last_ = nullptr;
};

} // namespace specllm
