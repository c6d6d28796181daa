"""Speculative sampling follows the target's distribution beyond the first two tokens (test_sampling.py): at later
positions after partial accepts (also under repetition penalties), for the bonus token after a full accept, with
n-gram (one-hot) drafts, and for temperature, top-p and min-p against an independent numpy reference of the warped
distribution. A deliberately wrong verifier must fail these tests too.

Every test is chi-square at the 1e-4 level (helpers.chi2_critical) on fixed seeds, so the outcome is reproducible. With
coupled acceptance a seed gives exactly plain sampling's text (test_seed.py): each sample uses its own N seeds
(plain 0..N-1, speculative N..2N-1, or disjoint per sampler), or the coupled ones would repeat plain sampling's."""

from collections import Counter

import numpy as np
import pytest
from helpers import chi2_critical, chi2_two_sample, total_variation

N = 3000
PROMPT = "Hello world"
K = 3
# top-k 4 (test_sampling.py uses 8 for the first two tokens): the top-k sets at positions 3 and 4 depend on the
# prefix, so the joint of two later tokens has ~50 cells with 4 (~140 with 8, where the wrong verifier's statistic
# stays within 2x the bound)
SAMPLING = dict(temperature=1.0, top_k=4)
MODES = ["coupled", "rejection"]

ACCEPTED, REJECTED, BONUS, PLAIN = "accepted", "rejected", "bonus", "plain"


def run(llm, prompt, seed, **kw):
    """(tokens, kinds, steps) of one generation: kinds[i] says how token i was chosen (an ACCEPTED draft token, the
    target's token at a REJECTED draft position, the BONUS token after a full accept, or a PLAIN step without a
    draft) and steps lists each step's (n_drafted, n_accepted), from the stream's one chunk per step."""
    tokens, kinds, steps = [], [], []
    with llm.stream(prompt, seed=seed, **kw) as stream:
        for chunk in stream:
            if not chunk.tokens:
                continue
            steps.append((chunk.n_drafted, chunk.n_accepted))
            for j, t in enumerate(chunk.tokens):
                tokens.append(t)
                if j < chunk.n_accepted:
                    kinds.append(ACCEPTED)
                elif chunk.n_drafted == 0:
                    kinds.append(PLAIN)
                elif j < chunk.n_drafted:
                    kinds.append(REJECTED)
                else:
                    kinds.append(BONUS)
    return tokens, kinds, steps


def sample(llm, prompt, seeds, **kw):
    return [run(llm, prompt, s, **kw) for s in seeds]


def joint(samples, start, stop):
    """Counts of the tokens at positions start..stop-1 (a shorter tuple if the generation ended earlier)."""
    return Counter(tuple(tokens[start:stop]) for tokens, _, _ in samples)


def kinds_at(samples, i):
    return Counter(kinds[i] if i < len(kinds) else "none" for _, kinds, _ in samples)


def speculative(make_llm, target, draft, wrong=False):
    llm = make_llm(target, draft)
    if wrong:
        llm._engine.set_wrong_sampling_for_tests(True)
    return llm


def homogeneity(spec, plain, start, stop):
    """(chi2, bound, message) of the joint of positions start..stop-1 in the speculative and the plain sample."""
    a, b = joint(spec, start, stop), joint(plain, start, stop)
    stat, df = chi2_two_sample(a, b)
    bound = chi2_critical(df)
    return stat, bound, (f"positions {start}..{stop - 1}: chi2={stat:.1f}, bound {bound:.1f} (df={df}), "
                         f"total variation {total_variation(a, b):.3f}")


@pytest.fixture(scope="module")
def plain_hello(tiny, make_llm):
    """N plain samples of 6 tokens (seeds 0..N-1): the reference of the later-position and the bonus tests."""
    return sample(make_llm(tiny["target"]), PROMPT, range(N), max_tokens=6, **SAMPLING)


# --- later positions: the joint of tokens 3 and 4 after drafted steps with partial accepts

