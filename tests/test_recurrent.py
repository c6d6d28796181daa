"""Models whose memory cannot be cut back (recurrent state: Mamba, RWKV; hybrid-memory families): llama.cpp refuses a
partial cut, so the engine must not believe it happened. They decode plainly (a log line says why), a prompt that
differs from the cached one is evaluated again from its start, and they never get stuck."""

import logging

import pytest

import specllm
from specllm import _core

PROMPTS = ["Hello world", "Hello there, how are you", "Hello world"]


@pytest.fixture(scope="module")
def plain_outputs(tiny, make_llm):
    """Each prompt's output from an LLM of its own (nothing cached before it)."""
    out = {}
    for p in set(PROMPTS):
        with make_llm(tiny["recurrent"]) as llm:
            out[p] = llm.generate(p, max_tokens=12).tokens
    return out


def check_memory(llm):
    """llama.cpp's memory holds the state after exactly the positions specllm believes are cached (a recurrent
    state is one cell: its lowest and highest position are both the last one)."""
    target = llm._engine.target
    n = target.n_past
    assert (target.memory_pos_min, target.memory_pos_max) == ((n - 1, n - 1) if n else (-1, -1))


def test_a_recurrent_model_generates_again_and_again(tiny, make_llm, plain_outputs):
    llm = make_llm(tiny["recurrent"])
    assert not llm._engine.target.can_rollback
    for p in PROMPTS + PROMPTS:  # the same prompt twice, a different one, back: each needs a cut that fails
        assert llm.generate(p, max_tokens=12).tokens == plain_outputs[p], p
        check_memory(llm)


def test_a_recurrent_model_reuses_a_conversation_prefix(tiny, make_llm):
    llm = make_llm(tiny["recurrent"])
    first = llm.generate("Hello world", max_tokens=8)
    prompt = llm.tokenize("Hello world") + first.tokens  # the next turn extends what is cached: no cut needed
    second = llm.generate(prompt + llm.tokenize("and", add_special=False), max_tokens=8)
    assert second.stats.n_cached >= len(prompt) - 1
    check_memory(llm)
    with make_llm(tiny["recurrent"]) as fresh:
        assert fresh.generate(prompt + llm.tokenize("and", add_special=False), max_tokens=8).tokens == second.tokens


@pytest.mark.parametrize("draft", ["ngram", "draft"])
def test_a_recurrent_target_drafts_nothing_and_says_why(tiny, make_llm, plain_outputs, caplog, draft):
    with caplog.at_level(logging.WARNING, logger="specllm"):
        llm = make_llm(tiny["recurrent"], "ngram" if draft == "ngram" else tiny["draft"], profile_costs=True)
    assert "drafting is off" in caplog.text and "recurrent state" in caplog.text
    assert llm._engine.draft_kind == _core.DraftKind.none
    assert llm.draft is None and llm.profile is None  # nothing to profile: no cost measurement ran
    for p in PROMPTS:
        c = llm.generate(p, max_tokens=12, draft_length=4)
        assert c.tokens == plain_outputs[p]
        assert c.stats.n_drafted == 0
        check_memory(llm)
    # set_draft on it does the same, without an error
    llm.set_draft("ngram")
    assert llm._engine.draft_kind == _core.DraftKind.none and llm.draft is None
    assert llm.generate(PROMPTS[1], max_tokens=12).tokens == plain_outputs[PROMPTS[1]]


def test_a_recurrent_draft_model_is_refused(tiny, make_llm):
    with pytest.raises(specllm.IncompatibleDraftError, match="recurrent state.*draft=\"ngram\""):
        make_llm(tiny["target"], tiny["recurrent"])
    llm = make_llm(tiny["target"], "ngram")
    with pytest.raises(specllm.IncompatibleDraftError, match="recurrent state"):
        llm.set_draft(tiny["recurrent"])
    assert llm._engine.draft_kind == _core.DraftKind.ngram  # the old drafter stays
    assert llm.generate("Hello world", max_tokens=4).tokens
