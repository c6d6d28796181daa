"""Tiny random llama-architecture GGUF models for fast, deterministic engine tests.

    python models/tiny.py OUTDIR      # writes the standard set (target, draft, draft_other_vocab)

The weights are random (seeded) F32; the vocabulary is SentencePiece-style ("llama") with byte fallback, so
llama.cpp can tokenize any UTF-8 text. Nothing here is trained: the models only have to load, be deterministic and
not repeat one token forever.
"""

import json
import os
import shutil
import sys

import gguf
import numpy as np

GENERATOR_VERSION = 1  # bump when the output of write_tiny_model changes, so cached models are rewritten

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# chat_template="tools": a Hermes-style template, as Qwen2.5's, that offers tools and asks for <tool_call> blocks
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "Call a tool: <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.tool_calls %}<|im_start|>assistant\n{{ m.content or '' }}{% for c in m.tool_calls %}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}"
    "<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Normal (non-byte) pieces; "\u2581" is SentencePiece's word-boundary marker (a space).
_WORDS = ["\u2581", "e", "t", "a", "o", "i", "n", "s", "r", "h", "l", "d", "\u2581t", "\u2581a", "th", "he",
          "in", "er", "an", "\u2581th", "\u2581the", "\u2581s", "\u2581w", "on", "re", "at", "en", "nd", "\u2581i",
          "\u2581o", "ou", "es", "or", "\u2581c", "\u2581b", "\u2581f", "ed", "is", "it", "ar"]
_WORDS_ALT = ["\u2581", "A", "B", "C", "0", "1", "2", "3", "4", "5", "\u2581A", "\u2581B", "\u25810", "00", "12",
              "AB", "\u2581AB", "x", "y", "z", "xy", "\u2581x", "yz"]


FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
REPO_TOKENS = ("<|repo_name|>", "<|file_sep|>")  # the repo-level FIM form's (Qwen2.5-Coder's)


def _vocab(kind):
    """Return (tokens, scores, types) for vocab kind "byte", "byte-alt", "byte-fim" ("byte" with Qwen2.5-Coder's
    fill-in-the-middle tokens, which llama.cpp finds by their text) or "byte-repo" ("byte-fim" with its repo-level
    tokens)."""
    T = gguf.TokenType
    specials = ["<unk>", "<s>", "</s>"] + {"byte-alt": ["<pad>"], "byte-fim": list(FIM_TOKENS),
                                           "byte-repo": list(FIM_TOKENS + REPO_TOKENS)}.get(kind, [])
    words = {"byte": _WORDS, "byte-alt": _WORDS_ALT, "byte-fim": _WORDS, "byte-repo": _WORDS}.get(kind)
    if words is None:
        raise ValueError(f"unknown vocab {kind!r}: expected 'byte', 'byte-alt', 'byte-fim' or 'byte-repo'")
    tokens = specials + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [T.UNKNOWN] + [T.CONTROL] * (len(specials) - 1) + [T.BYTE] * 256 + [T.NORMAL] * len(words)
    # SentencePiece merges the pair whose result has the highest score: prefer longer pieces.
    scores = [0.0] * (len(specials) + 256) + [float(len(w)) - i * 1e-3 for i, w in enumerate(words)]
    return tokens, scores, types


def _params(**kw):
    kw.pop("split_max_tensors", None)  # how the file is written, not what the model is
    if kw.get("arch") == "llama":  # the default, not stored: models written before arch existed stay valid
        del kw["arch"]
    if kw.get("chat_template") is None:  # likewise
        kw.pop("chat_template", None)
    return dict(kw, generator_version=GENERATOR_VERSION)


