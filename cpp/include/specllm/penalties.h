// Repetition penalties as llama.cpp's penalties sampler applies them (llama-server's repeat_penalty,
// frequency_penalty, presence_penalty, repeat_last_n): over the last `penalty_last_n` tokens of the context
// (prompt included, as llama-server feeds its prompt to the sampler), each token seen there `count` times has its
// logit divided by repeat_penalty (multiplied when <= 0), then count * frequency_penalty + presence_penalty
// subtracted. The penalties depend on the context only, so a verify row is penalized by the context up to it
// (the history, id_last and the drafts before the row): speculative output stays plain decoding's. A request's
// logit_bias is added after them (it depends on nothing), so a window is what adjusts a row for either.
#pragma once

#include "specllm/options.h"
#include "specllm/verifier.h"

#include "llama.h"

#include <deque>
#include <unordered_map>
#include <vector>

namespace specllm {

class PenaltyWindow {
  public:
    static bool penalizes(const SamplingOptions & s) {
        return s.penalty_last_n != 0 &&
               (s.repeat_penalty != 1.0f || s.frequency_penalty != 0.0f || s.presence_penalty != 0.0f);
    }
    static bool active(const SamplingOptions & s) { return penalizes(s) || !s.logit_bias.empty(); }
    // the window over the last penalty_last_n tokens of seq[0..n) (-1: all of them)
    void reset(const SamplingOptions & s, const llama_token * seq, size_t n);
    void push(llama_token t); // t enters the context; the oldest leaves a full window
    // logits penalized (and biased) into out (n_vocab values); returns out.data()
    const float * apply(const float * logits, int n_vocab, std::vector<float> & out) const;

  private:
    const SamplingOptions * s_ = nullptr;
    bool penalize_ = false; // the penalties are on (else the window only biases)
    size_t cap_ = 0; // 0: unbounded
    std::deque<llama_token> window_;
    std::unordered_map<llama_token, int> counts_;
};

// One step's verify rows, penalized: row i by the context (history + id_last: `context`) + draft[0..i).
class PenalizedRows {
  public:
    PenalizedRows(const PenaltyWindow & context, const std::vector<llama_token> & draft, const LogitsRow & row,
                  int n_vocab);
    const float * read(int i);

  private:
    const std::vector<llama_token> & draft_;
    const LogitsRow & row_;
    int n_vocab_;
    const PenaltyWindow & base_; // the window at row 0
    PenaltyWindow window_; // the window at row at_
    int at_ = 0;
    std::vector<float> buf_;
};

} // namespace specllm
