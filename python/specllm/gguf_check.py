"""A fast structural check of a GGUF file before llama.cpp loads it.

llama.cpp (the version specllm is built against) rejects most damaged files with an error, but aborts the whole
process (GGML_ASSERT / GGML_ABORT, or a segfault in a compute kernel) on some that parse: a block count of 0 or
above 512, inconsistent expert counts, an unknown rope scaling type, a negative or NaN norm epsilon, duplicate
token texts, norm weights that are not F32, integer or F64 matrix weights. A Python process cannot catch an abort,
so check_gguf refuses those files first, with a ModelLoadError that says what is wrong.

It also checks the container itself (header, counts against the file size, every KV and tensor info, tensor data
within the file) so that a truncated or corrupted download gets a message naming what is wrong, whichever check
llama.cpp would have failed.

Cost: the metadata is parsed through a memory map (the tensor data is never read): a few milliseconds for a
small model, a few tenths of a second for a 150k-token vocabulary with its merges.
"""
from __future__ import annotations

import math
import mmap
import os
import re
import stat
import struct
from typing import Dict, List, Optional, Tuple

from .errors import ModelLoadError

__all__ = ["check_gguf", "GGUFInfo"]

GGUF_VERSION = 3  # the newest version llama.cpp reads
MAX_STRING = 1 << 30  # gguf.cpp's GGUF_MAX_STRING_LENGTH
MAX_ARRAY = 1 << 30  # gguf.cpp's GGUF_MAX_ARRAY_ELEMENTS
MAX_NAME = 64  # GGML_MAX_NAME (a tensor name must be shorter)
MAX_DIMS = 4
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
DEFAULT_ALIGNMENT = 32
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")

# GGUF value types: struct format of a scalar (STRING = 8 and ARRAY = 9 are handled apart)
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STRING, _ARRAY, _U64, _I64, _F64 = range(13)
_SCALAR = {_U8: "<B", _I8: "<b", _U16: "<H", _I16: "<h", _U32: "<I", _I32: "<i", _F32: "<f", _BOOL: "<b",
           _U64: "<Q", _I64: "<q", _F64: "<d"}
_INTS = {_U8, _I8, _U16, _I16, _U32, _I32, _U64, _I64}
_FLOATS = {_F32, _F64}
_TYPE_NAMES = {_U8: "u8", _I8: "i8", _U16: "u16", _I16: "i16", _U32: "u32", _I32: "i32", _F32: "f32", _BOOL: "bool",
               _STRING: "string", _ARRAY: "array", _U64: "u64", _I64: "i64", _F64: "f64"}

# ggml tensor types of the llama.cpp specllm is built against: id -> (name, block size, bytes per block).
# Ids 4, 5, 31-33 and 36-38 were removed from GGUF files.
GGML_TYPES: Dict[int, Tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36), 41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
# weights llama.cpp's CPU kernels cannot multiply or add with (they segfault or abort at the first decode)
_NOT_A_WEIGHT_TYPE = {24, 25, 26, 27, 28}  # I8, I16, I32, I64, F64

_DAMAGED = "the file is damaged or truncated: download or convert it again"
_ABORTS = ("llama.cpp does not refuse such a file cleanly (it aborts the process, or fails later), so specllm "
           "refuses it: convert the model again with a current llama.cpp, or download another copy")


class _Bad(Exception):
    """A problem found; becomes a ModelLoadError naming the file."""


class GGUFInfo:
    """What check_gguf read: the metadata (arrays of strings kept only for the tokenizer's tokens) and tensors."""

    def __init__(self):
        self.version = 0
        self.metadata: Dict[str, object] = {}
        self.types: Dict[str, int] = {}  # key -> GGUF value type (of the elements, for arrays)
        self.arrays: Dict[str, int] = {}  # key -> element count, for arrays
        self.tensors: List[Tuple[str, List[int], int, int]] = []  # (name, dims, ggml type, offset)
        self.alignment = DEFAULT_ALIGNMENT
        self.data_offset = 0


