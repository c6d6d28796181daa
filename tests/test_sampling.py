"""Sampling (temperature > 0): seeds reproduce, speculative sampling follows the target's distribution exactly (a
statistical test that a deliberately wrong verifier must fail), and bad options are refused with clear messages."""

from collections import Counter

import pytest

import specllm
from helpers import check_stats, chi2_critical, chi2_two_sample, total_variation

PROMPT = "Hello world"
SAMPLING = dict(temperature=1.0, top_k=8)  # at most 8 x 8 outcomes for two tokens
N_SAMPLES = 3000


def test_same_seed_same_text(tiny, make_llm):
    # short: two threads on a tiny model spend most of their time spinning when the machine is busy
    kw = dict(max_tokens=12, temperature=0.9, top_p=0.95, min_p=0.02, draft_length=3)
    one = make_llm(tiny["target"], tiny["near_draft"])
    two = make_llm(tiny["target"], tiny["near_draft"], n_threads=2)
    runs = [one.generate(PROMPT, seed=42, **kw) for _ in range(2)] + [two.generate(PROMPT, seed=42, **kw)]
    assert runs[0].tokens == runs[1].tokens == runs[2].tokens
    assert runs[0].stats.seed == 42
    check_stats(runs[0])
    others = {tuple(one.generate(PROMPT, seed=s, **kw).tokens) for s in range(1, 6)}
    assert len(others) > 1, "five seeds gave one text: the seed is not used"
    # the LLM's default seed applies to every call that gives none
    seeded = make_llm(tiny["target"], tiny["near_draft"], seed=42)
    assert seeded.generate(PROMPT, **kw).tokens == runs[0].tokens


def test_no_seed_draws_one_and_reports_it(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["near_draft"])
    kw = dict(max_tokens=24, temperature=0.9, draft_length=3)
    first = llm.generate(PROMPT, **kw)
    seeds = {first.stats.seed} | {llm.generate(PROMPT, **kw).stats.seed for _ in range(3)}
    assert len(seeds) == 4, seeds
    assert llm.generate(PROMPT, seed=first.stats.seed, **kw).tokens == first.tokens  # the reported seed replays


@pytest.mark.parametrize("k", [1, 4])
def test_draft_equal_to_target_accepts_everything_when_sampling(tiny, make_llm, k):
    llm = make_llm(tiny["target"], tiny["target"])
    for seed in range(5):
        c = llm.generate(PROMPT, max_tokens=40, temperature=0.8, seed=seed, draft_length=k)
        assert c.stats.acceptance_rate == 1.0, c.stats
        check_stats(c, k_max=k)


def joint_first_two(llm, n, first_seed=0, **kw):
    """Counts of (token 1, token 2) over seeds first_seed .. first_seed + n - 1."""
    return Counter(tuple(llm.generate(PROMPT, seed=s, **kw).tokens[:2]) for s in range(first_seed, first_seed + n))


@pytest.fixture(scope="module")
def plain_joint(tiny, make_llm):
    # plain sampling draws each token from p with the seeded generator; max_tokens does not change the first two
    return joint_first_two(make_llm(tiny["target"]), N_SAMPLES, max_tokens=2, **SAMPLING)


# The test statistic: chi-square homogeneity of the speculative and the plain samples of (token 1, token 2), N_SAMPLES
# each, cells with an expected count < 5 pooled. If both follow the same distribution it is ~ chi2(df) (df ~ 30 here):
# the bound, chi2's 1e-4 upper quantile (~2.2 df), is exceeded by a correct sampler with probability 1e-4 (and the
# seeds are fixed, so the outcome is reproducible). The deliberately wrong verifier below (resampling a rejected
# position from p instead of the residual max(0, p - q)) shifts the distribution by a total variation of ~0.15 with
# near_draft, which puts its statistic around 250, far above the bound (~65). The standard tiny draft cannot reveal
# that mistake: its top-8 tokens barely overlap the target's, and where q(x) ~ 0 the residual equals p.
# k + 1 = max_tokens: the first step drafts k tokens (the budget caps a draft at max_tokens - 1), so positions 1 and 2
# of the joint go through acceptance at draft positions 0 and 1.
# With coupled acceptance (the default) a seed gives exactly plain sampling's text (test_seed.py), so a sample over
# the plain sample's own seeds would match it trivially: the speculative samples use other seeds (N_SAMPLES..).
@pytest.mark.parametrize("acceptance", ["coupled", "rejection"])
@pytest.mark.parametrize("draft,k", [("near_draft", 3), ("draft", 2)])
def test_speculative_sampling_follows_the_target_distribution(tiny, make_llm, plain_joint, draft, k, acceptance):
    llm = make_llm(tiny["target"], tiny[draft])
    spec = joint_first_two(llm, N_SAMPLES, N_SAMPLES, max_tokens=k + 1, draft_length=k, acceptance=acceptance,
                           **SAMPLING)
    stat, df = chi2_two_sample(spec, plain_joint)
    bound = chi2_critical(df)
    assert stat < bound, (f"speculative sampling does not follow the target's distribution: chi2={stat:.1f} >= "
                          f"{bound:.1f} (df={df}), total variation {total_variation(spec, plain_joint):.3f}")