def write_tiny_model(path, *, seed=0, n_layer=2, n_embd=64, n_head=4, n_head_kv=4, n_ff=128, n_ctx_train=2048,
                     vocab="byte", eos_token_id=None, name="tiny", n_pad=0, add_bos=True, arch="llama",
                     chat_template=None, split_max_tensors=0):
    """Write a tiny GGUF model to `path` atomically (tmp file + os.replace) and return the path.
    chat_template: None for CHAT_TEMPLATE, "tools" for TOOLS_TEMPLATE, a template's text, or named templates
    ({"default": ..., "tool_use": ...}, each None, "tools" or a text; as Hermes 2 Pro's GGUFs carry them).
    split_max_tensors: > 0 writes a split GGUF of at most this many tensors a file, named as llama.cpp names them
    (path "x.gguf": x-00001-of-0000N.gguf, ...; the first returned).

    arch "llama" is a transformer (a KV cache that can be cut anywhere); "mamba" is a recurrent state-space model
    (one state per sequence that llama.cpp cannot roll back), for the engine's no-rollback path."""
    if arch not in ("llama", "mamba"):
        raise ValueError(f"unknown arch {arch!r}: expected 'llama' or 'mamba'")
    if n_embd % n_head or n_head % n_head_kv:
        raise ValueError("n_embd must be divisible by n_head, and n_head by n_head_kv")
    tokens, scores, types = _vocab(vocab)
    if n_pad:  # padding at the end of the vocabulary, as Qwen2.5-7B+ has: ids no text maps to
        tokens = tokens + [f"<pad_{i}>" for i in range(n_pad)]
        scores = scores + [0.0] * n_pad
        types = types + [gguf.TokenType.UNUSED] * n_pad
    n_vocab = len(tokens)
    eos = 2 if eos_token_id is None else int(eos_token_id)
    if not 0 <= eos < n_vocab:
        raise ValueError(f"eos_token_id {eos} out of range [0, {n_vocab})")
    params = _params(seed=seed, n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                     n_ctx_train=n_ctx_train, vocab=vocab, eos_token_id=eos, name=name, n_pad=n_pad,
                     add_bos=add_bos, arch=arch, chat_template=chat_template)
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv

    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    if split_max_tensors:  # the writer names the files from its path: written in a directory of their own
        tmp = os.path.join(f"{path}.tmp{os.getpid()}", os.path.basename(path))
        os.makedirs(os.path.dirname(tmp), exist_ok=True)
    w = gguf.GGUFWriter(tmp, arch=arch, split_max_tensors=split_max_tensors)
    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_string("specllm.tiny_params", json.dumps(params, sort_keys=True))
    w.add_vocab_size(n_vocab)
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_layer_norm_rms_eps(1e-5)
    d_inner, d_state, d_conv, dt_rank = 2 * n_embd, 8, 4, max(1, n_embd // 16)
    if arch == "llama":
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head_kv)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(10000.0)
    else:
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_head_count_kv(0)
        w.add_ssm_conv_kernel(d_conv)
        w.add_ssm_inner_size(d_inner)
        w.add_ssm_state_size(d_state)
        w.add_ssm_time_step_rank(dt_rank)

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(bool(add_bos))
    w.add_add_eos_token(False)
    if isinstance(chat_template, dict):  # named templates: {"default": ..., "tool_use": ...}
        w.add_chat_template([{"name": k, "template": {None: CHAT_TEMPLATE, "tools": TOOLS_TEMPLATE}.get(v, v)}
                             for k, v in chat_template.items()])
    else:
        w.add_chat_template({None: CHAT_TEMPLATE, "tools": TOOLS_TEMPLATE}.get(chat_template, chat_template))

    # Weights depend only on the seed and shapes (never on eos_token_id), so models that differ only in their
    # EOS id generate the same tokens up to the EOS.
    rng = np.random.default_rng(seed)

    def mat(n_out, n_in, gain=1.0):  # numpy (out, in) = ggml ne [in, out]
        return (rng.standard_normal((n_out, n_in)) * gain / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w.add_tensor("token_embd.weight", (0.5 * rng.standard_normal((n_vocab, n_embd))).astype(np.float32))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm(n_embd))
        if arch == "mamba":
            w.add_tensor(f"blk.{i}.ssm_in.weight", mat(2 * d_inner, n_embd))
            w.add_tensor(f"blk.{i}.ssm_conv1d.weight", mat(d_inner, d_conv))
            w.add_tensor(f"blk.{i}.ssm_conv1d.bias", (0.1 * rng.standard_normal(d_inner)).astype(np.float32))
            w.add_tensor(f"blk.{i}.ssm_x.weight", mat(dt_rank + 2 * d_state, d_inner))
            w.add_tensor(f"blk.{i}.ssm_dt.weight", mat(d_inner, dt_rank))
            w.add_tensor(f"blk.{i}.ssm_dt.bias", (0.1 * rng.standard_normal(d_inner)).astype(np.float32))
            # A = -exp(A_log) < 0: a decaying state
            w.add_tensor(f"blk.{i}.ssm_a", -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1)))
            w.add_tensor(f"blk.{i}.ssm_d", np.ones(d_inner, dtype=np.float32))
            w.add_tensor(f"blk.{i}.ssm_out.weight", mat(n_embd, d_inner, 2.0))
            continue
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(n_embd, n_embd, 2.0))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(n_embd_kv, n_embd, 2.0))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(n_embd_kv, n_embd, 2.0))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm(n_embd))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(n_embd, n_ff, 2.0))
    w.add_tensor("output_norm.weight", norm(n_embd))
    out = mat(n_vocab, n_embd, 4.0)
    # Damp special tokens, ASCII control bytes and bytes >= 0x80 so that greedy output is mostly printable and
    # never stops by itself (a test gets an EOS by choosing, as eos_token_id, a token the model does generate).
    n_special = types.index(gguf.TokenType.BYTE)
    out[:n_special] *= 0.1
    damped = [b for b in range(256) if (b < 0x20 and b != 0x0A) or b >= 0x7F]
    out[[n_special + b for b in damped]] *= 0.5
    if n_pad:
        out[n_vocab - n_pad:] *= 3.0  # padding the model often prefers: a drafter must not propose it
    w.add_tensor("output.weight", out)

    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if not split_max_tensors:
            os.replace(tmp, path)
            return path
        parts = sorted(os.listdir(os.path.dirname(tmp)))
        for part in parts:
            os.replace(os.path.join(os.path.dirname(tmp), part), os.path.join(os.path.dirname(path), part))
        os.rmdir(os.path.dirname(tmp))
        return os.path.join(os.path.dirname(path), parts[0])
    except BaseException:
        w.close()
        if split_max_tensors:
            shutil.rmtree(os.path.dirname(tmp), ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)
        raise


