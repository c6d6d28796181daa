"""stream(): the chunks add up to generate()'s result, carry only complete UTF-8, and a stream left early (break,
close, an exception in the loop body) leaves the LLM consistent and usable."""

import pytest

from helpers import check_kv

PROMPTS = ["Hello world", "naïve café 🙂", "中文 über Straße", "the the the the the the"]
N = 40

DRAFTERS = {
    "plain": (None, False, 0),
    "draft": ("draft", False, 3),
    "near": ("near_draft", False, "heuristic"),
    "ngram": ("ngram", False, 4),
    "hybrid": ("near_draft", True, 4),
}


def load(tiny, make_llm, name):
    draft, ngram, _ = DRAFTERS[name]
    return make_llm(tiny["target"], tiny.get(draft, draft), ngram=ngram)


def raw_text(llm, tokens):
    """What the tokens' bytes decode to, invalid bytes replaced (the reference for the streamed text)."""
    return b"".join(llm._engine.target.piece(t) for t in tokens).decode("utf-8", errors="replace")


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_chunks_add_up_to_generate(tiny, make_llm, name):
    llm = load(tiny, make_llm, name)
    k = DRAFTERS[name][2]
    for p in PROMPTS:
        llm.clear_memory()  # both calls draft from the same state (the memory would hold the first one's output)
        whole = llm.generate(p, max_tokens=N, draft_length=k)
        llm.clear_memory()
        chunks = list(llm.stream(p, max_tokens=N, draft_length=k))
        assert all(isinstance(c.text, str) for c in chunks)
        assert "".join(c.text for c in chunks) == whole.text
        assert [t for c in chunks for t in c.tokens] == whole.tokens
        assert all(c.finish_reason is None and c.stats is None for c in chunks[:-1])
        last = chunks[-1]
        assert last.finish_reason == whole.finish_reason == "length"
        assert last.stats.n_generated == N and last.stats.n_steps == whole.stats.n_steps
        assert sum(c.n_drafted for c in chunks) == last.stats.n_drafted
        assert sum(c.n_accepted for c in chunks) == last.stats.n_accepted
        assert all(c.n_accepted <= c.n_drafted and len(c.tokens) <= c.n_accepted + 1 for c in chunks)


@pytest.mark.parametrize("name", ["plain", "draft", "ngram"])
def test_chunks_never_split_a_character(tiny, make_llm, name):
    # At a high temperature the tiny models emit byte tokens >= 0x80: mostly invalid UTF-8, sometimes a valid
    # multi-byte character assembled over several steps. The streamed text must equal the decoding of all the
    # bytes at once: a chunk boundary inside a valid character would turn it into two U+FFFD.
    llm = load(tiny, make_llm, name)
    n_multibyte = 0
    for seed in range(24):
        chunks = list(llm.stream(PROMPTS[1], max_tokens=48, temperature=5.0, seed=seed,
                                 draft_length=DRAFTERS[name][2]))
        tokens = [t for c in chunks for t in c.tokens]
        want = raw_text(llm, tokens)
        assert "".join(c.text for c in chunks) == want, (seed, [c.text for c in chunks])
        n_multibyte += sum(1 for ch in want if ord(ch) > 0x7F and ch != "\ufffd")
    assert n_multibyte >= 3, "no valid multi-byte character was generated: the test checked nothing"


def test_greedy_text_has_no_replacement_characters_unless_the_bytes_are_invalid(tiny, make_llm):
    llm = load(tiny, make_llm, "draft")
    for p in PROMPTS:
        for c in llm.stream(p, max_tokens=N, draft_length=2):
            if "\ufffd" in c.text:
                assert "\ufffd" in raw_text(llm, c.tokens) or not c.tokens


@pytest.mark.parametrize("name", ["plain", "draft", "hybrid"])
@pytest.mark.parametrize("how", ["break", "close", "keyboard-interrupt"])
def test_leaving_a_stream_early_keeps_the_llm_consistent(tiny, make_llm, name, how):
    llm = load(tiny, make_llm, name)
    k = DRAFTERS[name][2]
    p = PROMPTS[0]
    stream = llm.stream(p, max_tokens=N, draft_length=k)
    seen = []
    if how == "keyboard-interrupt":  # Ctrl-C while the caller handles a chunk
        with pytest.raises(KeyboardInterrupt):
            for chunk in stream:
                seen += chunk.tokens
                if len(seen) >= 5:
                    raise KeyboardInterrupt
    else:
        for chunk in stream:
            seen += chunk.tokens
            if len(seen) >= 5:
                break
        if how == "close":
            stream.close()
    del stream  # the generator's cleanup runs when it is closed or collected
    assert len(seen) >= 5
    again = llm.generate(p + " more", max_tokens=N, draft_length=k)
    fresh = load(tiny, make_llm, name).generate(p + " more", max_tokens=N, draft_length=k)
    assert again.tokens == fresh.tokens
    check_kv(llm, llm.tokenize(p + " more"), again)
    assert llm.generate(p, max_tokens=N, draft_length=k).tokens[:len(seen)] == seen


def test_chat_streams_with_the_template(tiny, make_llm):
    llm = load(tiny, make_llm, "draft")
    messages = [{"role": "user", "content": "Bonjour, ça va ?"}]
    prompt = llm.apply_chat_template(messages)
    assert prompt.endswith("<|im_start|>assistant\n") and "ça va" in prompt
    chunks = list(llm.chat(messages, stream=True, max_tokens=N))
    whole = llm.chat(messages, max_tokens=N)
    assert "".join(c.text for c in chunks) == whole.text == llm.generate(prompt, max_tokens=N).text
