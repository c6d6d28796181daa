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
    return hash_of(tokens_.data() + end, n);
}

uint64_t NgramIndex::hash_of(const llama_token * end, int n) const {
    uint64_t h = 1469598103934665603ULL;
    for (const llama_token * p = end - n; p < end; ++p) {
        h = (h ^ (uint32_t) *p) * 1099511628211ULL;
    }
    return h;
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
    for (size_t i = source; i < tokens_.size() && (int) out.size() < n_draft && tokens_[i] != separator; ++i) {
        out.push_back(tokens_[i]);
    }
}

NgramMatch NgramIndex::lookup(int n_draft, std::vector<llama_token> & out) const {
    return lookup(tokens_.data(), tokens_.size(), n_draft, out);
}

NgramMatch NgramIndex::lookup(const llama_token * q, size_t n_q, int n_draft, std::vector<llama_token> & out) const {
    out.clear();
    NgramMatch best;
    const size_t end = n_q; // q's end; with q = tokens_ the earlier occurrences all lie before it
    for (int n = std::min<int>(n_max_, (int) end); n >= n_min_; --n) {
        auto it = maps_[n].find(hash_of(q + end, n));
        if (it == maps_[n].end()) {
            continue;
        }
        // among the occurrences of this key (newest first), the one that agrees furthest back
        int n_seen = 0;
        llama_token first_next = -1;
        uint32_t cont = it->second; // the token after an earlier occurrence
        for (int c = 0; cont != no_prev && c < max_candidates; ++c, cont = prev_[n][cont]) {
            if (!std::equal(q + end - n, q + end, tokens_.begin() + (long) (cont - n)) || cont >= tokens_.size() ||
                tokens_[cont] == separator) { // a hash collision, or nothing follows this occurrence
                continue;
            }
            best.ambiguous = best.ambiguous || (n_seen++ > 0 && tokens_[cont] != first_next);
            first_next = tokens_[cont];
            int m = n;
            while (m < max_match && cont >= (size_t) m + 1 && end >= (size_t) m + 1 &&
                   tokens_[cont - m - 1] == q[end - m - 1]) {
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

// where the newest n of tokens begin, at a separator so that no document is kept in part; with keep_part, when the
// newest document alone is longer than n, its newest part (as add() keeps of an output longer than the memory)
size_t NgramMemory::first_kept(const std::vector<llama_token> & all, size_t n, bool keep_part) {
    if (all.size() <= n) {
        return 0;
    }
    size_t from = all.size() - n;
    size_t whole = from;
    while (whole < all.size() && whole > 0 && all[whole - 1] != NgramIndex::separator) {
        ++whole;
    }
    return whole < all.size() || !keep_part ? whole : from;
}

void NgramMemory::set_max_tokens(size_t n) {
    max_tokens_ = n;
    shrink_to(n, true);
}

void NgramMemory::add(const llama_token * tokens, size_t n) {
    if (max_tokens_ == 0 || n == 0) {
        return;
    }
    if (n + 1 > max_tokens_) { // longer than the whole memory: its newest part
        tokens += n + 1 - max_tokens_;
        n = max_tokens_ - 1;
    }
    if (index_.tokens().size() + n + 1 > max_tokens_) {
        shrink_to(std::min(max_tokens_ / 2, max_tokens_ - n - 1), false); // room for the new output
    }
    for (size_t i = 0; i < n; ++i) {
        index_.push(tokens[i]);
    }
    index_.push(NgramIndex::separator);
}

void NgramMemory::assign(const std::vector<llama_token> & tokens) {
    index_.clear();
    std::vector<llama_token> all;
    all.reserve(tokens.size() + 1);
    for (llama_token t : tokens) {
        all.push_back(t < 0 ? NgramIndex::separator : t);
    }
    if (!tokens.empty() && tokens.back() >= 0) {
        all.push_back(NgramIndex::separator);
    }
    // only what shrink_to(max_tokens_, true) would keep is indexed: a memory saved with a larger bound costs what
    // this one keeps (indexing 8 million tokens to keep 32 thousand took 24 s and 1 GB)
    for (size_t i = first_kept(all, max_tokens_, true); i < all.size(); ++i) {
        index_.push(all[i]);
    }
}

void NgramMemory::shrink_to(size_t n, bool keep_part) {
    const auto & all = index_.tokens();
    if (all.size() <= n) {
        return;
    }
    std::vector<llama_token> keep(all.begin() + (long) first_kept(all, n, keep_part), all.end());
    index_.clear();
    for (llama_token t : keep) {
        index_.push(t);
    }
}

} // namespace specllm
