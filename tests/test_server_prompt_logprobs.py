"""The echoed prompt's logprobs on /v1/completions (echo with logprobs), as eval harnesses score a text: lm-eval's
local-completions sends token id lists with max_tokens 1, logprobs 1, echo true and reads token_logprobs[ctxlen:-1].
Through the real server and the official `openai` client; the reference is the same model in-process
(generate(prompt_logprobs=n))."""

import httpx
import pytest

# test_server's module fixtures, imported: this module gets its own server, client and in-process reference
from test_server import AUTH, MODEL, client, local, server  # noqa: F401

TOL = 1e-4  # the prompt's: the same model, threads and scoring batches give the same numbers
REPLY_TOL = 0.01  # the reply's: the server drafts, and a verify batch's rows round differently (test_logprobs)


def reference(local, prompt, n_top, max_tokens):
    return local.generate(prompt, max_tokens=max_tokens, prompt_logprobs=n_top, logprobs=n_top)


def check_choice(local, choice, prompt_ids, ref, n_top):
    """choice.logprobs: the prompt's tokens (the first unscored) and then the reply's, with consistent offsets."""
    lp = choice["logprobs"]
    n = len(prompt_ids)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert len(lp["tokens"]) == n + len(ref.tokens)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][:n] == [local.token_bytes(t).decode("utf-8", errors="replace") for t in prompt_ids]
    for got, want in zip(lp["token_logprobs"][1:n], ref.prompt_logprobs[1:]):
        assert abs(got - want.logprob) < TOL
    for got, want in zip(lp["top_logprobs"][1:n], ref.prompt_logprobs[1:]):
        assert len(got) <= n_top and max(got.values()) == pytest.approx(want.top[0][1], abs=TOL)
    for got, want in zip(lp["token_logprobs"][n:], ref.logprobs):
        assert abs(got - want.logprob) < REPLY_TOL
    text = choice["text"]  # each token ends where it ends in the text (the first word's added space aside)
    for tok, off in zip(lp["tokens"], lp["text_offset"]):
        assert text[off:off + len(tok)] == tok or (off == 0 and text.startswith(tok.lstrip(" "))), (tok, off)
    assert lp["text_offset"] == sorted(lp["text_offset"])


def test_lm_evals_loglikelihood_request(server, local):
    contexts = ["The capital of France is", "def add(a, b):\n    return"]
    continuations = [" Paris", " a + b"]
    prompts = [local.prompt_tokens(c) + local.tokenize(x, add_special=False) for c, x in zip(contexts, continuations)]
    body = {"model": MODEL, "prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}  # lm_eval/models/openai_completions.py, LocalCompletionsAPI._create_payload
    r = httpx.post(f"{server.url}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert [c["index"] for c in out["choices"]] == [0, 1]
    for choice, ids, ctx in zip(sorted(out["choices"], key=lambda c: c["index"]), prompts, contexts):
        ref = reference(local, ids, 1, 1)
        check_choice(local, choice, ids, ref, 1)
        ctxlen = len(local.prompt_tokens(ctx))  # lm-eval's parse_logprobs: the continuation's tokens
        got = sum(choice["logprobs"]["token_logprobs"][ctxlen:-1])
        assert got == pytest.approx(sum(e.logprob for e in ref.prompt_logprobs[ctxlen:]), abs=1e-3) and got < 0
        greedy = all(t == max(top.values()) for t, top in zip(choice["logprobs"]["token_logprobs"][ctxlen:-1],
                                                              choice["logprobs"]["top_logprobs"][ctxlen:-1]))
        assert greedy == all(e.token == e.top[0][0] for e in ref.prompt_logprobs[ctxlen:])
    assert out["usage"]["prompt_tokens"] == sum(map(len, prompts)) and out["usage"]["completion_tokens"] == 2


def test_scoring_only_with_max_tokens_0(client, local):
    prompt = "Once upon a time there was a"
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0, logprobs=3, echo=True)
    c = r.choices[0]
    assert (c.text, c.finish_reason, r.usage.completion_tokens) == (prompt, "length", 0)
    ids = local.prompt_tokens(prompt)
    check_choice(local, c.model_dump(), ids, reference(local, prompt, 3, 0), 3)
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=0)  # no echo: nothing at all
    assert (r.choices[0].text, r.choices[0].finish_reason, r.usage.completion_tokens) == ("", "length", 0)


def test_streamed_the_prompt_goes_first_with_its_logprobs(client, local):
    prompt = "The cat sat on the"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, logprobs=2,
                                      echo=True).choices[0].model_dump()
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0, logprobs=2,
                                            echo=True, stream=True))
    first = chunks[0].choices[0]
    assert first.text.startswith(prompt) and first.logprobs.token_logprobs[0] is None
    joined = {k: [] for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    for ch in chunks:
        for k in joined:
            joined[k] += getattr(ch.choices[0].logprobs, k) if ch.choices[0].logprobs else []
    assert "".join(ch.choices[0].text for ch in chunks) == whole["text"]
    want = whole["logprobs"]
    assert joined["tokens"] == want["tokens"] and joined["text_offset"] == want["text_offset"]
    n = len(local.prompt_tokens(prompt))  # the prompt's scores are the same; the reply's rows may be drafted
    assert joined["token_logprobs"][:n] == want["token_logprobs"][:n] and joined["top_logprobs"][:n] == \
        want["top_logprobs"][:n]
    assert joined["token_logprobs"][n:] == pytest.approx(want["token_logprobs"][n:], abs=0.01)
    check_choice(local, whole, local.prompt_tokens(prompt), reference(local, prompt, 2, 10), 2)


def test_every_choice_carries_its_prompts_scores(client, local):
    prompts = ["Hello there", "Good morning to"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0.8, seed=3, n=2,
                                  logprobs=0, echo=True)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    for c in r.choices:
        p = prompts[c.index // 2]
        n = len(local.prompt_tokens(p))
        ref = local.generate(p, max_tokens=0, prompt_logprobs=0)
        assert c.text.startswith(p) and len(c.logprobs.tokens) == n + 4
        assert c.logprobs.token_logprobs[0] is None
        assert c.logprobs.token_logprobs[1:n] == pytest.approx([e.logprob for e in ref.prompt_logprobs[1:]],
                                                               abs=TOL)
    assert r.choices[0].logprobs.token_logprobs[:3] == r.choices[1].logprobs.token_logprobs[:3]


def test_streamed_choices_after_the_first_carry_its_scores(client, local):
    prompt = "Hello there"
    n = len(local.prompt_tokens(prompt))
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=3, temperature=0.8, seed=9, n=2,
                                            logprobs=1, echo=True, stream=True))
    texts, lps = {}, {}
    for ch in chunks:
        for c in ch.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            lps.setdefault(c.index, []).extend(c.logprobs.token_logprobs if c.logprobs else [])
    ref = local.generate(prompt, max_tokens=0, prompt_logprobs=1)
    for i in (0, 1):
        assert texts[i].startswith(prompt) and len(lps[i]) == n + 3 and lps[i][0] is None
        assert lps[i][1:n] == pytest.approx([e.logprob for e in ref.prompt_logprobs[1:]], abs=TOL)


def test_echo_with_logprobs_and_suffix_is_refused(server):
    r = httpx.post(f"{server.url}/v1/completions", headers=AUTH, timeout=30,
                   json={"prompt": "def f(", "suffix": "\n", "echo": True, "logprobs": 1, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    assert "echo with logprobs" in r.json()["error"]["message"]
