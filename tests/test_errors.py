"""Errors are typed, say what is wrong and what to do, and never take the process down; llama.cpp's own output goes to
logging instead of the terminal."""

import logging
import pytest

import specllm


@pytest.fixture
def bad_files(tiny, tmp_path):
    files = {"directory": tmp_path / "a_dir.gguf", "empty": tmp_path / "empty.gguf",
             "text": tmp_path / "notes.gguf", "truncated": tmp_path / "truncated.gguf",
             "unknown-arch": tmp_path / "unknown_arch.gguf"}
    files["directory"].mkdir()
    files["empty"].write_bytes(b"")
    files["text"].write_text("this is a text file, not a model\n")
    data = open(tiny["target"], "rb").read()
    files["truncated"].write_bytes(data[:len(data) // 2])
    write_unknown_arch(files["unknown-arch"])
    return {k: str(v) for k, v in files.items()}


def write_unknown_arch(path):
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch="nosucharch")
    w.add_tensor("x", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


LOAD_ERRORS = [
    ("missing", r"not found: .*no_such_model\.gguf"),
    ("directory", r"is a directory: .*a_dir\.gguf"),
    ("empty", r"model file is empty: .*empty\.gguf"),
    ("text", r"not a GGUF file: .*notes\.gguf"),
    ("truncated", r"could not load .*truncated\.gguf.*(truncated|incomplete|bounds)"),
    ("unknown-arch", r"could not load .*unknown_arch\.gguf.*unknown model architecture: 'nosucharch'"),
]


@pytest.mark.parametrize("role", ["target", "draft"])
@pytest.mark.parametrize("kind,message", LOAD_ERRORS, ids=[k for k, _ in LOAD_ERRORS])
def test_a_bad_model_file_raises_model_load_error(tiny, make_llm, bad_files, tmp_path, role, kind, message):
    path = bad_files.get(kind, str(tmp_path / "no_such_model.gguf"))
    with pytest.raises(specllm.ModelLoadError, match=message):
        if role == "target":
            make_llm(path)
        else:
            make_llm(tiny["target"], path)
    assert make_llm(tiny["target"]).generate("still fine", max_tokens=4).finish_reason == "length"


def test_a_draft_with_another_vocabulary_is_refused(tiny, make_llm, tmp_path):
    with pytest.raises(specllm.IncompatibleDraftError, match=r"vocabulary differs.*token 3 is '<pad>' in the draft and '<0x00>' in the target.*draft=\"ngram\""):
        make_llm(tiny["target"], tiny["draft_other_vocab"])
    from models.tiny import STANDARD_SET, write_tiny_model

    other_eos = write_tiny_model(tmp_path / "eos.gguf", **STANDARD_SET["draft"], eos_token_id=100)
    with pytest.raises(specllm.IncompatibleDraftError, match=r"eos token 100 vs 2"):
        make_llm(tiny["target"], other_eos)
    with pytest.raises(specllm.IncompatibleDraftError, match=r"vocabulary differs"):
        make_llm(tiny["target"], tiny["draft_other_vocab"], ngram=True)


@pytest.mark.parametrize("draft", [None, "draft", "ngram"])
def test_context_overflow(tiny, make_llm, draft):
    llm = make_llm(tiny["target"], tiny.get(draft, draft), n_ctx=64)
    n_ctx = llm.n_ctx  # llama.cpp may round the context up
    assert n_ctx >= 64
    too_long = [1] + [120] * n_ctx  # a token-id prompt of n_ctx + 1 tokens
    with pytest.raises(specllm.ContextOverflowError, match=rf"prompt \({n_ctx + 1} tokens\).*n_ctx={n_ctx}"):
        llm.generate(too_long, max_tokens=1)
    prompt = [1] + [120, 121, 122] * 10  # 31 tokens
    with pytest.raises(specllm.ContextOverflowError, match=r"\+ max_tokens \(\d+\) exceed the context window.*n_ctx="):
        llm.generate(prompt, max_tokens=n_ctx - 30)
    # exactly full is allowed, also when drafting up to 8 tokens ahead near the end of the context
    c = llm.generate(prompt, max_tokens=n_ctx - 31, draft_length=8)
    assert c.finish_reason == "length" and len(c.tokens) == n_ctx - 31
    assert llm._engine.target.n_past <= n_ctx
    # and the LLM is fine afterwards
    fresh = make_llm(tiny["target"], tiny.get(draft, draft), n_ctx=64).generate("after", max_tokens=16)
    assert llm.generate("after", max_tokens=16).tokens == fresh.tokens


def test_an_unknown_model_name_lists_the_known_ones(make_llm):
    with pytest.raises(specllm.RegistryError, match=r"unknown model 'qwen-coder-1.5b'.*Known models: .*qwen2\.5-coder-1\.5b"):
        make_llm("qwen-coder-1.5b")
    with pytest.raises(specllm.SpecLLMError):
        specllm.generate("hi", model="no-such-model")


def test_a_mistyped_draft_is_said_before_the_target_is_downloaded(make_llm, tmp_path, monkeypatch):
    """LLM() pulled the target (1.1 GB) and only then said the draft's name was unknown."""
    from specllm import registry

    def no_download(name, *args, **kwargs):
        raise AssertionError(f"{name} would be downloaded")
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "models"))
    monkeypatch.setattr(registry, "_pull", no_download)
    with pytest.raises(specllm.RegistryError, match=r"unknown model 'qwen2\.5-coder-05b'.*Did you mean"):
        make_llm("qwen2.5-coder-1.5b", "qwen2.5-coder-05b")
    with pytest.raises(specllm.ModelLoadError, match="model file not found"):
        make_llm("qwen2.5-coder-1.5b", str(tmp_path / "nowhere.gguf"))
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_specllm_generate_names_a_misspelt_option_with_its_name_here(tiny):
    for name, hint in (("num_predict", "max_tokens"), ("n_ctxx", "n_ctx"), ("temprature", "temperature")):
        with pytest.raises(TypeError, match=f"unknown option '{name}'; did you mean '{hint}'"):
            specllm.generate("hi", model=tiny["target"], draft=None, profile_costs=False, **{name: 5})