class _Reader:
    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise _Bad(f"{what} needs {n} bytes at offset {self.pos} but the file ends at {self.size}; {_DAMAGED}")

    def scalar(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def u32(self, what: str) -> int:
        return self.scalar("<I", what)

    def u64(self, what: str) -> int:
        return self.scalar("<Q", what)

    def string_len(self, what: str) -> int:
        n = self.u64(f"the length of {what}")
        if n > MAX_STRING:
            raise _Bad(f"{what} claims a length of {n} bytes (more than llama.cpp's limit of {MAX_STRING}); "
                       f"{_DAMAGED}")
        self.need(n, f"{what} ({n} bytes)")
        return n

    def string(self, what: str) -> bytes:
        n = self.string_len(what)
        s = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return s


_U64_AT = struct.Struct("<Q").unpack_from


def _strings(buf, pos: int, count: int, size: int, key: str, keep: bool):
    """(position after, the strings as bytes if keep) of an array of count strings at pos: the one hot loop."""
    out: List[bytes] = []
    append = out.append
    j = 0
    try:
        for j in range(count):
            n = _U64_AT(buf, pos)[0]
            pos += 8
            if n > size - pos:
                raise _Bad(f"element {j} of '{key}' claims a length of {n} bytes, more than the rest of the file; "
                           + _DAMAGED)
            if keep:
                append(buf[pos:pos + n])
            pos += n
    except struct.error:
        raise _Bad(f"element {j} of '{key}' runs past the end of the file; {_DAMAGED}") from None
    return pos, (out if keep else None)


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def _parse(buf, size: int) -> GGUFInfo:
    info = GGUFInfo()
    r = _Reader(buf, size)
    r.need(24, "the GGUF header (magic, version, tensor and KV counts)")
    if bytes(buf[:4]) != b"GGUF":
        raise _Bad("it does not start with the GGUF magic; convert the model with llama.cpp's convert_hf_to_gguf.py "
                   "or download a .gguf")
    r.pos = 4
    version = r.u32("the version")
    if version & 0xFFFF == 0 and version:
        raise _Bad(f"its GGUF version field reads {version:#x}: a big-endian file, which llama.cpp does not read on "
                   "this machine; convert it again for little-endian")
    if version in (0, 1) or version > GGUF_VERSION:
        raise _Bad(f"its GGUF version is {version}, llama.cpp reads versions 2 and 3; "
                   + ("convert it again with a current llama.cpp" if version == 1 else _DAMAGED))
    info.version = version
    n_tensors = r.u64("the tensor count")
    n_kv = r.u64("the KV count")
    rest = size - r.pos
    # every KV takes at least 8 (key length) + 1 (key) + 4 (type) + 1 (value) bytes; every tensor info at least
    # 8 (name length) + 1 (name) + 4 (n_dims) + 4 (type) + 8 (offset)
    if n_kv > rest // 14:
        raise _Bad(f"its header claims {n_kv} metadata KVs, more than its {size} bytes can hold; {_DAMAGED}")
    if n_tensors > rest // 25:
        raise _Bad(f"its header claims {n_tensors} tensors, more than its {size} bytes can hold; {_DAMAGED}")

    for i in range(n_kv):
        start = r.pos
        key_b = r.string(f"the key of KV {i}")
        if not key_b:
            raise _Bad(f"KV {i} (at offset {start}) has an empty key; {_DAMAGED}")
        key = _text(key_b)
        if key in info.metadata:
            raise _Bad(f"the key '{key}' appears twice (KV {i}); {_DAMAGED}")
        vtype = r.u32(f"the type of '{key}'")
        if vtype == _ARRAY:
            atype = r.u32(f"the element type of '{key}'")
            count = r.u64(f"the element count of '{key}'")
            if atype not in _SCALAR and atype != _STRING:
                raise _Bad(f"the array '{key}' has element type {atype}, which is not a GGUF type"
                           + (" (arrays of arrays are not allowed)" if atype == _ARRAY else "") + f"; {_DAMAGED}")
            elem = 8 if atype == _STRING else struct.calcsize(_SCALAR[atype])
            if count > MAX_ARRAY or count * elem > size - r.pos:
                raise _Bad(f"the array '{key}' claims {count} elements, more than the rest of the file can hold; "
                           f"{_DAMAGED}")
            info.types[key], info.arrays[key] = atype, count
            if atype == _STRING:
                r.pos, info.metadata[key] = _strings(buf, r.pos, count, size, key, key == "tokenizer.ggml.tokens")
            else:
                fmt = _SCALAR[atype]
                info.metadata[key] = (list(struct.unpack_from(f"<{count}{fmt[1]}", buf, r.pos))
                                      if count <= 4096 else None)  # only small arrays are kept (per-layer values)
                r.pos += count * elem
        elif vtype == _STRING:
            info.types[key] = vtype
            info.metadata[key] = _text(r.string(f"the value of '{key}'"))
        elif vtype in _SCALAR:
            info.types[key] = vtype
            info.metadata[key] = r.scalar(_SCALAR[vtype], f"the value of '{key}'")
        else:
            raise _Bad(f"the key '{key}' has type {vtype}, which is not a GGUF type; {_DAMAGED}")

    if "general.alignment" in info.metadata:
        a = info.metadata["general.alignment"]
        if info.types["general.alignment"] != _U32 or "general.alignment" in info.arrays:
            raise _Bad("general.alignment must be a u32; " + _DAMAGED)
        if a == 0 or a & (a - 1):
            raise _Bad(f"general.alignment is {a}, not a power of 2; {_DAMAGED}")
        info.alignment = a

    names = set()
    for i in range(n_tensors):
        name_b = r.string(f"the name of tensor {i}")
        name = _text(name_b)
        if len(name_b) >= MAX_NAME:
            raise _Bad(f"tensor {i}'s name is {len(name_b)} bytes long, llama.cpp allows at most {MAX_NAME - 1}; "
                       f"{_DAMAGED}")
        if name in names:
            raise _Bad(f"the tensor '{name}' appears twice; {_DAMAGED}")
        names.add(name)
        n_dims = r.u32(f"the dimension count of tensor '{name}'")
        if n_dims > MAX_DIMS:
            raise _Bad(f"the tensor '{name}' claims {n_dims} dimensions, ggml has at most {MAX_DIMS}; {_DAMAGED}")
        dims = [r.scalar("<q", f"dimension {j} of tensor '{name}'") for j in range(n_dims)]
        if any(d < 0 for d in dims):
            raise _Bad(f"the tensor '{name}' has a negative dimension {dims}; {_DAMAGED}")
        gtype = r.scalar("<i", f"the type of tensor '{name}'")
        if gtype not in GGML_TYPES:
            raise _Bad(f"the tensor '{name}' has ggml type {gtype}, which this llama.cpp does not know "
                       "(removed, or from a newer llama.cpp); " + _DAMAGED)
        tname, block, tsize = GGML_TYPES[gtype]
        ne0 = dims[0] if dims else 1
        if ne0 % block:
            raise _Bad(f"the tensor '{name}' of type {tname} has rows of {ne0} elements, not a multiple of its block "
                       f"size {block}; {_DAMAGED}")
        offset = r.u64(f"the data offset of tensor '{name}'")
        info.tensors.append((name, dims, gtype, offset))

    a = info.alignment
    data = (r.pos + a - 1) // a * a if n_tensors else r.pos
    info.data_offset = data
    expected = 0
    for name, dims, gtype, offset in info.tensors:
        tname, block, tsize = GGML_TYPES[gtype]
        n = math.prod(dims) if dims else 1
        nbytes = n // block * tsize
        if offset != expected:
            raise _Bad(f"the tensor '{name}' claims its data at offset {offset} of the data section, where "
                       f"llama.cpp expects {expected} (tensors are stored in order, each padded to {a} bytes); "
                       + _DAMAGED)
        if data + offset + nbytes > size:
            raise _Bad(f"the data of tensor '{name}' ({nbytes} bytes at file offset {data + offset}) runs past the "
                       f"end of the file ({size} bytes); {_DAMAGED}")
        expected += (nbytes + a - 1) // a * a
    return info


def _number(info: GGUFInfo, key: str, kinds) -> Optional[List[float]]:
    """The values of key (a scalar as one value, a small array as its values) if it has one of the type kinds."""
    if key not in info.metadata or info.types[key] not in kinds or info.metadata[key] is None:
        return None
    v = info.metadata[key]
    return list(v) if isinstance(v, list) else [v]


def _check_model(info: GGUFInfo) -> None:
    """The values llama.cpp asserts on (aborting the process) instead of rejecting."""
    arch = info.metadata.get("general.architecture")
    if isinstance(arch, str) and info.types.get("general.architecture") == _STRING:
        def num(suffix, kinds=_INTS):
            return _number(info, f"{arch}.{suffix}", kinds)

        n_layer = num("block_count")
        if n_layer is not None and "{}.block_count".format(arch) not in info.arrays:
            if not 1 <= n_layer[0] <= MAX_LAYERS:
                raise _Bad(f"{arch}.block_count is {n_layer[0]}; llama.cpp needs 1 to {MAX_LAYERS} layers")
            nextn = num("nextn_predict_layers")
            if nextn and nextn[0] > n_layer[0]:
                raise _Bad(f"{arch}.nextn_predict_layers is {nextn[0]}, more than the {n_layer[0]} layers")
        n_expert = (num("expert_count") or [0])[0]
        used = max(num("expert_used_count") or [0])
        groups = (num("expert_group_count") or [0])[0]
        group_used = (num("expert_group_used_count") or [0])[0]
        if arch.startswith("hunyuan") and n_expert <= 1:
            n_expert = used = 0
        if n_expert > MAX_EXPERTS:
            raise _Bad(f"{arch}.expert_count is {n_expert}; llama.cpp allows at most {MAX_EXPERTS}")
        if n_expert == 0 and (used or groups):
            raise _Bad(f"{arch} has no experts (expert_count missing or 0) but expert_used_count {used} / "
                       f"expert_group_count {groups}")
        if n_expert > 0:
            if not 0 < used <= n_expert:
                raise _Bad(f"{arch}.expert_used_count is {used}; with {n_expert} experts it must be 1 to {n_expert}")
            if groups >= n_expert or (groups > 1 and (n_expert % groups or not 0 < group_used < groups)):
                raise _Bad(f"{arch}: {groups} expert groups ({group_used} used) do not divide {n_expert} experts")
        scaling = info.metadata.get(f"{arch}.rope.scaling.type")
        if isinstance(scaling, str) and scaling not in ROPE_SCALING_TYPES:
            raise _Bad(f"{arch}.rope.scaling.type is '{scaling}'; llama.cpp knows {', '.join(ROPE_SCALING_TYPES)}")
        for eps in ("layer_norm_epsilon", "layer_norm_rms_epsilon", "group_norm_epsilon"):
            v = num(f"attention.{eps}", _FLOATS)
            if v is not None and not all(math.isfinite(x) and x >= 0 for x in v):
                raise _Bad(f"{arch}.attention.{eps} is {v[0] if len(v) == 1 else v}; a norm epsilon must be a finite "
                           "number >= 0")

    for name, dims, gtype, _ in info.tensors:
        tname = GGML_TYPES[gtype][0]
        if not name.endswith((".weight", ".bias")):
            continue
        if gtype in _NOT_A_WEIGHT_TYPE:
            raise _Bad(f"the weight tensor '{name}' has type {tname}; llama.cpp computes with float or quantized "
                       "weights only, and crashes on this one")
        if len(dims) <= 1 and gtype != 0:
            raise _Bad(f"the 1-D tensor '{name}' (a norm or bias) has type {tname}; llama.cpp needs it in F32 "
                       "(converters keep 1-D tensors in F32), and aborts otherwise")

    tokens = info.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):
        if b"" in tokens:
            tokens = [t or b"[EMPTY_%d]" % i for i, t in enumerate(tokens)]  # as llama.cpp names an empty token
        seen = set(tokens)
        if len(seen) != len(tokens):
            first: Dict[bytes, int] = {}
            for i, t in enumerate(tokens):
                j = first.setdefault(t, i)
                if j != i:
                    raise _Bad(f"tokens {j} and {i} of tokenizer.ggml.tokens have the same text '{_text(t)}'; "
                               "llama.cpp needs every token text once")
        if tokens and info.metadata.get("tokenizer.ggml.model") == "llama":  # SentencePiece with byte fallback
            missing = [b for b in range(256) if b"<0x%02X>" % b not in seen and bytes([b]) not in seen]
            if missing:
                raise _Bad(f"its SentencePiece vocabulary lacks the byte token <0x{missing[0]:02X}>"
                           + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                           + "; llama.cpp fails on any text that needs it")


