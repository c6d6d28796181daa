"""LLM.set_draft: another drafter for the same target, whose KV cache (a conversation's prefix) stays."""

import json
import logging

import pytest

import specllm
from specllm.chat_session import ChatSession

PROMPT = "The quick brown fox jumps over the lazy dog. " * 3


def test_switching_keeps_the_target_cache_and_the_output(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["draft"])
    plain = make_llm(tiny["target"]).generate(PROMPT + "And then", max_tokens=24).tokens
    first = llm.generate(PROMPT, max_tokens=8)
    for draft in ("ngram", None, tiny["near_draft"], tiny["draft"]):
        llm.set_draft(draft)
        assert llm.draft == draft and llm.draft_path == (draft if draft not in (None, "ngram") else None)
        c = llm.generate(PROMPT + "And then", max_tokens=24, draft_length=3)
        assert c.tokens == plain, draft
        assert c.stats.n_cached >= len(llm.tokenize(PROMPT)) - 2, draft  # the prefix was not evaluated again
        if draft is not None:
            assert c.stats.n_drafted > 0, draft
    assert first.tokens


def test_a_draft_that_cannot_load_leaves_the_old_one(tiny, make_llm, tmp_path):
    llm = make_llm(tiny["target"], "ngram")
    llm.generate(PROMPT, max_tokens=4)
    with pytest.raises(specllm.IncompatibleDraftError, match="vocabulary differs"):
        llm.set_draft(tiny["draft_other_vocab"])
    with pytest.raises(specllm.ModelLoadError, match="not found"):
        llm.set_draft(str(tmp_path / "missing.gguf"))
    with pytest.raises(TypeError, match="draft must be a path"):
        llm.set_draft(42)
    assert llm.draft == "ngram"
    c = llm.generate(PROMPT + PROMPT, max_tokens=16, draft_length=4)
    assert c.stats.n_ngram_steps > 0 and c.stats.n_cached > 0


def test_an_open_stream_left_idle_is_closed_for_set_draft(tiny, make_llm):
    llm = make_llm(tiny["target"], "ngram", stream_idle_timeout=0.3)
    stream = llm.stream(PROMPT, max_tokens=8)
    next(stream)
    llm.set_draft(None)  # waits 0.3 s for the idle stream, then closes it
    assert [c.finish_reason for c in stream] == ["cancelled"]
    assert llm.generate(PROMPT, max_tokens=4).stats.n_drafted == 0


def test_a_known_profile_lends_its_verify_costs(tiny, tmp_path, monkeypatch, caplog):
    """With a profile for the target, a new draft model only has its token cost measured: measuring the verify
    costs again would clear the target's KV cache."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path / "profiles"))
    llm = specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=512)
    verify = llm.profile["verify_ms"]
    llm.generate(PROMPT, max_tokens=4)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="specllm.profile"):
        llm.set_draft(tiny["draft"])
    assert not any("verify costs" in r.getMessage() for r in caplog.records)
    assert llm.profile["verify_ms"] == verify and llm.profile["draft_token_ms"] > 0
    assert llm.generate(PROMPT + "more", max_tokens=4).stats.n_cached > 0
    assert len(list((tmp_path / "profiles").glob("*.json"))) == 2  # the pair's profile is kept for next time


def test_the_policy_forgets_the_old_draft_model(tiny, make_llm):
    llm = make_llm(tiny["target"], tiny["far_draft"])
    llm._engine.set_verify_costs([10.0] * 8)  # flat: drafting pays, so "auto" drafts with the far draft
    llm._engine.set_draft_token_cost(0.1)
    llm.generate(PROMPT, max_tokens=48, draft_length="auto")
    assert llm._engine.acceptance_estimate(0)[0] < 0.5  # it learned that the far draft is mostly wrong
    llm.set_draft(tiny["near_draft"])
    assert llm._engine.acceptance_estimate(0)[0] == pytest.approx(0.6)  # the draft model's prior again


def test_chat_draft_switch_keeps_the_conversation_cached(tiny):
    s = ChatSession(tiny["target"], tiny["draft"], llm_options={"n_threads": 1, "n_ctx": 512, "profile_costs": False},
                    gen_options={"max_tokens": 12})
    s.reply("hello there")
    s.set_draft("ngram")
    assert s.draft_label == "ngram"
    assert s.reply("and again").stats.n_cached > 0  # a reload would have evaluated the whole conversation
    s.set_draft(tiny["draft"])
    assert s.draft_label == "draft.gguf +ngram" and s.reply("once more").stats.n_cached > 0


def _mark_busy(path):
    """Rewrites a cached profile as one a busy machine measured (T(2) far above two plain steps), at one load."""
    prof = json.loads(path.read_text())
    prof["verify_ms"][1] = 10 * prof["verify_ms"][0]
    prof["noisy"] = 1
    path.write_text(json.dumps(prof))
    assert not specllm.profile.plausible(prof["verify_ms"])


@pytest.mark.parametrize("busy", [False, True])
def test_a_plain_llm_gets_a_drafter_with_the_cached_target_profile(tiny, tmp_path, monkeypatch, busy):
    """An LLM made without a drafter has no profile; its first drafter borrows the cached profile of the target
    (here from an n-gram LLM), so the conversation's cache stays -- also when that profile was measured busy (a
    busy profile is measured again at a load, never when a drafter is swapped under a live cache)."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path / "profiles"))
    specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=512)  # measures and caches the target's profile
    (cached,) = (tmp_path / "profiles").glob("*.json")
    if busy:
        _mark_busy(cached)
    target = json.loads(cached.read_text())  # busy or not, as this machine measured it (the tiny model often is)
    target_ms, target_noisy = target["verify_ms"], specllm.profile.noisy_loads(target)
    llm = specllm.LLM(tiny["target"], None, n_threads=1, n_ctx=512)
    assert llm.profile is None
    llm.generate(PROMPT, max_tokens=4)
    llm.set_draft(tiny["draft"])
    assert llm.profile["draft_token_ms"] > 0
    assert llm.profile["verify_ms"] == target_ms  # borrowed, not measured
    assert specllm.profile.noisy_loads(llm.profile) == target_noisy  # the pair's file carries the borrowed count
    assert llm.generate(PROMPT + "more", max_tokens=4).stats.n_cached > 0
    llm.set_draft("ngram")  # the n-gram pair's own busy profile on file: taken as it is too
    assert llm.profile["verify_ms"] == target_ms
    assert llm.generate(PROMPT + "more and more", max_tokens=4).stats.n_cached > 0
    llm.set_draft(None)
    assert llm.profile is None and llm.draft_path is None and not llm.hybrid