def test_the_clis_drafter_words_are_not_model_names(tiny, make_llm):
    """draft="none" (the CLI's --draft none) was "unknown model 'none' ... Known models: ..." without a word of
    draft=None; "ngram " (a stray space) and "NGRAM" the same."""
    for draft, want in (("none", "draft=None"), ("None", "draft=None"), ("off", "draft=None"),
                        ("ngram ", "draft='ngram'"), ("NGRAM", "draft='ngram'")):
        with pytest.raises(specllm.InvalidOptionError, match=want):
            make_llm(tiny["target"], draft)


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(n_ctx="4096"), TypeError, r"n_ctx must be an int, got str"),
    (dict(n_threads=1.5), TypeError, r"n_threads must be an int or None, got float"),
    (dict(n_ctx=8), specllm.InvalidOptionError, r"n_ctx must be between 16 and \d+, got 8"),
    (dict(n_threads=-2), specllm.InvalidOptionError, r"n_threads must be between 0 \(all cores\) and 512, got -2"),
    (dict(n_batch=0), specllm.InvalidOptionError, r"n_batch must be >= 1"),
])
def test_bad_constructor_arguments(tiny, make_llm, kwargs, error, message):
    with pytest.raises(error, match=message):
        make_llm(tiny["target"], **kwargs)


def test_model_argument_type(make_llm):
    with pytest.raises(TypeError, match=r"model must be a path or a registry name, got int"):
        make_llm(42)


def test_llama_cpp_logs_go_to_the_specllm_logger_and_nothing_is_printed(tiny, make_llm, caplog, capfd):
    capfd.readouterr()
    with caplog.at_level(logging.DEBUG, logger="specllm"):
        llm = make_llm(tiny["target"], tiny["draft"])
        llm.generate("Hello", max_tokens=8, draft_length=2)
        list(llm.stream("Hello again", max_tokens=8))
        del llm
    records = [r for r in caplog.records if r.name == "specllm" and r.getMessage().startswith("llama.cpp: ")]
    assert records, "no llama.cpp log record reached logging.getLogger('specllm')"
    assert any("tiny-target" in r.getMessage() or "llama" in r.getMessage() for r in records)
    out, err = capfd.readouterr()
    assert out == "" and err == "", f"printed to the terminal: stdout={out[:300]!r} stderr={err[:300]!r}"


def test_load_errors_print_nothing(tiny, make_llm, bad_files, capfd):
    capfd.readouterr()
    for kind in ("truncated", "unknown-arch"):
        with pytest.raises(specllm.ModelLoadError):
            make_llm(bad_files[kind])
    out, err = capfd.readouterr()
    assert out == "" and err == "", f"printed to the terminal: stdout={out[:300]!r} stderr={err[:300]!r}"

