#include "specllm/sampling.h"

#include "specllm/errors.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

namespace specllm {

float Dist::prob(llama_token id) const {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == id) {
            return probs[i];
        }
    }
    return 0.0f;
}

uint64_t Rng::next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double Rng::uniform() {
    return (double) (next() >> 11) * (1.0 / 9007199254740992.0);
}

llama_token argmax(const float * logits, int n_vocab) {
    return (llama_token) (std::max_element(logits, logits + n_vocab) - logits);
}

float top_prob(const float * logits, int n_vocab) {
    const float l_max = *std::max_element(logits, logits + n_vocab);
    double sum = 0.0;
    for (int i = 0; i < n_vocab; ++i) {
        sum += std::exp((double) (logits[i] - l_max));
    }
    return (float) (1.0 / sum);
}

void Warper::warp(const float * logits, int n_vocab, const SamplingOptions & opts, Dist & out) {
    auto by_value = [this](llama_token a, llama_token b) { return vals_[a] > vals_[b]; };

    // temperature, on logits shifted so that the largest is 0: a tiny temperature sends the others to -inf
    // (near-greedy) instead of making inf - inf = NaN. Temperature last: the filters read the unscaled values, and
    // the kept ones are scaled at the end
    vals_.resize((size_t) n_vocab);
    const float l_max = *std::max_element(logits, logits + n_vocab);
    const float t_filter = opts.temperature_last ? 1.0f : opts.temperature;
    for (int i = 0; i < n_vocab; ++i) {
        vals_[i] = (logits[i] - l_max) / t_filter; // the largest is 0
    }
    ids_.clear();
    for (int i = 0; i < n_vocab; ++i) {
        if (vals_[i] > -INFINITY) {
            ids_.push_back(i);
        }
    }
    // top-k: select, do not sort everything
    if (opts.top_k > 0 && (size_t) opts.top_k < ids_.size()) {
        std::nth_element(ids_.begin(), ids_.begin() + opts.top_k - 1, ids_.end(), by_value);
        ids_.resize((size_t) opts.top_k);
    }
    // normalizer over the candidates
    double z = 0.0;
    for (llama_token id : ids_) {
        z += std::exp((double) vals_[id]);
    }
    // top-p: sort growing prefixes until the prefix holds top_p of the mass
    size_t n_keep = ids_.size();
    if (opts.top_p < 1.0f) {
        size_t n_sorted = std::min<size_t>(ids_.size(), 64);
        while (true) {
            std::partial_sort(ids_.begin(), ids_.begin() + n_sorted, ids_.end(), by_value);
            double cum = 0.0;
            size_t i = 0;
            for (; i < n_sorted; ++i) {
                cum += std::exp((double) vals_[ids_[i]]) / z;
                if (cum >= opts.top_p) {
                    break;
                }
            }
            if (i < n_sorted) {
                n_keep = i + 1;
                break;
            }
            if (n_sorted == ids_.size()) {
                break;
            }
            n_sorted = std::min(ids_.size(), n_sorted * 8);
        }
        ids_.resize(n_keep);
    } else if (!ids_.empty()) {
        // no top-p: order does not matter for drawing; only put the most likely token first (O(n), no sort)
        std::iter_swap(ids_.begin(), std::min_element(ids_.begin(), ids_.end(), by_value));
    }
    // min-p, last: p_i / p_max >= min_p  <=>  v_i >= log(min_p) on the scaled logits (the largest is 0 and is
    // always kept, so the order of what stays is unchanged)
    if (opts.min_p > 0.0f) {
        const float v_floor = std::log(opts.min_p);
        ids_.erase(std::remove_if(ids_.begin(), ids_.end(), [&](llama_token id) { return vals_[id] < v_floor; }),
                   ids_.end());
    }
    // softmax over what is left
    out.ids.assign(ids_.begin(), ids_.end());
    out.probs.resize(out.ids.size());
    double sum = 0.0;
    const double rescale = (double) t_filter / opts.temperature; // 1 unless the temperature comes last
    for (size_t i = 0; i < out.ids.size(); ++i) {
        out.probs[i] = (float) std::exp((double) vals_[out.ids[i]] * rescale);
        sum += out.probs[i];
    }
    for (float & p : out.probs) {
        p = (float) (p / sum);
    }
}