def read_params(path):
    """The generator parameters stored in a tiny model, or None if it is not one (or unreadable)."""
    try:
        field = gguf.GGUFReader(path).get_field("specllm.tiny_params")
        return json.loads(field.contents()) if field is not None else None
    except Exception:
        return None


STANDARD_SET = {
    "target": dict(seed=0, name="tiny-target"),
    "draft": dict(seed=2, n_layer=1, n_embd=32, n_head=4, n_head_kv=2, n_ff=64, name="tiny-draft"),
    "draft_other_vocab": dict(seed=3, n_layer=1, n_embd=32, n_ff=64, vocab="byte-alt", name="tiny-other-vocab"),
    # ~135 tokens/s on one thread here (83 MB): long enough generations to disconnect from, queue behind, cancel
    "slow": dict(seed=11, n_layer=6, n_embd=512, n_head=8, n_head_kv=8, n_ff=1536, name="tiny-slow"),
    # a recurrent (Mamba) model: llama.cpp cannot cut its state back to an earlier position
    "recurrent": dict(seed=5, n_embd=64, name="tiny-mamba", arch="mamba"),
}


def tiny_model_set(outdir):
    """Write (unless already present with the same parameters) and return {"target", "draft", "draft_other_vocab",
    "slow"}."""
    paths = {}
    for role, kw in STANDARD_SET.items():
        path = os.path.join(os.fspath(outdir), f"{role}.gguf")
        full = dict(write_tiny_model.__kwdefaults__, **kw)
        full["eos_token_id"] = 2 if full["eos_token_id"] is None else full["eos_token_id"]
        if not os.path.exists(path) or read_params(path) != _params(**full):
            write_tiny_model(path, **kw)
        paths[role] = path
    return paths


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python models/tiny.py OUTDIR")
    for role, p in tiny_model_set(sys.argv[1]).items():
        print(f"{role}: {p} ({os.path.getsize(p)} bytes)")
