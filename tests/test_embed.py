"""LLM.embed: vectors against llama-cpp-python's own pooling of the same model, the conversation's KV cache kept,
an embedding model of its own with the pooling its GGUF declares, stops, and bad input."""

import threading

import numpy as np
import pytest

from helpers import write_variant

LONG = "the quick brown fox jumps over the lazy dog; " * 6  # > 64 tokens: several decode batches
TEXTS = ["a", "hello world", LONG]


def reference(path, pooling, texts):
    """llama-cpp-python's vectors, L2-normalized, flash attention on as in specllm's contexts (llama.cpp's auto on
    a CPU): pooled by llama.cpp in its graph (pooling 1 = mean, 3 = last; the input in one batch), or with
    pooling 0 each token's hidden state and their mean taken here."""
    import llama_cpp

    ref = llama_cpp.Llama(path, embedding=True, pooling_type=pooling, n_ctx=512, n_batch=512, n_ubatch=512,
                          n_threads=1, flash_attn=True, verbose=False)
    out = [ref.embed(t, normalize=False) for t in texts]
    ref.close()
    out = np.array([np.mean(v, axis=0) for v in out] if pooling == 0 else out, dtype=np.float64)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def llm(tiny, make_llm):
    return make_llm(tiny["target"], None)


def test_vectors_are_llama_cpps_mean_pooling(llm, tiny):
    got = llm.embed(TEXTS)
    assert got.shape == (3, 64) and got.dtype == np.float32
    assert len(llm.embedding_tokens(LONG)[0]) > 2 * 64  # three batches of rows
    # inputs of one batch: the mean of llama.cpp's per-token hidden states, equal but for float sums
    np.testing.assert_allclose(got[:2], reference(tiny["target"], 0, TEXTS[:2]), atol=2e-6)
    # llama.cpp's own mean pooling (the long input in one batch, where specllm decodes three: flash attention sums
    # the cache in another order; wrong positions or a batch left out move it by ~0.1)
    np.testing.assert_allclose(got, reference(tiny["target"], 1, TEXTS), atol=2e-4)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    assert llm.embedding_info == {"model": tiny["target"], "n_embd": 64, "n_ctx": 512, "pooling": "mean"}


def test_inputs_sharing_a_batch_are_embedded_as_alone(llm, tiny, make_llm, pooled_models):
    """Short inputs share a decode batch (each its own sequence); what each attends to is its own tokens only: a
    token of another input leaking into its attention moves a vector by ~0.1, the batch's arithmetic by < 5e-4."""
    texts = ["hello world", "x", "a second, longer text", "hello world", "once more"] * 4  # 20: two batches
    with make_llm(tiny["target"], None, embedding_model=pooled_models["mean"]) as pooled:
        for model in (llm, pooled):  # pooled here / by llama.cpp
            together = model.embed(texts)
            alone = np.stack([model.embed(t) for t in texts])
            np.testing.assert_allclose(together, alone, atol=5e-4)
            np.testing.assert_allclose(together[0], together[3], atol=5e-4)  # other neighbours, the same vector


def test_shapes_token_ids_and_normalize(llm):
    one = llm.embed("hello world")
    assert one.shape == (64,)
    ids = llm.embedding_tokens("hello world")[0]
    np.testing.assert_array_equal(llm.embed(ids), one)
    np.testing.assert_array_equal(llm.embed([ids, "hello world"]), np.stack([one, one]))
    raw = llm.embed("hello world", normalize=False)
    assert abs(np.linalg.norm(raw) - 1.0) > 0.1
    np.testing.assert_allclose(raw / np.linalg.norm(raw), one, atol=1e-6)


def test_the_conversation_keeps_its_cache(llm):
    prompt = "once upon a time"
    llm.generate(prompt, max_tokens=8)
    cached = list(llm._engine.target.cached)
    llm.embed([LONG, "another text"])
    assert list(llm._engine.target.cached) == cached
    assert len(cached) > 8
    again = llm.generate(cached, max_tokens=4)  # the conversation goes on: its prefix is not decoded again
    assert again.stats.n_cached >= len(cached) - 1