llama_token sample(const Dist & dist, Rng & rng) {
    const double u = rng.uniform();
    double cum = 0.0;
    for (size_t i = 0; i < dist.ids.size(); ++i) {
        cum += dist.probs[i];
        if (u < cum) {
            return dist.ids[i];
        }
    }
    return dist.ids.empty() ? 0 : dist.ids.back(); // rounding: u beyond the accumulated sum
}

namespace {

uint64_t mix64(uint64_t z) { // splitmix64's finalizer
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

} // namespace

uint64_t race_key(uint64_t seed, int64_t pos) {
    return mix64(seed ^ mix64((uint64_t) pos + 0x9e3779b97f4a7c15ULL));
}

double race_uniform(uint64_t key, llama_token id) {
    const uint64_t h = mix64(key + 0x9e3779b97f4a7c15ULL * (uint64_t) (id + 1));
    return ((double) (h >> 11) + 0.5) * (1.0 / 9007199254740992.0); // (0, 1)
}

llama_token sample_keyed(const Dist & dist, uint64_t seed, int64_t pos) {
    const uint64_t key = race_key(seed, pos);
    llama_token best = dist.ids.empty() ? 0 : dist.ids[0];
    double best_r = INFINITY; // the smallest -log(u) / p so far
    for (size_t i = 0; i < dist.ids.size(); ++i) {
        const double p = dist.probs[i];
        if (!(p > 0.0)) {
            continue;
        }
        const double u = race_uniform(key, dist.ids[i]);
        // -log(u) >= 1 - u: most tokens are ruled out without a log (ids[0], the likeliest, sets a low bar early)
        if (1.0 - u >= best_r * p) {
            continue;
        }
        const double r = -std::log(u) / p;
        if (r < best_r) {
            best_r = r;
            best = dist.ids[i];
        }
    }
    return best;
}

void check_sampling_options(const SamplingOptions & o) {
    if (!(o.temperature >= 0.0f) || std::isinf(o.temperature)) {
        throw InvalidArgument("temperature must be a finite number >= 0 (0 = greedy), got " +
                              std::to_string(o.temperature));
    }
    if (o.top_k < 0) {
        throw InvalidArgument("top_k must be >= 0 (0 = no limit), got " + std::to_string(o.top_k));
    }
    if (!(o.top_p > 0.0f && o.top_p <= 1.0f)) {
        throw InvalidArgument("top_p must be in (0, 1] (1 = no limit), got " + std::to_string(o.top_p));
    }
    if (!(o.min_p >= 0.0f && o.min_p <= 1.0f)) {
        throw InvalidArgument("min_p must be in [0, 1] (0 = off), got " + std::to_string(o.min_p));
    }
    if (!(o.repeat_penalty > 0.0f) || std::isinf(o.repeat_penalty)) {
        throw InvalidArgument("repeat_penalty must be a finite number > 0 (1 = off), got " +
                              std::to_string(o.repeat_penalty));
    }
    if (!std::isfinite(o.frequency_penalty) || !std::isfinite(o.presence_penalty)) {
        throw InvalidArgument("frequency_penalty and presence_penalty must be finite numbers (0 = off)");
    }
    for (const auto & [id, bias] : o.logit_bias) {
        if (std::isnan(bias) || bias == INFINITY) {
            throw InvalidArgument("logit_bias: the bias of token " + std::to_string(id) + " must be a finite number "
                                  "(or -inf to ban the token), got " + std::to_string(bias));
        }
    }
    if (o.penalty_last_n < -1) {
        throw InvalidArgument("penalty_last_n must be >= -1 (-1 = the whole context, 0 = off), got " +
                              std::to_string(o.penalty_last_n));
    }
}

} // namespace specllm