# the wrong variants: rejection resamples a rejected position from p instead of the residual; coupled accepts a
# draft token unequal to the target's draw with probability min(1, p/q)
@pytest.mark.parametrize("acceptance", ["coupled", "rejection"])
def test_a_wrong_verifier_fails_the_distribution_test(tiny, make_llm, plain_joint, acceptance):
    llm = make_llm(tiny["target"], tiny["near_draft"])
    llm._engine.set_wrong_sampling_for_tests(True)
    wrong = joint_first_two(llm, N_SAMPLES, N_SAMPLES, max_tokens=4, draft_length=3, acceptance=acceptance,
                            **SAMPLING)
    stat, df = chi2_two_sample(wrong, plain_joint)
    assert stat > 2 * chi2_critical(df), (
        f"the distribution test cannot tell a wrong verifier (chi2={stat:.1f}, bound {chi2_critical(df):.1f}, "
        f"total variation {total_variation(wrong, plain_joint):.3f}): it would not catch a real mistake either")


@pytest.fixture(scope="module")
def first_token_p_q(tiny, make_llm, plain_joint):
    """Estimates of the target's (p) and the near draft's (q) first-token distributions, from plain sampling."""
    p = Counter(first for first, _ in plain_joint.elements())
    draft_alone = make_llm(tiny["near_draft"])
    q = Counter(draft_alone.generate(PROMPT, seed=s, max_tokens=1, **SAMPLING).tokens[0] for s in range(N_SAMPLES))
    return {x: n / N_SAMPLES for x, n in p.items()}, {x: n / N_SAMPLES for x, n in q.items()}


def acceptance_rate(llm, **kw):
    """How often one drafted token (max_tokens=2 caps the draft at 1) is accepted, over N_SAMPLES seeds."""
    return sum(llm.generate(PROMPT, seed=s, max_tokens=2, draft_length=1, **kw, **SAMPLING).stats.n_accepted
               for s in range(N_SAMPLES)) / N_SAMPLES


def test_rejection_sampling_accepts_as_often_as_theory_says(tiny, make_llm, first_token_p_q):
    # One drafted token is accepted with probability sum_x min(p(x), q(x)) = 1 - tv(p, q). "Sample from p and
    # accept iff equal to the draft" would accept with sum_x p(x) q(x), which is never more.
    p, q = first_token_p_q
    overlap = sum(min(p.get(x, 0), q[x]) for x in q)
    match = sum(p.get(x, 0) * q[x] for x in q)
    rate = acceptance_rate(make_llm(tiny["target"], tiny["near_draft"]), acceptance="rejection")
    # standard error of each estimate is below sqrt(0.25 / 3000) ~ 0.01; 0.05 is about 4 of them for the difference
    assert abs(rate - overlap) < 0.05, (rate, overlap)
    assert rate > match + 0.05, (rate, match)


def test_coupled_acceptance_is_between_the_coupling_bounds(tiny, make_llm, first_token_p_q):
    # Draft and target drawn with one key agree with probability between (1 - tv) / (1 + tv) (the Gumbel-max
    # coupling's guarantee) and 1 - tv (no coupling does better), and far more often than independent draws do
    p, q = first_token_p_q
    overlap = sum(min(p.get(x, 0), q[x]) for x in q)
    tv = 1 - overlap
    match = sum(p.get(x, 0) * q[x] for x in q)
    rate = acceptance_rate(make_llm(tiny["target"], tiny["near_draft"]), acceptance="coupled")
    assert (1 - tv) / (1 + tv) - 0.05 < rate < overlap + 0.05, (rate, tv)
    assert rate > match + 0.05, (rate, match)


