"""Any same-family pair loads: vocabularies that differ by padding at the end (up to 128 entries, as llama.cpp
allows; Qwen2.5-7B+ pads 151936 to 152064) are accepted, a draft never proposes an id the target lacks, and every
other difference (more padding, token texts, special tokens, add_bos) is refused with what differs."""

import pytest

import specllm

PROMPTS = ["the quick brown fox", "hello world, hello world", "naïve café"]


def model(tmp_path, role, **kw):
    from models.tiny import STANDARD_SET, write_tiny_model

    name = "-".join(f"{k}{v}" for k, v in sorted(kw.items()))
    return write_tiny_model(tmp_path / f"{role}-{name}.gguf", **dict(STANDARD_SET[role], **kw))


@pytest.mark.parametrize("padded", ["target", "draft"])
def test_a_padded_vocabulary_loads_and_the_output_is_the_targets(tiny, tmp_path, make_llm, padded):
    # the padded model prefers its padding (boosted output rows): a draft that proposed a pad id the target
    # lacks would make the target's decode fail
    target = model(tmp_path, "target", n_pad=40) if padded == "target" else tiny["target"]
    draft = model(tmp_path, "draft", n_pad=40) if padded == "draft" else tiny["draft"]
    llm, plain = make_llm(target, draft), make_llm(target, None)
    n_target = llm._engine.target.n_vocab
    drafted = 0
    for p in PROMPTS:
        want = plain.generate(p, max_tokens=40).tokens
        for k in (1, 3, 6):
            c = llm.generate(p, max_tokens=40, draft_length=k)
            assert c.tokens == want, (p, k)
            drafted += c.stats.n_drafted
        for seed in range(4):  # sampled drafts: only ids both vocabularies have
            c = llm.generate(p, max_tokens=30, temperature=1.5, seed=seed, draft_length=4)
            assert all(0 <= t < n_target for t in c.tokens)
            drafted += c.stats.n_drafted
    assert drafted > 100


def test_more_padding_than_llama_cpp_allows_is_refused(tiny, tmp_path, make_llm):
    with pytest.raises(specllm.IncompatibleDraftError, match=r"size 428 vs 299 \(at most 128"):
        make_llm(tiny["target"], model(tmp_path, "draft", n_pad=129))
    make_llm(tiny["target"], model(tmp_path, "draft", n_pad=128))  # exactly 128: accepted


def test_add_bos_must_agree(tiny, tmp_path, make_llm):
    with pytest.raises(specllm.IncompatibleDraftError, match="add_bos differs"):
        make_llm(tiny["target"], model(tmp_path, "draft", add_bos=False))


def test_token_texts_must_agree_on_the_shared_range(tiny, make_llm):
    # byte-alt: 283 entries (within 128 of 299) whose texts differ from id 3 on
    with pytest.raises(specllm.IncompatibleDraftError, match=r"token 3 is '<pad>' in the draft"):
        make_llm(tiny["target"], tiny["draft_other_vocab"])
