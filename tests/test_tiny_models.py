"""The tiny generated GGUF models load in llama.cpp, tokenize any UTF-8 and generate deterministic, varied text."""

import os
import pathlib
import sys

import pytest

llama_cpp = pytest.importorskip("llama_cpp")
pytest.importorskip("gguf")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from models.tiny import tiny_model_set, write_tiny_model  # noqa: E402

PROMPTS = ["Hello world", "def f(x):", "über 🙂 emoji 中文"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_model_set(tmp_path_factory.mktemp("tiny"))


def load(path):
    # One thread: tiny models gain nothing from more, and OpenMP barriers stall when another process holds a core.
    return llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)


def greedy(model, prompt, n=32):
    model.reset()
    out = []
    for token in model.generate(model.tokenize(prompt.encode()), temp=0.0, top_k=1):
        out.append(token)
        if len(out) == n:
            return out


def pieces(model):
    return [model.detokenize([i]) for i in range(model.n_vocab())]


def test_set_is_small_and_complete(tiny):
    assert set(tiny) == {"target", "draft", "draft_other_vocab", "slow", "recurrent"}
    for role, path in tiny.items():
        assert 0 < os.path.getsize(path) < (100_000_000 if role == "slow" else 5_000_000)
    assert os.path.getsize(tiny["draft"]) < os.path.getsize(tiny["target"])


def test_set_is_written_once(tiny):
    before = {role: os.stat(p).st_mtime_ns for role, p in tiny.items()}
    assert tiny_model_set(os.path.dirname(tiny["target"])) == tiny
    assert {role: os.stat(p).st_mtime_ns for role, p in tiny.items()} == before


def test_vocabs(tiny):
    target, draft, other = load(tiny["target"]), load(tiny["draft"]), load(tiny["draft_other_vocab"])
    assert target.n_vocab() == draft.n_vocab() == 299
    assert pieces(target) == pieces(draft)
    assert other.n_vocab() != target.n_vocab()
    assert pieces(other)[5:] != pieces(target)[5:len(pieces(other))]
    assert (target.token_bos(), target.token_eos()) == (1, 2)
    assert "<|im_start|>" in target.metadata["tokenizer.chat_template"]


@pytest.mark.parametrize("role", ["target", "draft_other_vocab"])
def test_any_utf8_round_trips(tiny, role):
    model = load(tiny[role])
    for text in PROMPTS + ["ü", "\U0001F600\u200d", "tab\tnew\nline"]:
        tokens = model.tokenize(text.encode())
        assert tokens[0] == model.token_bos()
        assert model.detokenize(tokens).decode() == text


@pytest.mark.parametrize("role", ["target", "draft", "draft_other_vocab"])
def test_greedy_is_deterministic_and_varied(tiny, role):
    model = load(tiny[role])
    runs = [greedy(model, p) for p in PROMPTS]
    assert runs == [greedy(model, p) for p in PROMPTS]
    assert greedy(load(tiny[role]), PROMPTS[0]) == runs[0]  # and in a fresh instance
    assert all(len(set(r)) >= 10 for r in runs), runs
    assert len({tuple(r) for r in runs}) == len(runs)


def test_chosen_eos_ends_generation(tiny, tmp_path):
    out = greedy(load(tiny["target"]), "Hello world")
    eos = out[5]
    path = write_tiny_model(tmp_path / "eos.gguf", name="tiny-target", eos_token_id=eos)
    model = load(path)
    assert model.token_eos() == eos
    assert greedy(model, "Hello world")[:6] == out[:6]  # same weights: only the EOS id differs
    result = model("Hello world", max_tokens=32, temperature=0.0)
    assert result["choices"][0]["finish_reason"] == "stop"
    assert result["usage"]["completion_tokens"] == out.index(eos)


def test_bad_parameters_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="divisible"):
        write_tiny_model(tmp_path / "x.gguf", n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="unknown vocab"):
        write_tiny_model(tmp_path / "x.gguf", vocab="bpe")
    with pytest.raises(ValueError, match="out of range"):
        write_tiny_model(tmp_path / "x.gguf", eos_token_id=10_000)
    assert not any(tmp_path.iterdir())