@pytest.mark.parametrize("options,error,message", [
    (dict(temperature=-0.5), specllm.InvalidOptionError, r"temperature must be a finite number >= 0"),
    (dict(temperature=float("inf")), specllm.InvalidOptionError, r"temperature must be a finite number"),
    (dict(temperature=float("nan")), specllm.InvalidOptionError, r"temperature must be"),
    (dict(top_p=0.0), specllm.InvalidOptionError, r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), specllm.InvalidOptionError, r"top_p must be in \(0, 1\]"),
    (dict(top_k=-1), specllm.InvalidOptionError, r"top_k must be >= 0"),
    (dict(min_p=1.5), specllm.InvalidOptionError, r"min_p must be in \[0, 1\]"),
    (dict(min_p=-0.1), specllm.InvalidOptionError, r"min_p must be in \[0, 1\]"),
    (dict(acceptance="gumbel"), specllm.InvalidOptionError, r"acceptance must be 'coupled'.* or 'rejection'"),
    (dict(max_tokens=-1), specllm.InvalidOptionError, r"max_tokens must be >= 0 \(0: process the prompt only\), got -1"),
    (dict(draft_length=-1), specllm.InvalidOptionError, r"draft_length must be >= 0"),
    (dict(draft_length=49), specllm.InvalidOptionError, r"draft_length must be at most 48"),
    (dict(draft_length="fast"), specllm.InvalidOptionError, r"draft_length must be an int >= 0, 'auto' or 'heuristic'"),
    (dict(draft_p_min=2.0), specllm.InvalidOptionError, r"draft_p_min must be in \[0, 1\]"),
    (dict(seed=-3), specllm.InvalidOptionError, r"seed must be >= 0"),
    (dict(max_tokens="5"), TypeError, r"max_tokens must be an int, got str"),
    (dict(max_tokens=5.0), TypeError, r"max_tokens must be an int, got float"),
    (dict(temperature="hot"), TypeError, r"temperature must be a number, got str"),
    (dict(top_k=True), TypeError, r"top_k must be an int, got bool"),
    (dict(stop=3), TypeError, r"stop must be a string or a list of strings"),
    (dict(stop=["ok", None]), TypeError, r"stop must be a string or a list of strings"),
    (dict(temprature=0.5), TypeError, r"temprature"),
])
def test_bad_options_are_refused(tiny, make_llm, options, error, message):
    llm = make_llm(tiny["target"], tiny["draft"])
    with pytest.raises(error, match=message):
        llm.generate(PROMPT, **options)
    with pytest.raises(error, match=message):
        llm.stream(PROMPT, **options)  # refused when called, not at the first next()
    assert llm.generate(PROMPT, max_tokens=3).finish_reason == "length"  # and the LLM still works


@pytest.mark.parametrize("prompt,error,message", [
    (5, TypeError, r"prompt must be a str or a list of token ids, got int"),
    (b"bytes", TypeError, r"prompt must be a str or a list of token ids, got bytes"),
    ([1, "2"], TypeError, r"prompt must be a str or a list of token ids"),
    ([1, 100000], specllm.InvalidOptionError, r"token ids must be in \[0, 299\), got 100000"),
    ([], specllm.InvalidOptionError, r"prompt is empty"),
])
def test_bad_prompts_are_refused(tiny, make_llm, prompt, error, message):
    llm = make_llm(tiny["target"], tiny["draft"])
    with pytest.raises(error, match=message):
        llm.generate(prompt, max_tokens=4)
    assert llm.generate(PROMPT, max_tokens=3).finish_reason == "length"


def test_invalid_option_error_is_a_value_error():
    assert issubclass(specllm.InvalidOptionError, ValueError)
    assert issubclass(specllm.InvalidOptionError, specllm.SpecLLMError)


def test_a_top_p_below_float32s_least_keeps_the_top_token(tiny, make_llm):
    """top_p=1e-300 is 0 as a float32: it was refused with "top_p must be in (0, 1], got 1e-300"."""
    llm = make_llm(tiny["target"])
    tiny_p = llm.generate(PROMPT, max_tokens=6, temperature=0.8, top_p=1e-300, seed=3)
    greedy = llm.generate(PROMPT, max_tokens=6)
    assert tiny_p.tokens == greedy.tokens  # only the most likely token is left to sample
