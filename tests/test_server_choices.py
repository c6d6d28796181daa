"""Several choices in one request through the real server and the official `openai` client: `n` (chat and
completions) and a list of prompts (text or token ids) on /v1/completions, whole and streamed, and `echo`. Each
choice must be what a single request (or in-process generation) gives: with seed s, choice i is seed s + i's text."""

import time

import httpx
import pytest

# test_server's module fixtures, imported: this module gets its own server, client and in-process reference
from test_server import AUTH, LONG, MESSAGES, MODEL, client, local, server  # noqa: F401


def test_chat_n_sampled_choices_are_the_seeds_texts(client, local):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0.9, seed=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    want = [local.chat(MESSAGES, max_tokens=24, temperature=0.9, seed=5 + i) for i in range(3)]
    assert [c.message.content for c in r.choices] == [w.text for w in want]
    assert len({w.text for w in want}) > 1
    assert r.usage.prompt_tokens == want[0].stats.n_prompt  # the prompt counts once
    assert r.usage.completion_tokens == sum(w.stats.n_generated for w in want)
    assert r.model_extra["speculative"]["steps"] >= 3


def test_chat_n_streamed_with_usage(client, local):
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0.9,
                                                 seed=11, n=2, stream=True, stream_options={"include_usage": True}))
    texts, roles, finishes = {}, {}, {}
    for c in chunks:
        for ch in c.choices:
            texts[ch.index] = texts.get(ch.index, "") + (ch.delta.content or "")
            roles[ch.index] = roles.get(ch.index) or ch.delta.role
            if ch.finish_reason:
                finishes[ch.index] = ch.finish_reason
    want = [local.chat(MESSAGES, max_tokens=20, temperature=0.9, seed=11 + i) for i in range(2)]
    assert texts == {0: want[0].text, 1: want[1].text}
    assert roles == {0: "assistant", 1: "assistant"} and set(finishes) == {0, 1}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40


def test_completions_prompt_list_times_n(client, local):
    prompts = ["Once upon a time", "The cat sat"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=16, temperature=0, n=2)
    want = [local.generate(p, max_tokens=16).text for p in prompts]
    assert [(c.index, c.text) for c in r.choices] == [(0, want[0]), (1, want[0]), (2, want[1]), (3, want[1])]
    assert r.usage.prompt_tokens == sum(len(local.prompt_tokens(p)) for p in prompts)
    assert r.usage.completion_tokens == 64
    ids = [local.prompt_tokens(p) for p in prompts]  # token id lists, as eval harnesses send them
    r = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0)
    assert [c.text for c in r.choices] == want
    chunks = list(client.completions.create(model=MODEL, prompt=prompts, max_tokens=16, temperature=0, stream=True))
    streamed = {}
    for c in chunks:
        for ch in c.choices:
            streamed[ch.index] = streamed.get(ch.index, "") + ch.text
    assert streamed == {0: want[0], 1: want[1]}


def test_echo(client, local):
    prompt = "Once upon a time"
    want = local.generate(prompt, max_tokens=12).text
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, echo=True)
    assert r.choices[0].text == prompt + want
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0, echo=True,
                                            stream=True))
    assert chunks[0].choices[0].text == prompt and "".join(c.choices[0].text for c in chunks) == prompt + want


@pytest.mark.parametrize("body, param", [
    ({"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "a", "n": 129}, "n"),
    ({"prompt": ["a"] * 65, "n": 2}, "n"),
    ({"prompt": ["a"] * 129}, "prompt"),
    ({"prompt": [[1, 2], []]}, "prompt"),
    ({"prompt": ["a", ""]}, "prompt"),
    ({"prompt": [[1, 10**9]]}, "prompt"),
    ({"prompt": [[1, "a"]]}, "prompt"),
    ({"prompt": [True]}, "prompt"),  # was token 1: pydantic's lax int took JSON's true
    ({"prompt": [[2, False]]}, "prompt"),
    ({"prompt": ["a", "b"], "suffix": "c"}, "prompt"),
    ({"prompt": "a", "best_of": 2}, "best_of"),
])
def test_bad_requests(server, body, param):
    r = httpx.post(f"{server.url}/v1/completions", json=dict({"max_tokens": 4}, **body), headers=AUTH, timeout=30)
    assert r.status_code == 400, (body, r.text)
    assert r.json()["error"]["param"].split(".")[0] == param, (body, r.text)


def leave_stream(server, path: str, body: dict) -> None:
    """A streamed request the client leaves after its first 5 events."""
    with httpx.stream("POST", f"{server.url}{path}", headers=AUTH, timeout=30, json=dict(body, stream=True)) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 5:
                break


def answered_at_once(client) -> None:
    """The next request runs at once: nothing left of an earlier one is queued before it."""
    t0 = time.monotonic()
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8)
    assert r.choices[0].finish_reason == "length" and time.monotonic() - t0 < 8


def test_leaving_a_stream_of_several_choices_runs_no_more_of_them(server, client):
    # three choices of LONG tokens (~11 s each): the client leaves during the first; the next request is answered
    # at once, so the other two were never queued
    leave_stream(server, "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": LONG, "n": 3})
    time.sleep(0.5)
    answered_at_once(client)


def test_leaving_a_request_for_several_choices_runs_no_more_of_them(server, client):
    before = server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="running")
    queued = server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="queued")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", headers=AUTH, timeout=1.0,
                   json={"messages": MESSAGES, "max_tokens": LONG, "n": 3})
    assert server.wait_metric("specllm_requests_cancelled_total", before + 1, headers=AUTH,
                              stage="running") == before + 1
    answered_at_once(client)
    assert server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="running") == before + 1
    assert server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="queued") == queued  # none queued


def test_leaving_llama_servers_completion_of_several_prompts_runs_no_more_of_them(server, client):
    # /completion with three prompts of LONG tokens each, streamed and whole: the client leaves during the first;
    # the running one is cancelled and the other two are never queued
    prompts = ["the cat sat", "on the mat", "and the cat"]
    before = server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="running")
    queued = server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="queued")
    leave_stream(server, "/completion", {"prompt": prompts, "n_predict": LONG})
    assert server.wait_metric("specllm_requests_cancelled_total", before + 1, headers=AUTH,
                              stage="running") == before + 1
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/completion", headers=AUTH, timeout=1.0, json={"prompt": prompts, "n_predict": LONG})
    assert server.wait_metric("specllm_requests_cancelled_total", before + 2, headers=AUTH,
                              stage="running") == before + 2
    answered_at_once(client)
    assert server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="running") == before + 2
    assert server.metric("specllm_requests_cancelled_total", headers=AUTH, stage="queued") == queued  # none queued