# near_draft with k = 3 and max_tokens = 6: the first step drafts positions 0-2, so positions 3 and 4 come from a
# second (or third) step's drafts, or are the bonus of a full accept; the budget caps a draft at the tokens left - 1,
# which never leaves positions 3 and 4 undrafted (only position 5 can be a plain step).
def later_positions(make_llm, tiny, acceptance, wrong=False):
    llm = speculative(make_llm, tiny["target"], tiny["near_draft"], wrong)
    return sample(llm, PROMPT, range(N, 2 * N), max_tokens=6, draft_length=K, acceptance=acceptance, **SAMPLING)


@pytest.mark.parametrize("acceptance", MODES)
def test_later_positions_follow_the_target_distribution(tiny, make_llm, plain_hello, acceptance):
    spec = later_positions(make_llm, tiny, acceptance)
    # the prefix went through verification with partial accepts: the first step drafted K tokens and accepted
    # some but not all of them in a good share of the samples
    first = Counter(steps[0] for _, _, steps in spec)
    assert all(d == K for d, _ in first), first
    partial = sum(n for (d, a), n in first.items() if 0 < a < d)
    assert partial > 0.25 * N, first
    # positions 3 and 4 themselves were verified draft positions (or bonus tokens), never plain steps, and were
    # both accepted and rejected often
    for i in (3, 4):
        kinds = kinds_at(spec, i)
        assert kinds[PLAIN] == 0 and kinds["none"] < 0.01 * N, (i, kinds)
        assert kinds[ACCEPTED] > 0.3 * N and kinds[REJECTED] > 0.1 * N, (i, kinds)
    stat, bound, msg = homogeneity(spec, plain_hello, 3, 5)
    assert stat < bound, f"speculative sampling does not follow the target's distribution at later positions: {msg}"


# --- under repetition penalties: each verified row is penalized by the tokens before it, the accepted drafts included
# (llama.cpp's penalties sampler; test_penalties.py checks coupled sampling's text against plain sampling's)
PENALTIES = dict(repeat_penalty=1.6, frequency_penalty=0.6, presence_penalty=0.4)


@pytest.fixture(scope="module")
def plain_penalized(tiny, make_llm):
    return sample(make_llm(tiny["target"]), PROMPT, range(N), max_tokens=6, **SAMPLING, **PENALTIES)


@pytest.mark.parametrize("acceptance", MODES)
def test_later_positions_follow_the_penalized_target_distribution(tiny, make_llm, plain_hello, plain_penalized,
                                                                  acceptance):
    llm = speculative(make_llm, tiny["target"], tiny["near_draft"])
    spec = sample(llm, PROMPT, range(N, 2 * N), max_tokens=6, draft_length=K, acceptance=acceptance, **SAMPLING,
                  **PENALTIES)
    first = Counter(steps[0] for _, _, steps in spec)
    assert sum(n for (d, a), n in first.items() if 0 < a < d) > 0.2 * N, first  # partial accepts
    for i in (3, 4):
        kinds = kinds_at(spec, i)
        assert kinds[ACCEPTED] > 0.2 * N and kinds[REJECTED] > 0.1 * N, (i, kinds)
    stat, bound, msg = homogeneity(spec, plain_penalized, 3, 5)
    assert stat < bound, f"speculative sampling does not follow the penalized target's distribution: {msg}"
    # the check can fail: the penalties move the joint of positions 3 and 4 far from the unpenalized target's
    stat, bound, msg = homogeneity(spec, plain_hello, 3, 5)
    assert stat > 2 * bound, f"the penalties do not move positions 3 and 4 enough to be tested: {msg}"


# --- the bonus token after a full accept

# the draft is the target itself: every draft token is accepted, so with max_tokens = K + 2 the first step drafts K
# tokens, accepts them all and token K (0-based) is its bonus, drawn from the target's row after the last draft
@pytest.mark.parametrize("acceptance", MODES)
def test_the_bonus_token_after_a_full_accept_follows_the_target_distribution(tiny, make_llm, plain_hello, acceptance):
    llm = make_llm(tiny["target"], tiny["target"])
    spec = sample(llm, PROMPT, range(N, 2 * N), max_tokens=K + 2, draft_length=K, acceptance=acceptance, **SAMPLING)
    first = Counter(steps[0] for _, _, steps in spec)
    # p = q up to the rounding of two contexts: rejection sampling accepts with min(1, p/q) ~ 1
    assert first[(K, K)] > 0.99 * N, first
    assert kinds_at(spec, K)[BONUS] > 0.99 * N, kinds_at(spec, K)
    stat, bound, msg = homogeneity(spec, plain_hello, K - 1, K + 1)  # the last accepted draft token and the bonus
    assert stat < bound, f"the bonus token does not follow the target's distribution: {msg}"


