"""Malformed-GGUF fuzzing: write hundreds of damaged variants of a tiny valid model, load each one in a process of
its own (as the target, and as the draft beside a valid target), and classify what happened.

    python -m tests.gguf_fuzz --out DIR [--workers 2] [--timeout 60] [--only CATEGORY ...] [--report FILE]
                              [--mode fork|spawn] [--no-check]
    python tests/gguf_fuzz.py --out DIR

--mode fork (default): per worker, a server process imports specllm once and forks a fresh child per load (~30 s
for the set on 2 cores); --mode spawn: a fresh interpreter per load (~3-5 min; the same outcomes file by file).
--no-check: without specllm's GGUF pre-check (specllm/gguf_check.py), i.e. what llama.cpp does on its own.

A load must end in "ok" (the model loaded and generated) or "typed error" (a specllm exception); "untyped error"
(any other Python exception, or a non-zero exit without an outcome line), "signal" (SIGSEGV, SIGABRT, ...) and
"hang" (no outcome within the timeout) are failures.

The variants are deterministic (seeded). Categories: control (valid files that must load), truncation at every
structural boundary and at random offsets, bit flips in the header / metadata / tensor infos, absurd counts,
lengths, tensor dims and offsets, wrong tensor types and shapes, NaN / inf weights, metadata type confusion and
bad values, vocabulary damage, and drafts whose vocabulary differs from the target's.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import pathlib
import random
import signal
import struct
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# --- the GGUF format -----------------------------------------------------------------------------------------------

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<B", U64: "<Q",
              I64: "<q", F64: "<d"}
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_Q4_K = 0, 1, 2, 8, 12
GGML_I8, GGML_I16, GGML_I32, GGML_I64, GGML_F64, GGML_BF16 = 24, 25, 26, 27, 28, 30
ALIGNMENT = 32

BASE_CONFIG = dict(n_layer=1, n_embd=32, n_head=4, n_head_kv=2, n_ff=64, n_ctx_train=256)


def u32(v: int) -> bytes:
    return struct.pack("<I", v & 0xFFFFFFFF)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


def enc_str(s) -> bytes:
    b = s if isinstance(s, bytes) else s.encode()
    return u64(len(b)) + b


def enc_scalar(vtype: int, value) -> bytes:
    if vtype == STRING:
        return enc_str(value)
    return struct.pack(SCALAR_FMT[vtype], value)


def enc_value(vtype: int, value, atype: Optional[int] = None) -> bytes:
    """The bytes after a KV's type field: a scalar, or (atype, count, items) for an array."""
    if vtype == ARRAY:
        return u32(atype) + u64(len(value)) + b"".join(enc_scalar(atype, v) for v in value)
    return enc_scalar(vtype, value)


@dataclasses.dataclass
class KV:
    key: str
    vtype: int
    start: int          # offset of the key's length field
    type_off: int
    value_off: int      # first byte after the type field
    end: int
    payload: bytes      # raw bytes from value_off to end
    atype: Optional[int] = None
    count: int = 0
    items: List[Tuple[int, int]] = dataclasses.field(default_factory=list)  # (offset of length field, length)

    def value(self):
        """The decoded value (arrays as lists; strings as str)."""
        return decode_value(self.vtype, self.payload)


@dataclasses.dataclass
class TensorInfo:
    name: str
    dims: List[int]
    ggml_type: int
    offset: int
    start: int
    ndims_off: int
    dims_off: List[int]
    type_off: int
    offset_off: int
    end: int

    @property
    def nbytes(self) -> int:  # the base models are all F32
        assert self.ggml_type == GGML_F32
        return 4 * int(np.prod(self.dims))


@dataclasses.dataclass
class Layout:
    raw: bytes
    version: int
    n_tensors: int
    n_kv: int
    kvs: List[KV]
    tensors: List[TensorInfo]
    info_end: int
    data_start: int

    def kv(self, key: str) -> KV:
        return next(k for k in self.kvs if k.key == key)

    def tensor(self, name: str) -> TensorInfo:
        return next(t for t in self.tensors if t.name == name)

    def data_of(self, t: TensorInfo) -> bytes:
        return self.raw[self.data_start + t.offset:self.data_start + t.offset + t.nbytes]


def decode_value(vtype: int, b: bytes):
    if vtype == STRING:
        n = struct.unpack_from("<Q", b)[0]
        return b[8:8 + n].decode()
    if vtype == ARRAY:
        atype, n = struct.unpack_from("<IQ", b)
        pos, out = 12, []
        for _ in range(n):
            if atype == STRING:
                ln = struct.unpack_from("<Q", b, pos)[0]
                out.append(b[pos + 8:pos + 8 + ln].decode())
                pos += 8 + ln
            else:
                out.append(struct.unpack_from(SCALAR_FMT[atype], b, pos)[0])
                pos += struct.calcsize(SCALAR_FMT[atype])
        return out
    return struct.unpack_from(SCALAR_FMT[vtype], b)[0]