def test_truncate_and_too_long(llm):
    from specllm import ContextOverflowError

    ids = llm.tokenize(LONG * 4)  # the target embeds: its vocabulary
    assert len(ids) > 512
    with pytest.raises(ContextOverflowError, match="shorten it"):
        llm.embed(LONG * 4)
    np.testing.assert_array_equal(llm.embed(LONG * 4, truncate=True), llm.embed(ids[:512]))


def test_a_stop_ends_it_and_the_next_call_is_whole(llm):
    from specllm.errors import Cancelled

    stop = threading.Event()
    stop.set()
    with pytest.raises(Cancelled):
        llm.embed(LONG, stop=stop)
    calls = []

    class Midway:  # set on the second poll: a stop after the first batch of rows, mid-input
        def is_set(self):
            calls.append(1)
            return len(calls) >= 2

    with pytest.raises(Cancelled):
        llm.embed(LONG, stop=Midway())
    assert len(calls) == 2
    np.testing.assert_array_equal(llm.embed(LONG), llm.embed([LONG])[0])
    np.testing.assert_allclose(llm.embed(LONG), reference(llm.model_path, 1, [LONG])[0], atol=2e-4)


@pytest.mark.parametrize("bad, error, match", [
    ([], "InvalidOptionError", "empty list"),
    ("", "InvalidOptionError", "input is empty"),  # even where the model adds a BOS: no text, no embedding
    (["a", ""], "InvalidOptionError", r"input\[1\] is empty"),
    ([[]], TypeError, r"input\[0\] must be"),
    (5, TypeError, "must be a str"),
    (["a", 3], TypeError, r"input\[1\] must be"),
    ([1, 100000], "InvalidOptionError", "not in the embedding model's vocabulary"),
    ([-1], "InvalidOptionError", "not in the embedding model's vocabulary"),
    ("bad \udcff text", "InvalidOptionError", "not valid Unicode"),
    ([True, 2], TypeError, "must be a str"),
])
def test_bad_input_is_a_typed_error(llm, bad, error, match):
    import specllm

    error = getattr(specllm, error) if isinstance(error, str) else error
    with pytest.raises(error, match=match):
        llm.embed(bad)
    assert llm.embed("still fine").shape == (64,)


def test_an_empty_text_of_a_model_without_bos(make_llm, tiny, tmp_path):
    from specllm import InvalidOptionError
    from models.tiny import STANDARD_SET, write_tiny_model

    path = write_tiny_model(tmp_path / "nobos.gguf", **dict(STANDARD_SET["target"], add_bos=False))
    with make_llm(path, None) as nobos:
        with pytest.raises(InvalidOptionError, match="input is empty"):
            nobos.embed("")
        with pytest.raises(InvalidOptionError, match=r"input\[1\] is empty"):
            nobos.embed(["x", ""])


@pytest.fixture(scope="module")
def pooled_models(tiny, tmp_path_factory):
    """The tiny target with the pooling an embedding model's GGUF declares: mean (1), last (3)."""
    d = tmp_path_factory.mktemp("pooled")
    return {k: write_variant(tiny["target"], d / f"{k}.gguf", keys={"llama.pooling_type": v})
            for k, v in (("mean", 1), ("last", 3))}


@pytest.mark.parametrize("pooling, code", [("mean", 1), ("last", 3)])
def test_an_embedding_model_pools_as_its_gguf_says(make_llm, tiny, pooled_models, pooling, code):
    with make_llm(tiny["target"], None, embedding_model=pooled_models[pooling]) as llm:
        assert llm.embedding_model == pooled_models[pooling]
        info = llm.embedding_info
        assert info["pooling"] == pooling and info["model"] == pooled_models[pooling]
        # specllm: a causal model's rows in batches of 64, pooled here as declared; the reference: each input in one
        # batch, pooled by llama.cpp (the long input's cache computed in three batches: flash attention sums in
        # another order; a wrong row or position moves a vector by ~0.1)
        got = llm.embed(TEXTS)
        np.testing.assert_allclose(got, reference(pooled_models[pooling], code, TEXTS), atol=1e-3)
        if pooling == "mean":  # the same weights as the target: llama.cpp's pooling is specllm's own (in 3 batches)
            with make_llm(tiny["target"], None) as own:
                np.testing.assert_allclose(got, own.embed(TEXTS), atol=5e-4)
        else:
            assert np.abs(got[2] - reference(tiny["target"], 1, [LONG])[0]).max() > 1e-2