def check_gguf(path) -> Optional[GGUFInfo]:
    """Raise ModelLoadError if path is a GGUF file llama.cpp would reject or crash on (for a split model, the first
    file's metadata and every file's tensors); return what was read from path.

    A path that does not exist, is a directory, is empty or does not start with the GGUF magic returns None:
    the loader reports those itself. One that is not a regular file (a FIFO waited for ever, a device was "empty")
    or cannot be read (its permissions: "not a GGUF file") raises here."""
    path = os.fspath(path)
    info = _check_file(path)
    for other in _other_splits(path, info):
        _check_file(other)  # llama.cpp loads their tensors too: a bad one crashed the first decode
    return info


_SPLIT_NAME = re.compile(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's llama_split_path, "%s-%05d-of-%05d.gguf"


def _other_splits(path: str, info: Optional[GGUFInfo]) -> List[str]:
    """The other files of a split model whose first file is path (those that exist: llama.cpp says a missing one)."""
    count = info.metadata.get("split.count") if info is not None else None
    m = _SPLIT_NAME.match(path)
    if not isinstance(count, int) or count < 2 or m is None or int(m.group(2)) != 1:
        return []
    names = [f"{m.group(1)}-{i:05d}-of-{count:05d}.gguf" for i in range(2, count + 1)]
    return [n for n in names if os.path.exists(n)]


def _check_file(path: str) -> Optional[GGUFInfo]:
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # the loader says "not found"
        return None
    except OSError as e:  # a folder on the way that cannot be searched: it was "not found"
        raise ModelLoadError(f"cannot read the model file '{path}': {e.strerror or e}; check its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        return None
    if not stat.S_ISREG(st.st_mode):
        raise ModelLoadError(f"the model path '{path}' is not a regular file (a pipe, a device, ...); pass a .gguf "
                             "file")
    try:
        f = open(path, "rb")
    except OSError as e:
        raise ModelLoadError(f"cannot read the model file '{path}': {e.strerror or e}; check its permissions") from None
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size < 4 or f.read(4) != b"GGUF":
                return None
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
        try:
            info = _parse(buf, size)
            try:
                _check_model(info)
            except _Bad as e:
                raise _Bad(f"{e}; {_ABORTS}") from None
            return info
        except _Bad as e:
            raise ModelLoadError(f"could not load '{path}': {e}") from None
        except (struct.error, IndexError, ValueError, OverflowError, MemoryError) as e:  # pragma: no cover
            raise ModelLoadError(f"could not load '{path}': {type(e).__name__} {e} while reading its metadata; "
                                 + _DAMAGED) from None
        finally:
            buf.close()