# --- n-gram (one-hot) drafts

NGRAM_MARK = [270, 280]  # two word tokens ("d", " s") of the tiny vocabulary


@pytest.fixture(scope="module")
def ngram_prompt(tiny, make_llm):
    """A prompt that ends with a bigram seen earlier, followed there by the two tokens greedy decoding gives after
    the prompt: n-gram lookup drafts the target's likeliest tokens (at T = 1, top-k 4 about 3/4 accepted). A fixed
    point, found by iterating: the tokens after the first bigram change the continuation after the second."""
    llm = make_llm(tiny["target"])
    head, tail = llm.prompt_tokens(PROMPT), llm.tokenize(" and then", add_special=False)
    follow = []
    for _ in range(10):
        prompt = head + NGRAM_MARK + follow + tail + NGRAM_MARK
        greedy = llm.generate(prompt, max_tokens=2, temperature=0.0).tokens
        if greedy == follow:
            return prompt
        follow = greedy
    pytest.fail(f"no fixed point for the n-gram prompt: the last candidate continues {follow}")


@pytest.fixture(scope="module")
def plain_ngram(tiny, make_llm, ngram_prompt):
    return sample(make_llm(tiny["target"]), ngram_prompt, range(N), max_tokens=3, **SAMPLING)


# max_tokens = 3 caps the first draft at 2: token 0 is always a drafted position, token 1 is one when token 0 was
# accepted. One-hot q: rejection sampling accepts d with probability p(d), and on rejection draws from p without d.
def ngram_drafted(make_llm, tiny, ngram_prompt, acceptance, wrong=False):
    llm = speculative(make_llm, tiny["target"], "ngram", wrong)
    return sample(llm, ngram_prompt, range(N, 2 * N), max_tokens=3, draft_length=K, acceptance=acceptance,
                  **SAMPLING)


@pytest.mark.parametrize("acceptance", MODES)
def test_ngram_drafts_follow_the_target_distribution(tiny, make_llm, ngram_prompt, plain_ngram, acceptance):
    spec = ngram_drafted(make_llm, tiny, ngram_prompt, acceptance)
    assert all(steps[0][0] == 2 for _, _, steps in spec), Counter(steps[0] for _, _, steps in spec)
    k0, k1 = kinds_at(spec, 0), kinds_at(spec, 1)
    assert k0[ACCEPTED] > 0.3 * N and k0[REJECTED] > 0.2 * N, k0
    assert k1[ACCEPTED] > 0.15 * N and k1[REJECTED] > 0.1 * N, k1
    stat, bound, msg = homogeneity(spec, plain_ngram, 0, 2)
    assert stat < bound, f"sampling with n-gram drafts does not follow the target's distribution: {msg}"


# --- under a grammar that forbids many of the draft's tokens: the draft is cut at its first forbidden token, so a
# verified draft token was drawn from q given that the grammar allows it. Rejection sampling read it with q itself,
# and the cut mass went to p instead of the residual: the first token's total variation from plain was 0.09
LETTERS = dict(temperature=1.0, grammar="root ::= [a-zA-Z ]+")


@pytest.mark.parametrize("acceptance", MODES)
def test_a_grammar_that_cuts_drafts_keeps_the_target_distribution(tiny, make_llm, acceptance):
    plain = sample(make_llm(tiny["target"]), PROMPT, range(N), max_tokens=2, **LETTERS)
    spec = sample(make_llm(tiny["target"], tiny["near_draft"]), PROMPT, range(N, 2 * N), max_tokens=2,
                  draft_length=1, acceptance=acceptance, **LETTERS)
    first = Counter(steps[0] for _, _, steps in spec)
    # the draft was cut (no draft left: a plain step) and kept, each often
    assert first[(0, 0)] > 0.2 * N and first[(1, 1)] + first[(1, 0)] > 0.2 * N, first
    stat, bound, msg = homogeneity(spec, plain, 0, 1)
    assert stat < bound, f"{acceptance} sampling under a grammar does not follow the target's distribution: {msg}"