def test_a_model_attending_both_ways_takes_each_input_whole(make_llm, tiny, tmp_path):
    """A BERT-style model (no causal mask, no pooling declared): each input in one batch, its mean taken here, at
    most its training context (a position table ends there)."""
    path = write_variant(tiny["target"], tmp_path / "both.gguf",
                         keys={"llama.attention.causal": False, "llama.context_length": 256})
    with make_llm(tiny["target"], None, embedding_model=path) as llm:
        assert llm.embedding_info["n_ctx"] == 256 and llm.embedding_info["pooling"] == "mean"
        np.testing.assert_allclose(llm.embed(TEXTS), reference(path, 0, TEXTS), atol=5e-4)
        causal = reference(tiny["target"], 0, [LONG])[0]
        assert np.abs(llm.embed(LONG) - causal).max() > 1e-2  # the tokens attend both ways
        from specllm import ContextOverflowError
        with pytest.raises(ContextOverflowError, match="256"):
            llm.embed(LONG * 3)
        assert len(llm.embedding_tokens(LONG * 3, truncate=True)[0]) == 256


def test_truncation_keeps_the_tokens_the_model_adds_at_the_end(make_llm, tiny, tmp_path):
    path = write_variant(tiny["target"], tmp_path / "eos.gguf", keys={"tokenizer.ggml.add_eos_token": True,
                                                                         "llama.pooling_type": 3})
    with make_llm(tiny["target"], None, embedding_model=path) as llm:
        eos = llm.embedding_tokens("x")[0][-1]
        ids = llm.embedding_tokens(LONG * 20, truncate=True)[0]
        assert len(ids) == llm.embedding_info["n_ctx"] and ids[-1] == eos and ids[-2] != eos
        # last-token pooling reads that end token: the cut text's vector is its own, with its end
        cut = llm.embed(ids[:-1] + [eos])
        np.testing.assert_array_equal(llm.embed(LONG * 20, truncate=True), cut)


def test_a_reranking_model_is_refused(make_llm, tiny, tmp_path):
    from specllm import SpecLLMError

    path = write_variant(tiny["target"], tmp_path / "rank.gguf", keys={"llama.pooling_type": 4})
    with pytest.raises(SpecLLMError, match="rank"):
        make_llm(tiny["target"], None, embedding_model=path)


def test_a_bad_embedding_model_fails_at_load(make_llm, tiny, tmp_path):
    from specllm import ModelLoadError

    (tmp_path / "not.gguf").write_bytes(b"not a model at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        make_llm(tiny["target"], None, embedding_model=tmp_path / "not.gguf")
    with pytest.raises(ModelLoadError, match="not found"):
        make_llm(tiny["target"], None, embedding_model=tmp_path / "missing.gguf")
    with pytest.raises(TypeError, match="embedding_model must be a path"):
        make_llm(tiny["target"], None, embedding_model=5)


def test_closed(make_llm, tiny):
    from specllm import SpecLLMError

    import gc
    import weakref

    llm = make_llm(tiny["target"], None)
    llm.embed("x")
    engine = weakref.ref(llm._engine)  # the embedding context over its weights must not keep it alive
    llm.close()
    gc.collect()
    assert engine() is None
    with pytest.raises(SpecLLMError, match="closed"):
        llm.embed("x")


def test_a_recurrent_model_embeds_each_input_from_a_clear_state(make_llm, tiny):
    with make_llm(tiny["recurrent"], None) as llm:  # Mamba: a state, not a KV cache, that each input starts afresh
        alone = llm.embed("hello world")
        after = llm.embed([LONG, "hello world"])
        np.testing.assert_array_equal(after[1], alone)
        assert np.abs(after[0] - alone).max() > 1e-2