def parse(raw: bytes) -> Layout:
    """Parse a valid GGUF file (the generator's own base models: no error handling)."""
    assert raw[:4] == b"GGUF"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
    pos = 24
    kvs = []
    for _ in range(n_kv):
        start = pos
        klen = struct.unpack_from("<Q", raw, pos)[0]
        key = raw[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        type_off = pos
        vtype = struct.unpack_from("<I", raw, pos)[0]
        pos += 4
        value_off = pos
        atype, count, items = None, 0, []
        if vtype == ARRAY:
            atype, count = struct.unpack_from("<IQ", raw, pos)
            pos += 12
            for _ in range(count):
                if atype == STRING:
                    ln = struct.unpack_from("<Q", raw, pos)[0]
                    items.append((pos, ln))
                    pos += 8 + ln
                else:
                    items.append((pos, struct.calcsize(SCALAR_FMT[atype])))
                    pos += struct.calcsize(SCALAR_FMT[atype])
        elif vtype == STRING:
            pos += 8 + struct.unpack_from("<Q", raw, pos)[0]
        else:
            pos += struct.calcsize(SCALAR_FMT[vtype])
        kvs.append(KV(key, vtype, start, type_off, value_off, pos, raw[value_off:pos], atype, count, items))
    tensors = []
    for _ in range(n_tensors):
        start = pos
        nlen = struct.unpack_from("<Q", raw, pos)[0]
        name = raw[pos + 8:pos + 8 + nlen].decode()
        pos += 8 + nlen
        ndims_off = pos
        ndims = struct.unpack_from("<I", raw, pos)[0]
        pos += 4
        dims_off = [pos + 8 * i for i in range(ndims)]
        dims = list(struct.unpack_from(f"<{ndims}Q", raw, pos))
        pos += 8 * ndims
        type_off = pos
        gtype = struct.unpack_from("<I", raw, pos)[0]
        offset_off = pos + 4
        offset = struct.unpack_from("<Q", raw, pos + 4)[0]
        pos += 12
        tensors.append(TensorInfo(name, dims, gtype, offset, start, ndims_off, dims_off, type_off, offset_off, pos))
    alignment = ALIGNMENT
    for k in kvs:
        if k.key == "general.alignment":
            alignment = k.value()
    data_start = (pos + alignment - 1) // alignment * alignment
    return Layout(raw, version, n_tensors, n_kv, kvs, tensors, pos, data_start)


# --- a model spec that can be rebuilt into a (consistent or not) GGUF file -----------------------------------------

@dataclasses.dataclass
class TensorSpec:
    name: str
    dims: List[int]
    ggml_type: int
    data: bytes


@dataclasses.dataclass
class Spec:
    kvs: List[Tuple[str, int, bytes]]   # (key, type, encoded value after the type field)
    tensors: List[TensorSpec]
    alignment: int = ALIGNMENT

    @classmethod
    def of(cls, lay: Layout) -> "Spec":
        return cls([(k.key, k.vtype, k.payload) for k in lay.kvs],
                   [TensorSpec(t.name, list(t.dims), t.ggml_type, lay.data_of(t)) for t in lay.tensors])

    def copy(self) -> "Spec":
        return Spec(list(self.kvs), [dataclasses.replace(t, dims=list(t.dims)) for t in self.tensors], self.alignment)

    # metadata
    def set(self, key: str, vtype: int, value, atype: Optional[int] = None) -> "Spec":
        return self.set_raw(key, vtype, enc_value(vtype, value, atype))

    def set_raw(self, key: str, vtype: int, payload: bytes) -> "Spec":
        for i, (k, _, _) in enumerate(self.kvs):
            if k == key:
                self.kvs[i] = (key, vtype, payload)
                return self
        self.kvs.append((key, vtype, payload))
        return self

    def drop(self, key: str) -> "Spec":
        self.kvs = [kv for kv in self.kvs if kv[0] != key]
        return self

    def get(self, key: str):
        return next(decode_value(t, p) for k, t, p in self.kvs if k == key)

    # tensors
    def t(self, name: str) -> TensorSpec:
        return next(t for t in self.tensors if t.name == name)

    def array(self, name: str) -> np.ndarray:
        t = self.t(name)
        assert t.ggml_type == GGML_F32
        return np.frombuffer(t.data, dtype=np.float32).reshape(list(reversed(t.dims)))

    def set_tensor(self, name: str, arr=None, *, dims=None, ggml_type=GGML_F32, data: Optional[bytes] = None):
        t = self.t(name)
        if arr is not None:
            arr = np.ascontiguousarray(arr)
            t.dims, t.data = list(reversed(arr.shape)), arr.tobytes()
        if dims is not None:
            t.dims = list(dims)
        if data is not None:
            t.data = data
        t.ggml_type = ggml_type
        return self

    def drop_tensor(self, name: str) -> "Spec":
        self.tensors = [t for t in self.tensors if t.name != name]
        return self

    def build(self, *, n_kv=None, n_tensors=None, version=3, offsets: Optional[Dict[str, int]] = None) -> bytes:
        out = [b"GGUF", u32(version), u64(len(self.tensors) if n_tensors is None else n_tensors),
               u64(len(self.kvs) if n_kv is None else n_kv)]
        for key, vtype, payload in self.kvs:
            out += [enc_str(key), u32(vtype), payload]
        a = self.alignment
        off, blobs = 0, []
        for t in self.tensors:
            o = off if not offsets or t.name not in offsets else offsets[t.name]
            out += [enc_str(t.name), u32(len(t.dims)), b"".join(u64(d) for d in t.dims), u32(t.ggml_type), u64(o)]
            pad = (-len(t.data)) % a
            blobs.append(t.data + b"\0" * pad)
            off += len(t.data) + pad
        head = b"".join(out)
        head += b"\0" * ((-len(head)) % a)
        return head + b"".join(blobs)


# --- the variants ---------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Variant:
    category: str
    name: str
    what: str
    data: bytes
    expect_ok: bool = False  # a control: must load and generate in both roles


def _patch(raw: bytes, off: int, b: bytes) -> bytes:
    return raw[:off] + b + raw[off + len(b):]


def _flip(raw: bytes, off: int, bit: int) -> bytes:
    return raw[:off] + bytes([raw[off] ^ (1 << bit)]) + raw[off + 1:]


def _q8_0(arr: np.ndarray) -> bytes:
    """ggml's Q8_0 of a float32 array whose rows are a multiple of 32 long (one f16 scale + 32 int8 per block)."""
    blocks = arr.astype(np.float32).reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / 127.0
    q = np.round(blocks / np.where(d == 0, 1, d)[:, None]).astype(np.int8)
    out = np.empty(len(blocks), dtype=[("d", "<f2"), ("q", "i1", 32)])
    out["d"], out["q"] = d.astype(np.float16), q
    return out.tobytes()


def _bf16(arr: np.ndarray) -> bytes:
    return (np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def generate_variants(base: bytes, seed: int = 14) -> List[Variant]:
    """All malformed variants of the base model (bytes), in a fixed order."""
    lay = parse(base)
    spec = Spec.of(lay)
    out: List[Variant] = []
    size = len(base)

    def add(category, name, what, data, expect_ok=False):
        out.append(Variant(category, name, what, data, expect_ok))

    def rebuilt(category, name, what, edit: Callable[[Spec], Optional[Spec]], expect_ok=False, **build):
        s = spec.copy()
        s = edit(s) or s
        add(category, name, what, s.build(**build), expect_ok)

    # -- control: valid files that must load (guards against a runner that fails everything)
    add("control", "base", "the base model as written by models/tiny.py", base, True)
    rebuilt("control", "rebuilt", "the base model re-serialized by this generator", lambda s: s, True)

    def align64(s):
        s.alignment = 64
        s.set("general.alignment", U32, 64)
    rebuilt("control", "alignment-64", "general.alignment = 64 (data aligned accordingly)", align64, True)

    # -- truncation at every structural boundary
    cuts = {1: "inside the magic", 4: "after the magic", 6: "inside the version", 8: "after the version",
            12: "inside n_tensors", 16: "after n_tensors", 20: "inside n_kv", 24: "after n_kv (before the first KV)"}
    for i, k in enumerate(lay.kvs):
        cuts.setdefault(k.end, f"after KV {i} ({k.key})")
    for k in lay.kvs[:2] + [lay.kv("tokenizer.ggml.tokens")]:
        cuts.setdefault(k.start + 4, f"inside the key length of {k.key}")
        cuts.setdefault(k.start + 8 + 3, f"inside the key {k.key}")
        cuts.setdefault(k.value_off, f"after the type of {k.key}")
        cuts.setdefault(k.value_off + 6, f"inside the value of {k.key}")
    tok = lay.kv("tokenizer.ggml.tokens")
    cuts.setdefault(tok.items[100][0] + 9, "inside token 100's text")
    t0 = lay.tensors[0]
    for off, what in [(t0.start + 4, "inside the name length"), (t0.start + 12, "inside the name"),
                      (t0.ndims_off + 2, "inside n_dims"), (t0.dims_off[0] + 4, "inside dims[0]"),
                      (t0.dims_off[1], "after dims[0]"), (t0.type_off + 2, "inside the type"),
                      (t0.offset_off, "after the type"), (t0.offset_off + 4, "inside the offset")]:
        cuts.setdefault(off, f"tensor info 0 ({t0.name}): {what}")
    for i, t in enumerate(lay.tensors):
        cuts.setdefault(t.end, f"after tensor info {i} ({t.name})")
    if lay.data_start - lay.info_end > 1:
        cuts.setdefault(lay.info_end + 1, "inside the alignment padding")
    cuts.setdefault(lay.data_start, "after the padding (no tensor data)")
    for t in lay.tensors:
        cuts.setdefault(lay.data_start + t.offset + t.nbytes // 2, f"inside the data of {t.name}")
    cuts.setdefault(size - 1, "one byte short of the end")
    for off in sorted(cuts):
        if 0 < off < size:
            add("truncate-boundary", f"at-{off}", f"truncated at byte {off}: {cuts[off]}", base[:off])

    # -- truncation at random offsets
    rng = random.Random(seed * 1000 + 1)
    for off in sorted(rng.sample(range(1, size), 20)):
        add("truncate-random", f"at-{off}", f"truncated at random byte {off} of {size}", base[:off])

    # -- bit flips in the header
    rng = random.Random(seed * 1000 + 2)
    header_flips = [(off, rng.randrange(8)) for off in range(24)]
    for off, bit in header_flips:
        field = "magic" if off < 4 else "version" if off < 8 else "n_tensors" if off < 16 else "n_kv"
        add("bitflip-header", f"byte-{off}-bit-{bit}", f"bit {bit} of header byte {off} ({field}) flipped",
            _flip(base, off, bit))

    # -- bit flips in the metadata: half in structural fields (lengths, types, counts), half anywhere in the KVs
    rng = random.Random(seed * 1000 + 3)
    structural = []
    for k in lay.kvs:
        structural += [(k.start + j, f"key length of {k.key}") for j in range(8)]
        structural += [(k.type_off + j, f"type of {k.key}") for j in range(4)]
        if k.vtype == ARRAY:
            structural += [(k.value_off + j, f"element type of {k.key}") for j in range(4)]
            structural += [(k.value_off + 4 + j, f"count of {k.key}") for j in range(8)]
        if k.vtype == STRING:
            structural += [(k.value_off + j, f"string length of {k.key}") for j in range(8)]
    for off, what in rng.sample(structural, 20):
        bit = rng.randrange(8)
        add("bitflip-metadata", f"struct-{off}-bit-{bit}", f"bit {bit} of byte {off} flipped ({what})",
            _flip(base, off, bit))
    for _ in range(20):
        off, bit = rng.randrange(24, lay.kvs[-1].end), rng.randrange(8)
        k = next(k for k in lay.kvs if k.start <= off < k.end)
        add("bitflip-metadata", f"any-{off}-bit-{bit}", f"bit {bit} of byte {off} flipped (inside KV {k.key})",
            _flip(base, off, bit))

    # -- bit flips in the tensor infos
    rng = random.Random(seed * 1000 + 4)
    for _ in range(30):
        off, bit = rng.randrange(lay.tensors[0].start, lay.info_end), rng.randrange(8)
        t = next(t for t in lay.tensors if t.start <= off < t.end)
        field = ("name length" if off < t.start + 8 else "name" if off < t.ndims_off else "n_dims"
                 if off < t.ndims_off + 4 else "dims" if off < t.type_off else "type" if off < t.offset_off
                 else "offset")
        add("bitflip-tensor-info", f"{off}-bit-{bit}", f"bit {bit} of byte {off} flipped ({t.name}: {field})",
            _flip(base, off, bit))

    # -- absurd counts
    for field, off in (("n_tensors", 8), ("n_kv", 16)):
        n = lay.n_tensors if field == "n_tensors" else lay.n_kv
        for v, label in [(2 ** 63, "2^63"), (2 ** 63 - 1, "2^63-1"), (2 ** 64 - 1, "2^64-1 (-1 as int64)"),
                         (2 ** 32, "2^32"), (2 ** 32 - 1, "2^32-1"), (10 ** 6, "10^6"), (0, "0"), (n + 1, "n+1"),
                         (n - 1, "n-1")]:
            add("absurd-counts", f"{field}-{v}", f"{field} = {label}", _patch(base, off, u64(v)))

    # -- absurd string / array lengths
    huge = [(2 ** 63, "2^63"), (2 ** 64 - 1, "2^64-1"), (2 ** 32, "2^32"), (size, "the file size")]
    k0 = lay.kvs[0]
    for v, label in huge + [(0, "0 (an empty key)")]:
        add("absurd-lengths", f"key0-len-{v}", f"the length of key 0 ({k0.key}) = {label}",
            _patch(base, k0.start, u64(v)))
    for v, label in [(2 ** 63, "2^63"), (2 ** 32, "2^32"), (2 ** 30 + 1, "2^30+1"), (tok.count + 1, "n+1"),
                     (tok.count - 1, "n-1"), (0, "0")]:
        add("absurd-lengths", f"tokens-count-{v}", f"the element count of tokenizer.ggml.tokens = {label}",
            _patch(base, tok.value_off + 4, u64(v)))
    for v, label in [(2 ** 63, "2^63"), (2 ** 40, "2^40")]:
        add("absurd-lengths", f"token0-len-{v}", f"the length of token 0's text = {label}",
            _patch(base, tok.items[0][0], u64(v)))
    tmpl = lay.kv("tokenizer.chat_template")
    for v, label in [(2 ** 63, "2^63"), (size, "the file size")]:
        add("absurd-lengths", f"template-len-{v}", f"the length of tokenizer.chat_template = {label}",
            _patch(base, tmpl.value_off, u64(v)))
    for v, label in [(2 ** 63, "2^63"), (64, "64 (too long for ggml)"), (0, "0")]:
        add("absurd-lengths", f"tensor0-name-len-{v}", f"the name length of tensor 0 = {label}",
            _patch(base, t0.start, u64(v)))

    # -- absurd tensor dims / offsets (byte patches of the tensor infos)
    te, out_w = lay.tensor("token_embd.weight"), lay.tensor("output.weight")
    mid = lay.tensor("blk.0.attn_q.weight")
    for v, label in [(5, "5 (> GGML_MAX_DIMS)"), (2 ** 32 - 1, "2^32-1"), (0, "0"), (1, "1")]:
        add("absurd-tensor-info", f"ndims-{v}", f"n_dims of {te.name} = {label}", _patch(base, te.ndims_off, u32(v)))
    for v, label in [(2 ** 62, "2^62"), (2 ** 63 - 1, "2^63-1"), (2 ** 64 - 1, "-1"), (0, "0"), (33, "33"),
                     (16, "16")]:
        add("absurd-tensor-info", f"embd-ne0-{v}", f"ne[0] of {te.name} = {label}",
            _patch(base, te.dims_off[0], u64(v)))
    for v, label in [(2 ** 40, "2^40"), (0, "0"), (300, "300 (one row more than the vocabulary)"), (298, "298")]:
        add("absurd-tensor-info", f"output-ne1-{v}", f"ne[1] of {out_w.name} = {label}",
            _patch(base, out_w.dims_off[1], u64(v)))
    for v, label in [(size * 2, "past the end of the file"), (2 ** 64 - 1, "2^64-1"),
                     (mid.offset + 1, "misaligned (+1)"),
                     (mid.offset + ALIGNMENT, "a gap of one alignment"),
                     (lay.tensors[2].offset, "overlapping the previous tensor"), (0, "0 (overlapping the first)")]:
        add("absurd-tensor-info", f"offset-{mid.name}-{v}", f"offset of {mid.name} = {label}",
            _patch(base, mid.offset_off, u64(v)))
    for v, label in [(size, "the file size (past the data)"), (out_w.offset + ALIGNMENT, "one alignment further"),
                     (2 ** 63, "2^63")]:
        add("absurd-tensor-info", f"offset-last-{v}", f"offset of the last tensor ({out_w.name}) = {label}",
            _patch(base, out_w.offset_off, u64(v)))

    # -- wrong tensor types
    for v, label in [(43, "43 (GGML_TYPE_COUNT)"), (4, "4 (removed Q4_2)"), (31, "31 (removed Q4_0_4_4)"),
                     (255, "255"), (2 ** 32 - 1, "-1"), (GGML_F16, "F16 (data size no longer matches)"),
                     (GGML_Q4_K, "Q4_K (row of 32 not a multiple of 256)"), (GGML_Q4_0, "Q4_0 (size mismatch)")]:
        add("tensor-type", f"embd-type-{v}", f"type of {te.name} = {label}", _patch(base, te.type_off, u32(v)))
    for v, label in [(GGML_F16, "F16 (last tensor: half its data read as F16)"),
                     (GGML_Q8_0, "Q8_0 (F32 bytes read as Q8_0)"), (GGML_I32, "I32 (same size, integer weights)"),
                     (GGML_I8, "I8")]:
        add("tensor-type", f"output-type-{v}", f"type of the last tensor {out_w.name} = {label}",
            _patch(base, out_w.type_off, u32(v)))
    rebuilt("tensor-type", "output-q8_0", "output.weight properly quantized to Q8_0 (a valid model)",
            lambda s: s.set_tensor("output.weight", dims=s.t("output.weight").dims, ggml_type=GGML_Q8_0,
                                   data=_q8_0(s.array("output.weight"))), expect_ok=True)
    rebuilt("tensor-type", "embd-f16", "token_embd.weight as F16 (a valid model)",
            lambda s: s.set_tensor("token_embd.weight", dims=s.t("token_embd.weight").dims, ggml_type=GGML_F16,
                                   data=s.array("token_embd.weight").astype(np.float16).tobytes()), expect_ok=True)
    rebuilt("tensor-type", "norm-q8_0", "blk.0.attn_norm.weight (a norm) quantized to Q8_0",
            lambda s: s.set_tensor("blk.0.attn_norm.weight", dims=[32], ggml_type=GGML_Q8_0,
                                   data=_q8_0(s.array("blk.0.attn_norm.weight"))))
    rebuilt("tensor-type", "norm-i32", "output_norm.weight as I32 (integer norm weights)",
            lambda s: s.set_tensor("output_norm.weight", dims=[32], ggml_type=GGML_I32,
                                   data=np.ones(32, np.int32).tobytes()))
    rebuilt("tensor-type", "attn_q-i8", "blk.0.attn_q.weight as I8 (integer matmul weights)",
            lambda s: s.set_tensor("blk.0.attn_q.weight", dims=[32, 32], ggml_type=GGML_I8,
                                   data=np.ones(32 * 32, np.int8).tobytes()))
    rebuilt("tensor-type", "ffn_down-i32", "blk.0.ffn_down.weight as I32",
            lambda s: s.set_tensor("blk.0.ffn_down.weight", dims=[64, 32], ggml_type=GGML_I32,
                                   data=np.ones(64 * 32, np.int32).tobytes()))
    rebuilt("tensor-type", "norm-f16", "blk.0.ffn_norm.weight as F16 (norms are F32 in converted files)",
            lambda s: s.set_tensor("blk.0.ffn_norm.weight", dims=[32], ggml_type=GGML_F16,
                                   data=s.array("blk.0.ffn_norm.weight").astype(np.float16).tobytes()))
    rebuilt("tensor-type", "norm-bf16", "output_norm.weight as BF16",
            lambda s: s.set_tensor("output_norm.weight", dims=[32], ggml_type=GGML_BF16,
                                   data=_bf16(s.array("output_norm.weight"))))
    rebuilt("tensor-type", "attn_k-bf16", "blk.0.attn_k.weight as BF16 (a valid model)",
            lambda s: s.set_tensor("blk.0.attn_k.weight", dims=[32, 16], ggml_type=GGML_BF16,
                                   data=_bf16(s.array("blk.0.attn_k.weight"))), expect_ok=True)
    rebuilt("tensor-type", "output-f64", "output.weight as F64",
            lambda s: s.set_tensor("output.weight", dims=[32, 299], ggml_type=GGML_F64,
                                   data=s.array("output.weight").astype(np.float64).tobytes()))
    rebuilt("tensor-type", "attn_v-i16", "blk.0.attn_v.weight as I16",
            lambda s: s.set_tensor("blk.0.attn_v.weight", dims=[32, 16], ggml_type=GGML_I16,
                                   data=np.ones(32 * 16, np.int16).tobytes()))
    rebuilt("tensor-type", "output-i64", "output.weight as I64",
            lambda s: s.set_tensor("output.weight", dims=[32, 299], ggml_type=GGML_I64,
                                   data=np.ones(32 * 299, np.int64).tobytes()))
    rebuilt("tensor-type", "embd-i32", "token_embd.weight as I32 (get_rows of integers)",
            lambda s: s.set_tensor("token_embd.weight", dims=[32, 299], ggml_type=GGML_I32,
                                   data=np.ones(32 * 299, np.int32).tobytes()))

    # -- wrong shapes (consistent files whose shapes do not match the hyperparameters)
    def transpose(name):
        return lambda s: s.set_tensor(name, s.array(name).T)
    for name in ("blk.0.ffn_gate.weight", "blk.0.ffn_down.weight"):
        rebuilt("tensor-shape", f"{name.split('.')[2]}-transposed", f"{name} transposed", transpose(name))
    rebuilt("tensor-shape", "output-transposed", "output.weight transposed", transpose("output.weight"))
    rebuilt("tensor-shape", "embd-one-row-less", "token_embd.weight with 298 rows for 299 tokens",
            lambda s: s.set_tensor("token_embd.weight", s.array("token_embd.weight")[:-1]))
    rebuilt("tensor-shape", "output-one-row-more", "output.weight with 300 rows for 299 tokens",
            lambda s: s.set_tensor("output.weight",
                                   np.vstack([s.array("output.weight"), np.zeros((1, 32), np.float32)])))
    rebuilt("tensor-shape", "output-3d", "output.weight reshaped to [32, 13, 23]",
            lambda s: s.set_tensor("output.weight", s.array("output.weight").reshape(23, 13, 32)))
    rebuilt("tensor-shape", "embd-1d", "token_embd.weight flattened to 1-D",
            lambda s: s.set_tensor("token_embd.weight", s.array("token_embd.weight").reshape(-1)))
    rebuilt("tensor-shape", "norm-empty", "blk.0.attn_norm.weight with 0 elements",
            lambda s: s.set_tensor("blk.0.attn_norm.weight", np.zeros(0, np.float32)))
    rebuilt("tensor-shape", "n_embd-64", "llama.embedding_length = 64 while the tensors have 32",
            lambda s: s.set("llama.embedding_length", U32, 64))
    rebuilt("tensor-shape", "n_ff-128", "llama.feed_forward_length = 128 while the tensors have 64",
            lambda s: s.set("llama.feed_forward_length", U32, 128))
    rebuilt("tensor-shape", "no-attn_q", "blk.0.attn_q.weight missing", lambda s: s.drop_tensor("blk.0.attn_q.weight"))
    rebuilt("tensor-shape", "no-token_embd", "token_embd.weight missing", lambda s: s.drop_tensor("token_embd.weight"))
    rebuilt("tensor-shape", "no-output", "output.weight missing (llama ties it to token_embd: a valid model)",
            lambda s: s.drop_tensor("output.weight"), expect_ok=True)

    def extra(name):
        def edit(s):
            s.tensors.append(TensorSpec(name, [32], GGML_F32, np.ones(32, np.float32).tobytes()))
        return edit
    rebuilt("tensor-shape", "extra-unknown", "an extra tensor 'bogus.weight'", extra("bogus.weight"))
    rebuilt("tensor-shape", "extra-layer", "an extra tensor of a layer that does not exist (blk.7)",
            extra("blk.7.attn_norm.weight"))

    def duplicate(s):
        s.tensors.append(dataclasses.replace(s.t("output_norm.weight")))
    rebuilt("tensor-shape", "duplicate-tensor", "output_norm.weight twice", duplicate)

    # -- NaN / inf weights (patched in place)
    def fill(name, value, rows=None):
        t = lay.tensor(name)
        arr = np.frombuffer(lay.data_of(t), np.float32).reshape(list(reversed(t.dims))).copy()
        if rows is None:
            arr[...] = value
        else:
            arr[rows] = value
        return _patch(base, lay.data_start + t.offset, arr.tobytes())
    for name, value, rows, what in [
            ("token_embd.weight", np.nan, None, "all of token_embd NaN"),
            ("token_embd.weight", np.nan, 1, "the BOS row of token_embd NaN"),
            ("token_embd.weight", np.inf, None, "all of token_embd +inf"),
            ("output.weight", np.nan, None, "all of output NaN"),
            ("output.weight", np.nan, 100, "one row of output NaN"),
            ("output.weight", -np.inf, None, "all of output -inf"),
            ("output_norm.weight", np.inf, None, "output_norm +inf"),
            ("blk.0.attn_norm.weight", np.nan, None, "attn_norm NaN"),
            ("blk.0.ffn_down.weight", -np.inf, None, "ffn_down -inf"),
            ("blk.0.attn_q.weight", 3e38, None, "attn_q 3e38 (overflows to inf)")]:
        add("nan-weights", what.replace(" ", "-").replace("+", ""), what, fill(name, value, rows))

    # -- metadata type confusion
    for key, vtype, value, atype, what in [
            ("llama.block_count", STRING, "1", None, "as a string"),
            ("llama.block_count", U64, 1, None, "as a u64"),
            ("llama.block_count", I32, 1, None, "as an i32"),
            ("llama.block_count", F32, 1.0, None, "as an f32"),
            ("llama.block_count", ARRAY, [1], U32, "as an array [1]"),
            ("llama.block_count", BOOL, 1, None, "as a bool"),
            ("llama.attention.head_count", STRING, "4", None, "as a string"),
            ("llama.attention.head_count", ARRAY, [4, 4], U32, "as an array of 2 for 1 layer"),
            ("llama.attention.head_count", ARRAY, [4], U32, "as an array of 1 (a valid per-layer form)"),
            ("llama.attention.head_count", ARRAY, ["4"], STRING, "as an array of strings"),
            ("llama.context_length", STRING, "256", None, "as a string"),
            ("llama.embedding_length", F64, 32.0, None, "as an f64"),
            ("llama.rope.freq_base", STRING, "10000", None, "as a string"),
            ("llama.attention.layer_norm_rms_epsilon", U32, 0, None, "as a u32"),
            ("general.architecture", U32, 1, None, "as a u32"),
            ("general.architecture", STRING, "bogus", None, "= 'bogus'"),
            ("general.architecture", STRING, "", None, "= ''"),
            ("general.architecture", STRING, "clip", None, "= 'clip' (not a text model)"),
            ("general.alignment", STRING, "32", None, "as a string"),
            ("general.alignment", U32, 0, None, "= 0"),
            ("general.alignment", U32, 3, None, "= 3 (not a power of 2)"),
            ("general.alignment", U64, 32, None, "as a u64"),
            ("tokenizer.ggml.model", STRING, "bogus", None, "= 'bogus'"),
            ("tokenizer.ggml.model", STRING, "gpt2", None, "= 'gpt2' (BPE without merges)"),
            ("tokenizer.ggml.model", U32, 1, None, "as a u32"),
            ("tokenizer.ggml.pre", STRING, "bogus", None, "= 'bogus'"),
            ("tokenizer.ggml.add_bos_token", STRING, "true", None, "as a string"),
            ("tokenizer.ggml.bos_token_id", STRING, "1", None, "as a string"),
            ("tokenizer.ggml.bos_token_id", F32, 1.0, None, "as an f32"),
            ("llama.rope.scaling.type", STRING, "bogus", None, "= 'bogus'"),
            ("tokenizer.chat_template", U32, 7, None, "as a u32")]:
        rebuilt("metadata-type", f"{key}-{what}".replace(" ", "-").replace("'", ""), f"{key} {what}",
                lambda s, a=(key, vtype, value, atype): s.set(*a))
    rebuilt("metadata-type", "no-architecture", "general.architecture missing",
            lambda s: s.drop("general.architecture"))
    rebuilt("metadata-type", "no-block_count", "llama.block_count missing", lambda s: s.drop("llama.block_count"))
    rebuilt("metadata-type", "no-head_count", "llama.attention.head_count missing",
            lambda s: s.drop("llama.attention.head_count"))
    rebuilt("metadata-type", "no-embedding_length", "llama.embedding_length missing",
            lambda s: s.drop("llama.embedding_length"))
    rebuilt("metadata-type", "nested-array", "an array of arrays (tokenizer.ggml.scores)",
            lambda s: s.set_raw("tokenizer.ggml.scores", ARRAY, u32(ARRAY) + u64(1) + u32(F32) + u64(0)))
    rebuilt("metadata-type", "invalid-kv-type", "a KV of type 13 (does not exist)",
            lambda s: s.set_raw("general.bogus", 13, u32(0)))
    rebuilt("metadata-type", "duplicate-key", "llama.block_count twice",
            lambda s: s.kvs.append(("llama.block_count", U32, u32(1))))

    # -- bad hyperparameter values
    for key, values in [
            ("llama.block_count", [0, 2, 100, 513, 2 ** 32 - 1]),
            ("llama.attention.head_count", [0, 3, 5, 64, 2 ** 31, 2 ** 32 - 1]),
            ("llama.attention.head_count_kv", [0, 3, 8, 2 ** 32 - 1]),
            ("llama.context_length", [0, 1, 2 ** 32 - 1]),
            ("llama.embedding_length", [0, 1, 2 ** 32 - 1]),
            ("llama.feed_forward_length", [0, 2 ** 32 - 1]),
            ("llama.rope.dimension_count", [0, 7, 2 ** 32 - 1]),
            ("llama.expert_count", [4, 2000]),
            ("llama.expert_used_count", [2]),
            ("llama.nextn_predict_layers", [5])]:
        for v in values:
            rebuilt("metadata-value", f"{key}-{v}", f"{key} = {v}", lambda s, k=key, v=v: s.set(k, U32, v))
    for key, values in [("llama.attention.layer_norm_rms_epsilon", [0.0, float("nan"), -1.0]),
                        ("llama.rope.freq_base", [0.0, float("nan"), -1.0, float("inf")]),
                        ("llama.rope.scaling.factor", [float("nan"), -1.0])]:
        for v in values:
            rebuilt("metadata-value", f"{key}-{v}", f"{key} = {v}", lambda s, k=key, v=v: s.set(k, F32, v))

    # -- vocabulary damage
    tokens = spec.get("tokenizer.ggml.tokens")
    scores = spec.get("tokenizer.ggml.scores")
    types = spec.get("tokenizer.ggml.token_type")

    def vocab(name, what, tokens_=None, scores_=None, types_=None, extra_edit=None):
        def edit(s):
            for key, val, atype in (("tokenizer.ggml.tokens", tokens_, STRING),
                                    ("tokenizer.ggml.scores", scores_, F32),
                                    ("tokenizer.ggml.token_type", types_, I32)):
                if val == "drop":
                    s.drop(key)
                elif val is not None:
                    s.set(key, ARRAY, val, atype)
            if extra_edit:
                extra_edit(s)
        rebuilt("vocab", name, what, edit)

    vocab("no-tokens", "tokenizer.ggml.tokens missing", tokens_="drop")
    vocab("no-scores", "tokenizer.ggml.scores missing", scores_="drop")
    vocab("no-token-types", "tokenizer.ggml.token_type missing", types_="drop")
    vocab("scores-short", "one score fewer than tokens", scores_=scores[:-1])
    vocab("types-short", "one token type fewer than tokens", types_=types[:-1])
    vocab("tokens-long", "one token more than scores, types and embedding rows", tokens_=tokens + ["zz"])
    vocab("tokens-short", "one token fewer than the embedding rows", tokens_=tokens[:-1], scores_=scores[:-1],
          types_=types[:-1])
    vocab("tokens-empty", "an empty tokens array", tokens_=[], scores_=[], types_=[])
    vocab("duplicate-token", "token 298 has the same text as token 297",
          tokens_=tokens[:-1] + [tokens[-2]])
    vocab("duplicate-byte-token", "token 300-ish byte token <0x41> twice (token 68 renamed <0x40>)",
          tokens_=tokens[:68] + ["<0x40>"] + tokens[69:])
    vocab("empty-token", "token 290 has empty text", tokens_=tokens[:290] + [""] + tokens[291:])
    vocab("missing-newline-byte", "the byte token <0x0A> renamed (SPM needs all 256)",
          tokens_=[("zz" if t == "<0x0A>" else t) for t in tokens])
    vocab("all-types-control", "every token is CONTROL", types_=[3] * len(types))
    vocab("types-99", "every token type is 99", types_=[99] * len(types))
    vocab("scores-nan", "every score is NaN", scores_=[float("nan")] * len(scores))

    def raw_tokens(s):
        s.set_raw("tokenizer.ggml.tokens", ARRAY, u32(STRING) + u64(2) + enc_str(b"\xff\xfe") + enc_str(b"a\x00b"))
    vocab("invalid-utf8", "two tokens, one invalid UTF-8, one with a NUL", extra_edit=raw_tokens)
    vocab("tokens-as-i32", "tokenizer.ggml.tokens as an i32 array",
          extra_edit=lambda s: s.set("tokenizer.ggml.tokens", ARRAY, list(range(len(tokens))), I32))
    vocab("tokens-as-string", "tokenizer.ggml.tokens as one string",
          extra_edit=lambda s: s.set("tokenizer.ggml.tokens", STRING, "abc"))
    vocab("scores-as-strings", "tokenizer.ggml.scores as strings",
          extra_edit=lambda s: s.set("tokenizer.ggml.scores", ARRAY, ["0"] * len(scores), STRING))
    vocab("types-as-f32", "tokenizer.ggml.token_type as f32",
          extra_edit=lambda s: s.set("tokenizer.ggml.token_type", ARRAY, [1.0] * len(types), F32))
    for key in ("bos", "eos", "unknown", "padding"):
        for v in (len(tokens), 2 ** 31, 2 ** 32 - 1):
            vocab(f"{key}-id-{v}", f"tokenizer.ggml.{key}_token_id = {v} (vocabulary of {len(tokens)})",
                  extra_edit=lambda s, k=key, v=v: s.set(f"tokenizer.ggml.{k}_token_id", U32, v))
    vocab("bos-id-negative", "tokenizer.ggml.bos_token_id = -5 (as an i32)",
          extra_edit=lambda s: s.set("tokenizer.ggml.bos_token_id", I32, -5))

    return out


def draft_vocab_variants(tmpdir: pathlib.Path) -> List[Variant]:
    """Valid models whose vocabulary differs from the base target's (they are fine as targets)."""
    from models.tiny import write_tiny_model

    out = []
    cfg = dict(BASE_CONFIG, seed=4)

    def model(name, what, expect_ok=False, edit=None, **kw):
        p = write_tiny_model(tmpdir / f"{name}.gguf", **dict(cfg, **kw))
        raw = p.read_bytes() if isinstance(p, pathlib.Path) else pathlib.Path(p).read_bytes()
        if edit:
            s = Spec.of(parse(raw))
            edit(s)
            raw = s.build()
        out.append(Variant("draft-vocab", name, what, raw, expect_ok))

    def set_tokens(fn):
        return lambda s: s.set("tokenizer.ggml.tokens", ARRAY, fn(s.get("tokenizer.ggml.tokens")), STRING)

    model("same-vocab", "another random model with the same vocabulary (a valid draft)", expect_ok=True)
    model("padded-128", "128 padding tokens more than the target (allowed)", expect_ok=True, n_pad=128)
    model("padded-129", "129 padding tokens more than the target (beyond the 128 allowed)", n_pad=129)
    model("padded-500", "500 padding tokens more", n_pad=500)
    model("other-vocab", "a different vocabulary (other token texts and size)", vocab="byte-alt")
    model("no-add-bos", "add_bos false (the target adds BOS)", add_bos=False)
    model("other-eos", "EOS id 5 instead of 2", eos_token_id=5)
    model("other-bos", "BOS id 2 instead of 1", edit=lambda s: s.set("tokenizer.ggml.bos_token_id", U32, 2))
    model("swapped-texts", "tokens 290 and 291 swap their texts",
          edit=set_tokens(lambda t: t[:290] + [t[291], t[290]] + t[292:]))
    model("renamed-token", "token 298's text changed", edit=set_tokens(lambda t: t[:298] + ["zzz"]))
    model("other-tokenizer-pre", "tokenizer.ggml.pre 'llama3' instead of 'default'",
          edit=lambda s: s.set("tokenizer.ggml.pre", STRING, "llama3"))
    return out


# --- running ---------------------------------------------------------------------------------------------------------

# What one load does, in a process of its own; it prints exactly one OUTCOME line. The LLM is closed explicitly, so
# that freeing the models is part of the load (a crash there is a signal too).
_LOAD = r"""
import sys
from specllm.errors import SpecLLMError
from specllm.llm import LLM


def out(kind, name, msg):
    sys.stdout.write("OUTCOME\t%s\t%s\t%s\n" % (kind, name, " ".join(str(msg).split())[:400]))
    sys.stdout.flush()


def load(role, path, target, check=True):
    if not check:  # what llama.cpp does without specllm's pre-check (the harness's self-test, --no-check)
        import specllm.gguf_check
        specllm.gguf_check.check_gguf = lambda path: None
    try:
        if role == "target":
            llm = LLM(path, None, n_ctx=64, n_threads=1, profile_costs=False)
            c = llm.generate("Hello", max_tokens=4)
        else:
            llm = LLM(target, path, n_ctx=64, n_threads=1, profile_costs=False)
            c = llm.generate("Hello", max_tokens=4, draft_length=2)
        llm.close()
        out("ok", "", repr(c.text))
    except SpecLLMError as e:
        out("typed error", type(e).__name__, e)
    except BaseException as e:
        out("untyped error", type(e).__name__, e)
"""

# spawn mode: a fresh interpreter per load (python -c RUNNER role path target)
RUNNER = _LOAD + "\nload(*sys.argv[1:4], check=sys.argv[4] == '1')\n"

# fork mode (the default): one server process per worker imports specllm once, then forks a fresh child per load
# and reports how it ended. Each load still runs in a process of its own (a crash or hang takes only that child),
# without paying ~0.3 s of interpreter start and imports per load. The server has no other thread when it forks
# (OPENBLAS_NUM_THREADS=1 keeps numpy's thread pool away), and never loads a model itself.
FORK_SERVER = _LOAD + r"""
import json, os, resource, signal, time


def child(job):
    try:
        if "asan" not in os.environ.get("LD_PRELOAD", ""):  # ASan reserves terabytes of address space
            resource.setrlimit(resource.RLIMIT_AS, (job["mem"], job["mem"]))
    except Exception:
        pass
    for fd, path in ((1, job["out"]), (2, job["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    load(job["role"], job["path"], job["target"], job["check"])
    sys.stdout.flush()
    sys.stderr.flush()


for line in sys.stdin:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        try:
            child(job)
        finally:
            os._exit(0)
    deadline = time.monotonic() + job["timeout"]
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = None
            break
        time.sleep(0.002)
    if status is None:
        reply = {"hang": True}
    elif os.WIFSIGNALED(status):
        reply = {"returncode": -os.WTERMSIG(status)}
    else:
        reply = {"returncode": os.WEXITSTATUS(status)}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""

OUTCOMES = ["ok", "typed error", "untyped error", "signal", "hang"]
PASS = {"ok", "typed error"}
ROLES = ["target", "draft"]
MEMORY_LIMIT = 8 << 30  # address space of one load: a runaway allocation fails in the child, not on the machine


@dataclasses.dataclass
class Result:
    file: str
    category: str
    role: str
    outcome: str
    detail: str
    stderr_tail: str
    seconds: float
    expect_ok: bool = False


def _env():
    # GGML_NO_BACKTRACE: an abort prints its message, not a gdb session (seconds, and a stderr tail of gdb noise)
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", GGML_NO_BACKTRACE="1")


def _limit_memory():
    if "asan" in os.environ.get("LD_PRELOAD", ""):  # ASan reserves terabytes of address space for its shadow
        return
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    except Exception:
        pass


def _classify(returncode: Optional[int], out: str, err: str, timeout: float) -> Tuple[str, str, str]:
    """(outcome, detail, stderr tail) of a load that ended with returncode (None: killed at the timeout)."""
    if returncode is None:
        return "hang", f"no outcome within {timeout:g} s", _tail(err)
    line = next((ln for ln in out.splitlines() if ln.startswith("OUTCOME\t")), None)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return "signal", name + (" (after the outcome line: at exit)" if line else ""), _tail(err)
    if line is None:
        return "untyped error", f"exit code {returncode} without an outcome line", _tail(err)
    _, kind, name, msg = (line.split("\t", 3) + ["", ""])[:4]
    if returncode != 0 and kind in PASS:
        return "untyped error", f"exit code {returncode} after {kind}: {name} {msg}", _tail(err)
    return kind, (f"{name}: {msg}" if name else msg), _tail(err)


def run_one(path: str, role: str, target: str, timeout: float, check: bool = True) -> Tuple[str, str, str, float]:
    """(outcome, detail, stderr tail, seconds) of loading path in role, in a fresh interpreter (spawn mode)."""
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", RUNNER, role, path, target, "1" if check else "0"],
                           capture_output=True, timeout=timeout,
                           env=_env(), preexec_fn=_limit_memory, cwd=os.path.dirname(path))
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"").decode(errors="replace")
        return (*_classify(None, "", err, timeout), time.monotonic() - t0)
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    return (*_classify(p.returncode, out, err, timeout), time.monotonic() - t0)


class ForkServer:
    """A process that imported specllm and forks one child per load (see FORK_SERVER)."""

    def __init__(self, workdir: str):
        self.workdir = workdir
        self.proc: Optional[subprocess.Popen] = None

    def _start(self):
        self.log = open(os.path.join(self.workdir, "server.log"), "ab")
        self.proc = subprocess.Popen([sys.executable, "-c", FORK_SERVER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=_env(), cwd=self.workdir)

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.log.close()
            self.proc = None

    def run(self, path: str, role: str, target: str, timeout: float, check: bool = True
            ) -> Tuple[str, str, str, float]:
        import select

        t0 = time.monotonic()
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        out_p, err_p = os.path.join(self.workdir, "out"), os.path.join(self.workdir, "err")
        job = dict(role=role, path=path, target=target, timeout=timeout, out=out_p, err=err_p, mem=MEMORY_LIMIT,
                   check=check)
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout + 30)
        line = self.proc.stdout.readline() if ready else b""
        if not line:  # the server itself died or stopped answering: count a hang, start a new one for the next
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return "hang", "the fork server did not answer", "", time.monotonic() - t0
        reply = json.loads(line)
        rc = None if reply.get("hang") else reply["returncode"]
        read = (lambda p: open(p, "rb").read().decode(errors="replace") if os.path.exists(p) else "")
        return (*_classify(rc, read(out_p), read(err_p), timeout), time.monotonic() - t0)


def _tail(text: str, n: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-n:])


def write_set(out_dir, seed: int = 14) -> Tuple[List[dict], str]:
    """Write the base models and every variant under out_dir; return (manifest, valid target path)."""
    from models.tiny import write_tiny_model

    out_dir = pathlib.Path(out_dir)
    base_dir = out_dir / "base"
    base_dir.mkdir(parents=True, exist_ok=True)
    base = pathlib.Path(write_tiny_model(base_dir / "base.gguf", **dict(BASE_CONFIG, seed=0, name="fuzz-base")))
    target = write_tiny_model(base_dir / "target.gguf", **dict(BASE_CONFIG, seed=1, name="fuzz-target"))
    variants = generate_variants(base.read_bytes(), seed) + draft_vocab_variants(base_dir)
    manifest, seen = [], {}
    for v in variants:
        digest = hashlib.sha256(v.data).hexdigest()
        if digest in seen:  # two mutations that happen to give the same bytes count once
            continue
        d = out_dir / v.category
        d.mkdir(exist_ok=True)
        path = d / f"{len(manifest):03d}-{_slug(v.name)}.gguf"
        path.write_bytes(v.data)
        seen[digest] = str(path)
        manifest.append(dict(file=str(path), category=v.category, what=v.what, expect_ok=v.expect_ok,
                             size=len(v.data)))
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest, str(target)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in s)[:80]


def run_set(manifest: List[dict], target: str, *, workers: int = 2, timeout: float = 60.0,
            roles=ROLES, progress=None, mode: str = "fork", check: bool = True) -> List[Result]:
    """Load every file in every role, workers at a time; mode "fork" (a fork server per worker, one forked child
    per load) or "spawn" (a fresh interpreter per load). check=False: without specllm's GGUF pre-check."""
    import tempfile
    import threading

    jobs = [(m, role) for m in manifest for role in roles]
    results: List[Optional[Result]] = [None] * len(jobs)
    local, servers = threading.local(), []
    tmp = tempfile.mkdtemp(prefix="gguf-fuzz-")

    def one(m, role):
        if mode == "spawn":
            return run_one(m["file"], role, target, timeout, check)
        if not hasattr(local, "server"):
            local.server = ForkServer(tempfile.mkdtemp(dir=tmp))
            servers.append(local.server)
        return local.server.run(m["file"], role, target, timeout, check)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {pool.submit(one, m, role): i for i, (m, role) in enumerate(jobs)}
            for n, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                i = futures[fut]
                m, role = jobs[i]
                outcome, detail, tail, dt = fut.result()
                results[i] = Result(m["file"], m["category"], role, outcome, detail, tail, dt, m["expect_ok"])
                if progress:
                    progress(n, len(jobs), results[i])
    finally:
        for server in servers:
            server.close()
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return results  # type: ignore[return-value]


def failures(results: List[Result]) -> List[Result]:
    """Loads that failed: an outcome outside ok / typed error, or a control that did not load."""
    return [r for r in results if r.outcome not in PASS or (r.expect_ok and r.outcome != "ok")]


def report(manifest: List[dict], results: List[Result], seconds: Optional[float] = None) -> str:
    """The outcome table (markdown): category x role -> counts per outcome, typed errors by class, failures."""
    cats = list(dict.fromkeys(m["category"] for m in manifest))
    n_files = collections.Counter(m["category"] for m in manifest)
    counts = collections.Counter((r.category, r.role, r.outcome) for r in results)
    roles = [role for role in ROLES if any(r.role == role for r in results)]
    lines = [f"## Malformed-GGUF fuzz: {len(manifest)} files x {len(roles)} roles = {len(results)} loads"
             + (f" in {seconds:.0f} s" if seconds is not None else ""), ""]
    short = {"ok": "ok", "typed error": "typed", "untyped error": "untyped", "signal": "signal", "hang": "hang"}
    head = ["category", "files"] + [f"{role} {short[o]}" for role in roles for o in OUTCOMES]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cats + ["**total**"]:
        row = [c, str(n_files[c] if c in n_files else len(manifest))]
        for role in roles:
            for o in OUTCOMES:
                n = (counts[(c, role, o)] if c in n_files
                     else sum(v for (_, rl, oc), v in counts.items() if rl == role and oc == o))
                row.append(str(n) if n else ".")
        lines.append("| " + " | ".join(row) + " |")
    by_class = collections.Counter(f"{r.role} {r.detail.split(':', 1)[0]}" for r in results
                                   if r.outcome == "typed error")
    lines += ["", "Typed errors by role and class: " + ", ".join(f"{k} {v}" for k, v in sorted(by_class.items())), ""]
    fails = failures(results)
    lines.append(f"### Failures: {len(fails)}")
    for r in fails:
        what = next(m["what"] for m in manifest if m["file"] == r.file)
        lines += [f"- `{os.path.relpath(r.file, os.path.dirname(os.path.dirname(r.file)))}` as {r.role}: "
                  f"**{r.outcome}** ({r.detail}) — {what}"]
        if r.stderr_tail:
            lines += ["  ```", *("  " + ln for ln in r.stderr_tail.splitlines()), "  ```"]
    slow = sorted(results, key=lambda r: -r.seconds)[:3]
    lines += ["", "Slowest loads: " + ", ".join(
        f"{os.path.basename(r.file)} as {r.role} {r.seconds:.1f} s" for r in slow)]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="directory for the files and the report")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--only", nargs="*", help="only these categories")
    ap.add_argument("--roles", nargs="*", default=ROLES, choices=ROLES)
    ap.add_argument("--report", help="write the markdown table here (default OUT/report.md)")
    ap.add_argument("--mode", choices=["fork", "spawn"], default="fork",
                    help="fork: a fork server per worker forks a fresh child per load (default); spawn: a fresh "
                         "interpreter per load")
    ap.add_argument("--no-check", action="store_true",
                    help="load without specllm's GGUF pre-check (specllm.gguf_check): what llama.cpp does alone")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    manifest, target = write_set(args.out, args.seed)
    if args.only:
        manifest = [m for m in manifest if m["category"] in args.only]
    print(f"{len(manifest)} files written in {time.monotonic() - t0:.1f} s; running {len(args.roles)} roles with "
          f"{args.workers} workers", flush=True)

    def progress(n, total, r):
        if r.outcome not in PASS or n % 50 == 0 or n == total:
            print(f"[{n}/{total}] {os.path.basename(r.file)} as {r.role}: {r.outcome} {r.detail[:160]}", flush=True)
    results = run_set(manifest, target, workers=args.workers, timeout=args.timeout, roles=args.roles,
                      progress=progress, mode=args.mode, check=not args.no_check)
    text = report(manifest, results, time.monotonic() - t0)
    pathlib.Path(args.report or os.path.join(args.out, "report.md")).write_text(text + "\n")
    (pathlib.Path(args.out) / "results.json").write_text(json.dumps([dataclasses.asdict(r) for r in results],
                                                                    indent=1))
    print(text)
    return 1 if failures(results) else 0


if __name__ == "__main__":
    sys.exit(main())
