#include "specllm/policy.h"

#include <algorithm>

namespace specllm {

Choice default_source(const StepContext & ctx, int k) {
    Choice c;
    c.ngram = ctx.has_ngram && (!ctx.has_model || ctx.ngram_match >= ctx.hybrid_min_match);
    c.k = std::min(k, ctx.k_max);
    if (c.ngram && ctx.ngram_match == 0) {
        c.k = 0; // nothing to propose
    }
    if (!c.ngram && !ctx.has_model) {
        c.k = 0;
    }
    return c;
}

void HeuristicPolicy::update(const StepOutcome & o) {
    if (o.n_drafted > 0 && o.n_accepted == o.n_drafted) {
        k_ = std::min(k_ + 2, k_limit_);
    } else {
        k_ = std::max(k_ - 1, 1);
    }
}

} // namespace specllm
