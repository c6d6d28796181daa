"""Text at the edges of the server's answers, where review found them wrong: completions' text_offset and
top_logprobs where a token holds part of a character (the tiny model's byte tokens split every non-ASCII
character), the logprob entries released beside a text with an invalid byte, llama-server's stop_type when the
reply ends on its end-of-generation token with stops given, and a prompt that fills the context scored alone."""
import pytest
from fastapi.testclient import TestClient

from specllm.results import TokenLogprob
from specllm.server import logprobs as lp

TEXT = "naïve café 🙂 ok"


@pytest.fixture(scope="module")
def client(tiny, make_llm):
    from specllm.server import create_app

    with TestClient(create_app(make_llm(tiny["target"], n_ctx=256))) as c:
        yield c


def test_text_offsets_count_a_split_character_once(client):
    r = client.post("/v1/completions", json={"prompt": TEXT, "max_tokens": 0, "echo": True, "logprobs": 1})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    text, body = choice["text"], choice["logprobs"]
    assert text == TEXT and len(body["tokens"]) > len(TEXT.encode()) - 10  # byte tokens: characters split
    # (BOS, then the space the tokenizer puts before the first word, which the text has not: both at 0)
    assert body["tokens"][:2] == ["", " "] and body["text_offset"][:3] == [0, 0, 0]
    for token, at in list(zip(body["tokens"], body["text_offset"]))[2:]:
        if "\ufffd" not in token:  # a whole token's text is where its offset says (each split put later ones after)
            assert text[at:].startswith(token), (token, at, text[at:])
        else:  # part of a character: the offset of that character
            assert text[at] in "ï é🙂", (token, at)
    # streamed: the same offsets, chunk after chunk
    prompt = "é" * 3 + " abc"
    whole = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 12, "logprobs": 0,
                                                 "temperature": 0}).json()["choices"][0]
    with client.stream("POST", "/v1/completions", json={"prompt": prompt, "max_tokens": 12, "logprobs": 0,
                                                        "temperature": 0, "stream": True}) as s:
        import json
        offsets = [o for line in s.iter_lines() if line.startswith("data: {")
                   for o in (json.loads(line[6:])["choices"][0].get("logprobs") or {}).get("text_offset", [])]
    assert offsets == whole["logprobs"]["text_offset"]


def test_partial_tokens_are_alternatives_of_their_own():
    pieces = {10: b"\xc3", 11: b"\xa9", 12: b"e", 13: b"\xf0\x9f"}
    entry = TokenLogprob(12, -0.1, [(12, -0.1), (10, -2.0), (11, -3.0), (13, -4.0)])
    top = lp.completion([entry], pieces.__getitem__)["top_logprobs"][0]
    assert top == {"e": -0.1, "bytes:\\xc3": -2.0, "bytes:\\xa9": -3.0, "bytes:\\xf0\\x9f": -4.0}  # were one "\ufffd"


def test_an_invalid_byte_in_the_text_does_not_release_the_stop_strings_entry():
    pieces = {1: b"\xff", 2: b"a", 3: b"F"}
    released = lp.Released(pieces.__getitem__)
    entries = [TokenLogprob(t, -1.0, []) for t in (1, 2, 3)]
    # the text is cut before the stop string "F": its entry stays out (bytes of "\ufffd" counted 3 and let it out)
    assert [e.token for e in released.add(entries, "\ufffda")] == [1, 2]


def test_stop_type_is_eos_when_the_end_of_generation_token_ended_the_reply(client):
    body = {"prompt": "hi", "n_predict": 8, "stop": ["zzz"], "logit_bias": [[2, 100.0]]}  # 2: the tiny EOS
    r = client.post("/completion", json=body).json()
    assert r["stop_type"] == "eos" and r["stopping_word"] == "", r  # was "word" with any stops given
    r = client.post("/completion", json=dict(body, stop=[], logit_bias=[])).json()
    assert r["stop_type"] == "limit"


def test_a_prompt_that_fills_the_context_is_scored_alone(client, tiny, make_llm):
    tokens = [5 + i % 200 for i in range(256)]
    r = client.post("/v1/completions", json={"prompt": tokens, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert r.status_code == 200, r.text  # was a 400 "needs 256 prompt tokens, more than ... 256"
    assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == 256
    r = client.post("/v1/completions", json={"prompt": tokens, "max_tokens": 1})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
