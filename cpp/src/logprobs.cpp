#include "specllm/logprobs.h"

#include "specllm/errors.h"
#include "specllm/model.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace specllm {

RowLogprobs row_logprobs(const float * logits, int n_vocab, int n_top) {
    RowLogprobs r;
    float max = -INFINITY;
    for (int i = 0; i < n_vocab; ++i) {
        max = std::max(max, logits[i]);
    }
    // float exp (glibc's expf, several times faster than exp on doubles over 152k entries), summed in blocks of
    // floats into a double
    double sum = 0.0;
    for (int i0 = 0; i0 < n_vocab; i0 += 1024) {
        float block = 0.0f;
        for (int i = i0; i < std::min(n_vocab, i0 + 1024); ++i) {
            block += std::exp(logits[i] - max);
        }
        sum += block;
    }
    r.lse = max + std::log(sum);
    n_top = std::max(0, std::min(n_top, n_vocab));
    if (n_top == 0) {
        return r;
    }
    // a min-heap of the best n_top so far: its front is the one to beat
    const auto better = [&](llama_token a, llama_token b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    std::vector<llama_token> heap;
    heap.reserve((size_t) n_top);
    for (llama_token i = 0; i < n_vocab; ++i) {
        if ((int) heap.size() < n_top) {
            heap.push_back(i);
            std::push_heap(heap.begin(), heap.end(), better);
        } else if (better(i, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = i;
            std::push_heap(heap.begin(), heap.end(), better);
        }
    }
    std::sort(heap.begin(), heap.end(), better);
    for (llama_token t : heap) {
        r.top.push_back({t, r.logprob(logits, t)});
    }
    return r;
}

LogitsRow LogprobRecorder::wrap(const LogitsRow & row, const std::vector<llama_token> & draft, int n_vocab,
                                int n_top) {
    rows_.clear();
    drafted_.clear();
    last_ = nullptr;
    return [this, row, &draft, n_vocab, n_top](int i) {
        last_ = row(i);
        if (i == (int) rows_.size()) {
            rows_.push_back(row_logprobs(last_, n_vocab, n_top));
            drafted_.push_back(i < (int) draft.size() ? rows_.back().logprob(last_, draft[(size_t) i]) : 0.0f);
        }
        return last_;
    };
}

std::vector<TokenLogprob> LogprobRecorder::emitted(const std::vector<llama_token> & draft, int n_accepted,
                                                   llama_token next) const {
    if ((int) rows_.size() != n_accepted + 1 || last_ == nullptr) {
        throw Error("logprobs: the verifier read " + std::to_string(rows_.size()) + " rows for " +
                    std::to_string(n_accepted + 1) + " emitted tokens (a bug)");
    }
    std::vector<TokenLogprob> out;
    for (int i = 0; i <= n_accepted; ++i) {
        const llama_token t = i < n_accepted ? draft[(size_t) i] : next;
        out.push_back({t, i < n_accepted ? drafted_[(size_t) i] : rows_[(size_t) i].logprob(last_, t),
                       rows_[(size_t) i].top});
    }
    return out;
}

std::vector<TokenLogprob> decode_scored(Model & model, const std::vector<llama_token> & tokens, llama_token next,
                                        int n_top, const std::function<void()> & poll) {
    std::vector<TokenLogprob> out;
    out.reserve(tokens.size());
    const int n = (int) tokens.size();
    const int rows = std::max(1, std::min(prompt_logprob_rows, model.n_batch()));
    for (int i0 = 0; i0 < n; i0 += rows) {
        if (i0 > 0 && poll) {
            poll();
        }
        const int n_cur = std::min(rows, n - i0);
        model.decode(tokens.data() + i0, n_cur, true);
        for (int j = 0; j < n_cur; ++j) {
            const float * logits = model.logits(j);
            const int i = i0 + j;
            const llama_token t = i + 1 < n ? tokens[(size_t) i + 1] : next;
            RowLogprobs row = row_logprobs(logits, model.n_vocab(), n_top);
            out.push_back({t, row.logprob(logits, t), std::move(row.top)});
        }
    }
    return out;
}

} // namespace specllm
