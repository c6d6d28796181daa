#include "specllm/ngram.h"

#include "specllm/errors.h"

#include <algorithm>
#include <string>

namespace specllm {

NgramIndex::NgramIndex(int n_min, int n_max) : n_min_(n_min), n_max_(n_max) {
    if (n_min < 1 || n_max < n_min || n_max > 16) {
        throw InvalidArgument("n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 16, got ngram_min=" +
                              std::to_string(n_min) + " ngram_max=" + std::to_string(n_max));
    }
    maps_.resize((size_t) n_max + 1);
    prev_.resize((size_t) n_max + 1);
}

void NgramIndex::clear() {
    tokens_.clear();
    for (auto & m : maps_) {
        m.clear();
    }
    for (auto & p : prev_) {
        p.clear();
    }
}

uint64_t NgramIndex::hash(size_t end, int n) const {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = end - (size_t) n; i < end; ++i) {
        h = (h ^ (uint32_t) tokens_[i]) * 1099511628211ULL;
    }
    return h;
}

bool NgramIndex::same(size_t end_a, size_t end_b, int n) const {
    return std::equal(tokens_.begin() + (long) (end_a - n), tokens_.begin() + (long) end_a,
                      tokens_.begin() + (long) (end_b - n));
}

void NgramIndex::push(llama_token token) {
    // the n-grams ending at the current end are now followed by `token`
    const size_t end = tokens_.size();
    for (int n = n_min_; n <= n_max_; ++n) {
        uint32_t before = no_prev;
        if (end >= (size_t) n) {
            auto [it, fresh] = maps_[n].try_emplace(hash(end, n), (uint32_t) end);
            if (!fresh) {
                before = it->second;
                it->second = (uint32_t) end;
            }
        }
        prev_[n].push_back(before);
    }
    tokens_.push_back(token);
}

void NgramIndex::truncate(size_t n) {
    if (n >= tokens_.size()) {
        return;
    }
    std::vector<llama_token> keep(tokens_.begin(), tokens_.begin() + (long) n);
    clear();
    for (llama_token t : keep) {
        push(t);
    }
}

void NgramIndex::continuation(size_t source, int n_draft, std::vector<llama_token> & out) const {
    out.clear();
    for (size_t i = source; i < tokens_.size() && (int) out.size() < n_draft; ++i) {
        out.push_back(tokens_[i]);
    }
}

NgramMatch NgramIndex::lookup(int n_draft, std::vector<llama_token> & out) const {
    out.clear();
    NgramMatch best;
    const size_t end = tokens_.size();
    for (int n = std::min<int>(n_max_, (int) end); n >= n_min_; --n) {
        auto it = maps_[n].find(hash(end, n));
        if (it == maps_[n].end()) {
            continue;
        }
        // among the occurrences of this key (newest first), the one that agrees furthest back
        int n_seen = 0;
        llama_token first_next = -1;
        uint32_t cont = it->second; // the token after an earlier occurrence
        for (int c = 0; cont != no_prev && c < max_candidates; ++c, cont = prev_[n][cont]) {
            if (!same(cont, end, n)) { // hash collision
                continue;
            }
            best.ambiguous = best.ambiguous || (n_seen++ > 0 && tokens_[cont] != first_next);
            first_next = tokens_[cont];
            int m = n;
            while (m < max_match && cont >= (size_t) m + 1 && tokens_[cont - m - 1] == tokens_[end - m - 1]) {
                ++m;
            }
            if (m > best.length) {
                best.source = cont;
                best.length = m;
            }
        }
        if (best.length == 0) {
            continue;
        }
        continuation(best.source, n_draft, out);
        return best;
    }
    return best;
}

} // namespace specllm