def test_ctrl_c_during_the_load_is_raised_once_the_new_drafter_is_in_place(tiny, make_llm):
    import os
    import signal

    llm = make_llm(tiny["target"], "ngram")
    engine = llm._engine

    class Interrupted:  # Ctrl-C arrives while the core loads the new drafter
        def __getattr__(self, name):
            return getattr(engine, name)

        def set_drafter(self, *args):
            os.kill(os.getpid(), signal.SIGINT)
            engine.set_drafter(*args)

    llm._engine = Interrupted()
    with pytest.raises(KeyboardInterrupt):
        llm.set_draft(tiny["draft"])
    llm._engine = engine
    assert llm.draft == tiny["draft"] and llm.draft_path == tiny["draft"]  # what is said matches what is loaded
    assert engine.draft_kind == specllm._core.DraftKind.hybrid  # a draft model drafts with n-grams by default
    assert llm.generate(PROMPT, max_tokens=8, draft_length=2).stats.n_drafted > 0


def test_chat_sessions_draft_models_are_hybrid_unless_told(tiny):
    options = {"n_threads": 1, "n_ctx": 512, "profile_costs": False}
    assert ChatSession(tiny["target"], tiny["draft"], llm_options=options).draft_label == "draft.gguf +ngram"
    s = ChatSession(tiny["target"], "ngram", llm_options=options)
    s.set_draft(tiny["draft"])
    assert s.draft_label == "draft.gguf +ngram" and s.draft_model == tiny["draft"]
    s = ChatSession(tiny["target"], tiny["draft"], ngram=False, llm_options=options)
    assert s.draft_label == "draft.gguf"


def test_a_draft_model_drafts_with_ngrams_beside_it_unless_told(tiny):
    """As in specllm-cli: a draft model given by path is hybrid by default (on a CPU where the model cannot pay,
    n-grams are all that can); ngram=False is the draft model alone."""
    options = {"n_threads": 1, "n_ctx": 512, "profile_costs": False}
    llm = specllm.LLM(tiny["target"], tiny["draft"], **options)
    assert llm.hybrid and llm._engine.draft_kind == specllm._core.DraftKind.hybrid
    alone = specllm.LLM(tiny["target"], tiny["draft"], ngram=False, **options)
    assert not alone.hybrid and alone._engine.draft_kind == specllm._core.DraftKind.model
    alone.set_draft(tiny["near_draft"])
    assert alone.hybrid
    alone.set_draft(tiny["draft"], ngram=False)
    assert alone._engine.draft_kind == specllm._core.DraftKind.model
    ngram = specllm.LLM(tiny["target"], "ngram", **options)
    assert ngram._engine.draft_kind == specllm._core.DraftKind.ngram and not ngram.hybrid
