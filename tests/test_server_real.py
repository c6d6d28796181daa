"""The default pair (Qwen2.5-Coder 1.5B + 0.5B, hybrid drafting, "auto") served by `specllm-cli serve` and asked
through the official `openai` client answers with LLM.chat's text."""

import signal

import openai
import pytest

from serving import Server

pytestmark = pytest.mark.real

MESSAGES = [{"role": "user", "content": "Write a Python function that returns the squares of a list of numbers."}]


def test_default_pair_through_the_openai_client(real_models, tmp_path):
    import specllm

    s = Server("--threads", "2", "--ctx", "2048", log_path=tmp_path / "server.log").wait_healthy(timeout=600)
    try:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="none", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["qwen2.5-coder-1.5b"]
        r = client.chat.completions.create(model="qwen2.5-coder-1.5b", messages=MESSAGES, max_tokens=48)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="qwen2.5-coder-1.5b", messages=MESSAGES, max_tokens=48, stream=True) if c.choices)
    finally:
        assert s.stop(signal.SIGINT) == 0, s.log()
    # the same default configuration and the same two calls: in fast mode (the default) the second, identical
    # request may read differently from the first (it reuses the first's KV cache and drafting memory, which
    # changes batch shapes and can flip a near-tie), so each answer is compared with its in-process counterpart
    llm = specllm.LLM("qwen2.5-coder-1.5b", n_threads=2, n_ctx=2048)
    want = llm.chat(MESSAGES, max_tokens=48)
    want_streamed = "".join(c.text for c in llm.chat(MESSAGES, max_tokens=48, stream=True))
    assert r.choices[0].message.content == want.text
    assert streamed == want_streamed
    assert r.usage.completion_tokens == want.stats.n_generated == 48
    assert r.model_extra["speculative"]["steps"] <= 48