# --- the deliberately wrong verifier fails the later-position and the n-gram tests

# rejection: a rejected position is resampled from p instead of the residual max(0, p - q); coupled: a draft token
# unequal to the target's draw is still accepted with probability min(1, p/q). The bonus test cannot see either (a
# draft equal to the target is never rejected).
@pytest.mark.parametrize("acceptance", MODES)
@pytest.mark.parametrize("where", ["later", "ngram"])
def test_a_wrong_verifier_fails(tiny, make_llm, plain_hello, plain_ngram, ngram_prompt, where, acceptance):
    if where == "later":
        wrong = later_positions(make_llm, tiny, acceptance, wrong=True)
        stat, bound, msg = homogeneity(wrong, plain_hello, 3, 5)
    else:
        wrong = ngram_drafted(make_llm, tiny, ngram_prompt, acceptance, wrong=True)
        stat, bound, msg = homogeneity(wrong, plain_ngram, 0, 2)
    assert stat > 2 * bound, f"the {where} test cannot tell a wrong verifier: {msg}"


# --- temperature, top-p and min-p against an independent numpy reference of the first token's distribution

def reference_distribution(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                           order=("top_k", "top_p", "min_p"), temperature_last=False):
    """{token: probability} of the warped distribution, from the definitions: softmax(logits / temperature); top-k
    keeps the k likeliest tokens; top-p keeps the smallest set of the likeliest remaining tokens whose renormalized
    mass reaches top_p; min-p keeps the remaining tokens at least min_p times as likely as the likeliest one; the
    kept tokens' probabilities renormalized. Also the smallest distance of a cut to its threshold (a cut closer than
    float rounding would make the reference ambiguous). order: the filters' order (the documented one by default).
    temperature_last: the filters read softmax(logits) and the kept tokens are scaled by the temperature at the end
    (llama.cpp's chain)."""
    z = np.asarray(logits, dtype=np.float64) / (1.0 if temperature_last else temperature)
    p = np.exp(z - z.max())
    p /= p.sum()
    kept = np.argsort(-p, kind="stable")  # stays sorted by descending probability
    margin = np.inf
    for name in order:
        if name == "top_k" and top_k:
            kept = kept[:top_k]
        elif name == "top_p" and top_p < 1.0:
            cum = np.cumsum(p[kept]) / p[kept].sum()
            n = int(np.count_nonzero(cum < top_p)) + 1  # the first prefix whose mass reaches top_p
            n = min(n, len(kept))
            margin = min(margin, abs(cum[n - 1] - top_p), abs(cum[n - 2] - top_p) if n >= 2 else np.inf)
            kept = kept[:n]
        elif name == "min_p" and min_p > 0.0:
            ratio = p[kept] / p[kept].max()
            margin = min(margin, float(np.min(np.abs(ratio - min_p))))
            kept = kept[ratio >= min_p]
    if temperature_last:
        scaled = np.asarray(logits, dtype=np.float64)[kept] / temperature
        q = np.exp(scaled - scaled.max())
        q /= q.sum()
    else:
        q = p[kept] / p[kept].sum()
    return dict(zip(kept.tolist(), q.tolist())), margin


def chi2_goodness_of_fit(counts, probs, min_expected=5.0):
    """Chi-square statistic of counts against the distribution probs and its degrees of freedom (cells with an expected
    count below min_expected pooled), and the counts of tokens outside probs' support (which must be none)."""
    n = sum(counts.values())
    outside = {x: c for x, c in counts.items() if x not in probs}
    cells, pool = [], [0, 0.0]
    for x, px in probs.items():
        if n * px < min_expected:
            pool[0] += counts.get(x, 0)
            pool[1] += n * px
        else:
            cells.append((counts.get(x, 0), n * px))
    if pool[1] > 0:
        cells.append(tuple(pool))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    return stat, len(cells) - 1, outside


