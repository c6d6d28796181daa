"""LLM.embed on the real Qwen2.5-Coder-1.5B (the default target): llama.cpp's own mean pooling of the same model, and
vectors that place two ways of writing one function nearer each other than a sentence about the weather."""

import numpy as np
import pytest

CODE_A = "def add(a, b):\n    return a + b"
CODE_B = "def sum_two(x, y):\n    return x + y"
WEATHER = "The weather in Paris is mild in spring."
LONG = ("specllm drafts tokens cheaply and verifies them with the target model in one batch; the accepted prefix is "
        "kept and the rejected tail is cut from the KV cache. ") * 4  # ~150 tokens: three batches of 64 rows


@pytest.fixture(scope="module")
def llm(real_models):
    import specllm
    with specllm.LLM(real_models["target"], None, n_threads=2, n_ctx=1024, profile_costs=False) as llm:
        yield llm


def test_real_vectors_are_llama_cpps_mean_pooling(llm, real_models):
    import llama_cpp

    texts = [CODE_A, LONG]
    got = llm.embed(texts)
    assert got.shape == (2, 1536) and len(llm.embedding_tokens(LONG)[0]) > 128
    ref = llama_cpp.Llama(real_models["target"], embedding=True, pooling_type=1, n_ctx=1024, n_batch=1024,
                          n_ubatch=1024, n_threads=2, flash_attn=True, verbose=False)
    want = np.array([ref.embed(t, normalize=True) for t in texts])
    ref.close()
    cos = (got * want).sum(axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.99999, cos  # a batch left out or wrong positions: < 0.99


def test_real_vectors_mean_something(llm):
    a, b, w = llm.embed([CODE_A, CODE_B, WEATHER])
    assert a @ b > a @ w + 0.2, (a @ b, a @ w)  # measured 0.88 against 0.37
