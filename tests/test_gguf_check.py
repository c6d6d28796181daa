"""specllm.gguf_check: the structural check of a GGUF file before llama.cpp loads it. Each file refused here would
abort or crash the process inside llama.cpp (found by the fuzzing of test_fuzz_gguf.py), or is damaged in a way
llama.cpp reports less clearly."""

import os
import time

import numpy as np
import pytest

pytest.importorskip("gguf")

import gguf_fuzz as gf  # noqa: E402
from specllm import ModelLoadError  # noqa: E402
from specllm.gguf_check import check_gguf  # noqa: E402


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from models.tiny import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp("gguf-check") / "base.gguf", **dict(gf.BASE_CONFIG, seed=0))
    with open(path, "rb") as f:
        raw = f.read()
    return path, raw, gf.parse(raw)


def write(tmp_path, data, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def refused(tmp_path, data, match):
    with pytest.raises(ModelLoadError, match=match) as e:
        check_gguf(write(tmp_path, data))
    assert "bad.gguf" in str(e.value)
    return str(e.value)


def rebuilt(base, edit):
    spec = gf.Spec.of(base[2])
    edit(spec)
    return spec.build()


def test_valid_models_pass(tiny, base):
    for role in ("target", "draft", "draft_other_vocab", "far_draft", "near_draft"):
        info = check_gguf(tiny[role])
        assert info.metadata["general.architecture"] == "llama"
        assert any(name == "token_embd.weight" for name, *_ in info.tensors)
    info = check_gguf(base[0])
    assert [t[0] for t in info.tensors] == [t.name for t in base[2].tensors]
    assert info.data_offset == base[2].data_start
    assert len(info.metadata["tokenizer.ggml.tokens"]) == 299


def test_what_the_loader_reports_itself_is_left_to_it(tmp_path):
    assert check_gguf(tmp_path / "missing.gguf") is None
    assert check_gguf(tmp_path) is None
    assert check_gguf(write(tmp_path, b"")) is None
    assert check_gguf(write(tmp_path, b"PK\x03\x04 not gguf")) is None


@pytest.mark.parametrize("cut, match", [
    (10, r"the GGUF header .* needs 24 bytes at offset 0 but the file ends at 10; .*download or convert it again"),
    (30, r"its header claims 25 metadata KVs, more than its 30 bytes can hold"),
    (400, r"needs \d+ bytes at offset \d+ but the file ends at 400"),
    (5000, r"tokenizer\.ggml\.(tokens|scores)"),
    (-1, r"the data of tensor 'output\.weight' .* runs past the end of the file"),
])
def test_truncated_files(tmp_path, base, cut, match):
    refused(tmp_path, base[1][:cut], match)


@pytest.mark.parametrize("off, value, match", [
    (8, 2 ** 63, r"claims 9223372036854775808 tensors"),
    (16, 2 ** 32, r"claims 4294967296 metadata KVs"),
    (16, 2 ** 64 - 1, r"metadata KVs, more than its"),
    (24, 2 ** 63, r"the key of KV 0 claims a length of 9223372036854775808 bytes"),
])
def test_absurd_counts_and_lengths(tmp_path, base, off, value, match):
    refused(tmp_path, gf._patch(base[1], off, gf.u64(value)), match)


def test_absurd_array_count_and_element_length(tmp_path, base):
    tok = base[2].kv("tokenizer.ggml.tokens")
    refused(tmp_path, gf._patch(base[1], tok.value_off + 4, gf.u64(2 ** 32)),
            r"the array 'tokenizer\.ggml\.tokens' claims 4294967296 elements")
    refused(tmp_path, gf._patch(base[1], tok.items[0][0], gf.u64(2 ** 40)),
            r"element 0 of 'tokenizer\.ggml\.tokens' claims a length of 1099511627776 bytes")


@pytest.mark.parametrize("version, match", [(1, r"version is 1.*convert it again"), (0, r"version is 0"),
                                            (4, r"version is 4"), (3 << 24, r"big-endian")])
def test_versions(tmp_path, base, version, match):
    refused(tmp_path, gf._patch(base[1], 4, gf.u32(version)), match)


def test_tensor_info_damage(tmp_path, base):
    lay = base[2]
    te, q = lay.tensor("token_embd.weight"), lay.tensor("blk.0.attn_q.weight")
    refused(tmp_path, gf._patch(base[1], te.ndims_off, gf.u32(5)), r"claims 5 dimensions")
    refused(tmp_path, gf._patch(base[1], te.dims_off[0], gf.u64(2 ** 64 - 1)), r"negative dimension")
    refused(tmp_path, gf._patch(base[1], te.type_off, gf.u32(43)), r"ggml type 43, which this llama\.cpp does not know")
    refused(tmp_path, gf._patch(base[1], te.type_off, gf.u32(4)), r"ggml type 4")
    refused(tmp_path, gf._patch(base[1], te.type_off, gf.u32(gf.GGML_Q4_K)), r"rows of 32 elements, not a multiple")
    refused(tmp_path, gf._patch(base[1], q.offset_off, gf.u64(q.offset + 1)),
            r"'blk\.0\.attn_q\.weight' claims its data at offset \d+ of the data section, where llama\.cpp expects")
    refused(tmp_path, gf._patch(base[1], te.start, gf.u64(64)),
            r"tensor 0's name is 64 bytes long, llama\.cpp allows at most 63")
    refused(tmp_path, rebuilt(base, lambda s: s.tensors.append(s.tensors[1])),
            r"'blk\.0\.attn_norm\.weight' appears twice")


def test_metadata_damage(tmp_path, base):
    refused(tmp_path, rebuilt(base, lambda s: s.kvs.append(("llama.block_count", gf.U32, gf.u32(1)))),
            r"the key 'llama\.block_count' appears twice")
    refused(tmp_path, rebuilt(base, lambda s: s.set_raw("x", 13, gf.u32(0))), r"the key 'x' has type 13")
    refused(tmp_path, rebuilt(base, lambda s: s.set_raw("x", gf.ARRAY, gf.u32(gf.ARRAY) + gf.u64(0))),
            r"arrays of arrays")
    refused(tmp_path, rebuilt(base, lambda s: s.set("general.alignment", gf.U32, 3)), r"alignment is 3, not a power")
    refused(tmp_path, rebuilt(base, lambda s: s.set("general.alignment", gf.STRING, "32")), r"must be a u32")


# --- the values llama.cpp aborts the process on (GGML_ASSERT / GGML_ABORT / a segfault in a kernel)

@pytest.mark.parametrize("key, vtype, value, match", [
    ("llama.block_count", gf.U32, 0, r"block_count is 0; llama\.cpp needs 1 to 512 layers"),
    ("llama.block_count", gf.U32, 513, r"block_count is 513"),
    ("llama.block_count", gf.U64, 2 ** 40, r"block_count is 1099511627776"),
    ("llama.nextn_predict_layers", gf.U32, 5, r"nextn_predict_layers is 5, more than the 1 layers"),
    ("llama.expert_count", gf.U32, 2000, r"expert_count is 2000; llama\.cpp allows at most 1024"),
    ("llama.expert_count", gf.U32, 4, r"expert_used_count is 0; with 4 experts it must be 1 to 4"),
    ("llama.expert_used_count", gf.U32, 2, r"no experts .* expert_used_count 2"),
    ("llama.rope.scaling.type", gf.STRING, "bogus", r"rope\.scaling\.type is 'bogus'; llama\.cpp knows none, linear"),
    ("llama.attention.layer_norm_rms_epsilon", gf.F32, float("nan"), r"layer_norm_rms_epsilon is nan; .* finite"),
    ("llama.attention.layer_norm_rms_epsilon", gf.F32, -1.0, r"layer_norm_rms_epsilon is -1\.0"),
])
def test_hyperparameters_llama_cpp_asserts_on(tmp_path, base, key, vtype, value, match):
    refused(tmp_path, rebuilt(base, lambda s: s.set(key, vtype, value)), match)


def test_consistent_experts_and_scaling_pass(tmp_path, base):
    def edit(s):
        s.set("llama.rope.scaling.type", gf.STRING, "yarn")
        s.set("llama.attention.layer_norm_rms_epsilon", gf.F32, 0.0)
    assert check_gguf(write(tmp_path, rebuilt(base, edit))) is not None


@pytest.mark.parametrize("name, gtype, data, match", [
    ("output.weight", gf.GGML_I32, np.ones(32 * 299, np.int32), r"'output\.weight' has type I32; .* crashes"),
    ("blk.0.attn_q.weight", gf.GGML_I8, np.ones(32 * 32, np.int8), r"type I8"),
    ("output.weight", gf.GGML_F64, np.ones(32 * 299, np.float64), r"type F64"),
    ("blk.0.attn_norm.weight", gf.GGML_F16, np.ones(32, np.float16), r"1-D tensor 'blk\.0\.attn_norm\.weight' .* F16"),
    ("output_norm.weight", gf.GGML_Q8_0, None, r"1-D tensor 'output_norm\.weight' .* type Q8_0; .* F32"),
])
def test_weight_types_llama_cpp_crashes_on(tmp_path, base, name, gtype, data, match):
    def edit(s):
        t = s.t(name)
        raw = gf._q8_0(s.array(name)) if data is None else data.tobytes()
        s.set_tensor(name, dims=t.dims, ggml_type=gtype, data=raw)
    refused(tmp_path, rebuilt(base, edit), match)


def test_quantized_and_half_matrices_pass(tmp_path, base):
    def edit(s):
        s.set_tensor("output.weight", dims=[32, 299], ggml_type=gf.GGML_Q8_0, data=gf._q8_0(s.array("output.weight")))
        s.set_tensor("blk.0.attn_k.weight", dims=[32, 16], ggml_type=gf.GGML_BF16,
                     data=gf._bf16(s.array("blk.0.attn_k.weight")))
        s.set_tensor("token_embd.weight", dims=[32, 299], ggml_type=gf.GGML_F16,
                     data=s.array("token_embd.weight").astype(np.float16).tobytes())
    assert check_gguf(write(tmp_path, rebuilt(base, edit))) is not None


def test_vocabulary_damage(tmp_path, base):
    tokens = gf.Spec.of(base[2]).get("tokenizer.ggml.tokens")

    def with_tokens(t):
        return rebuilt(base, lambda s: s.set("tokenizer.ggml.tokens", gf.ARRAY, t, gf.STRING))
    refused(tmp_path, with_tokens(tokens[:-1] + [tokens[-2]]), rf"tokens 297 and 298 .* same text '{tokens[-2]}'")
    refused(tmp_path, with_tokens(tokens[:3] + ["<0x01>"] + tokens[4:]), r"tokens 3 and 4 .* '<0x01>'")
    refused(tmp_path, with_tokens([("<0xff>" if t == "<0x48>" else t) for t in tokens]),
            r"SentencePiece vocabulary lacks the byte token <0x48>; llama\.cpp fails on any text that needs it")
    # an empty token is named [EMPTY_i] by llama.cpp: two of them are distinct
    assert check_gguf(write(tmp_path, with_tokens(tokens[:290] + ["", ""] + tokens[292:]))) is not None


def test_the_llm_refuses_before_llama_cpp_sees_the_file(tiny, tmp_path, base, make_llm):
    # loaded in this process: without the check, llama.cpp would abort it (GGML_ASSERT on n_layer)
    bad = write(tmp_path, rebuilt(base, lambda s: s.set("llama.block_count", gf.U32, 0)), "block_count_0.gguf")
    with pytest.raises(ModelLoadError, match=r"could not load '.*block_count_0\.gguf': llama\.block_count is 0; "
                                             r"llama\.cpp needs 1 to 512 layers; llama\.cpp does not refuse such"):
        make_llm(str(bad))
    with pytest.raises(ModelLoadError, match=r"block_count is 0"):
        make_llm(tiny["target"], str(bad))
    llm = make_llm(tiny["target"], tiny["draft"])
    before = llm.draft_path
    with pytest.raises(ModelLoadError, match=r"block_count is 0"):
        llm.set_draft(str(bad))
    assert llm.draft_path == before  # the old drafter stays
    assert llm.generate("Hello", max_tokens=4, draft_length=2).stats.n_generated == 4
    with pytest.raises(ModelLoadError, match=r"block_count is 0"):  # an embedding model too (it aborted)
        make_llm(tiny["target"], embedding_model=str(bad))


@pytest.mark.real
def test_the_real_models_pass_quickly(real_models):
    for path in real_models.values():
        t0 = time.monotonic()
        info = check_gguf(path)
        dt = time.monotonic() - t0
        assert len(info.metadata["tokenizer.ggml.tokens"]) > 100_000
        assert dt < 2.0, f"{os.path.basename(path)}: {dt:.2f} s"


def test_a_random_corruption_never_escapes_as_another_exception(tmp_path, base):
    """Whatever the bytes, check_gguf returns or raises ModelLoadError."""
    rng = np.random.default_rng(0)
    raw = bytearray(base[1])
    head = base[2].data_start
    for i in range(300):
        data = bytearray(raw)
        for _ in range(1 + i % 4):
            data[int(rng.integers(0, head))] ^= 1 << int(rng.integers(0, 8))
        if i % 3 == 0:
            data = data[:int(rng.integers(1, len(data)))]
        try:
            check_gguf(write(tmp_path, bytes(data)))
        except ModelLoadError:
            pass


def test_an_exception_escaping_llama_cpp_is_typed(tmp_path, base):
    # straight to the core, past the Python pre-check: llama.cpp loads a SentencePiece vocabulary without the byte
    # token <0x48>, then its tokenizer throws std::out_of_range on "H" (byte fallback). That arrives as a
    # SpecLLMError naming llama.cpp, not as pybind11's untyped IndexError
    import specllm
    from specllm import _core

    names = list(gf.Spec.of(base[2]).get("tokenizer.ggml.tokens"))
    path = write(tmp_path, rebuilt(base, lambda s: s.set("tokenizer.ggml.tokens", gf.ARRAY,
                                                          [("<0xff>" if t == "<0x48>" else t) for t in names],
                                                          gf.STRING)), "no_0x48.gguf")
    opts = _core.EngineOptions()
    opts.target.path, opts.target.n_ctx, opts.target.n_threads = str(path), 256, 1
    engine = _core.Engine(opts)
    with pytest.raises(specllm.SpecLLMError, match="llama.cpp failed") as e:
        engine.target.tokenize("Hello", True, False)
    assert not isinstance(e.value, IndexError)
    # pybind11's own errors keep their classes
    with pytest.raises(IndexError):
        _core.AutoPolicy().acceptance(10**8)