@pytest.fixture(scope="module")
def first_token_logits(tiny, make_llm):
    """The target's logits after PROMPT, from llama-cpp-python's own evaluation of the same prompt tokens."""
    import llama_cpp

    tokens = make_llm(tiny["target"]).prompt_tokens(PROMPT)
    model = llama_cpp.Llama(model_path=tiny["target"], n_ctx=64, n_threads=1, n_threads_batch=1, logits_all=True,
                            verbose=False)
    try:
        model.eval(tokens)
        logits = np.array(model.scores[len(tokens) - 1], dtype=np.float64)
    finally:
        model.close()
    assert np.isfinite(logits).all() and logits.std() > 0.1, logits
    return logits


CASES = {
    "T0.5": dict(temperature=0.5),
    "T1.5": dict(temperature=1.5),
    "T1.5-top_p0.8": dict(temperature=1.5, top_p=0.8),
    "T1.5-min_p0.1": dict(temperature=1.5, min_p=0.1),
    # the filters' order matters here: top-p over all tokens (not the top-k's renormalized mass), min-p before
    # top-p, or the filters on T = 1 probabilities would each keep another set of tokens (checked below)
    "T1.5-top_k6-top_p0.8-min_p0.1": dict(temperature=1.5, top_k=6, top_p=0.8, min_p=0.1),
    # llama-server's chain (its /completion and /infill): the filters on the unscaled distribution, temperature last
    "last-T1.5-top_p0.8-min_p0.1": dict(temperature=1.5, top_p=0.8, min_p=0.1, temperature_last=True),
}


SAMPLERS = ["plain"] + MODES


def first_tokens(tiny, make_llm, sampler, options):
    """Counts of the first token over N seeds, disjoint for each sampler (coupled acceptance would otherwise repeat
    plain sampling's sample): plain sampling, or speculative (near_draft, the first token a drafted position:
    max_tokens = 2 caps the draft at 1)."""
    seeds = range(N * SAMPLERS.index(sampler), N * (SAMPLERS.index(sampler) + 1))
    if sampler == "plain":
        llm, kw = make_llm(tiny["target"]), dict(max_tokens=1)
    else:
        llm, kw = make_llm(tiny["target"], tiny["near_draft"]), dict(max_tokens=2, draft_length=1, acceptance=sampler)
    runs = sample(llm, PROMPT, seeds, **kw, **options)
    if sampler != "plain":
        first = Counter(steps[0] for _, _, steps in runs)
        assert first[(1, 1)] > 0.05 * N and first[(1, 0)] > 0.05 * N, first  # drafted, accepted and rejected
        assert first[(1, 1)] + first[(1, 0)] == N, first
    return Counter(tokens[0] for tokens, _, _ in runs)


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("case", list(CASES))
def test_first_token_matches_the_numpy_reference(tiny, make_llm, first_token_logits, case, sampler):
    options = CASES[case]
    want, margin = reference_distribution(first_token_logits, **options)
    assert margin > 1e-3, f"a cut of the reference is within {margin:.2g} of its threshold: pick other options"
    if options.get("temperature_last"):  # the case tells the two orders apart
        first, _ = reference_distribution(first_token_logits, **dict(options, temperature_last=False))
        assert 0.5 * sum(abs(want.get(x, 0.0) - first.get(x, 0.0)) for x in set(want) | set(first)) > 0.05
    if "top_k" in options:  # the combination can tell the documented order from the others
        for order in [("top_k", "min_p", "top_p"), ("top_p", "top_k", "min_p")]:
            other, _ = reference_distribution(first_token_logits, order=order, **options)
            tv = 0.5 * sum(abs(want.get(x, 0.0) - other.get(x, 0.0)) for x in set(want) | set(other))
            assert tv > 0.05, (order, tv)
        at_t1, _ = reference_distribution(first_token_logits * options["temperature"], **options)
        assert set(at_t1) != set(want)
    counts = first_tokens(tiny, make_llm, sampler, options)
    stat, df, outside = chi2_goodness_of_fit(counts, want)
    assert not outside, f"tokens outside the reference's support {sorted(want)}: {outside}"
    bound = chi2_critical(max(df, 1))
    top = sorted(want, key=want.get, reverse=True)[:6]
    assert stat < bound, (f"{sampler} sampling does not follow the reference ({case}): chi2={stat:.1f}, bound "
                          f"{bound:.1f} (df={df}); expected {[round(N * want[x], 1) for x in top]}, observed "
                          f"{[counts.get(x, 0) for x in top]} for tokens {top}")
