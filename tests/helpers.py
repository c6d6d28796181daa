"""Helpers of the engine tests: model variants, invariants every completion must satisfy, and statistics."""

import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np


def write_variant(src, dst, edit_output=None, keys=None):
    """Copy the GGUF model src to dst with output.weight replaced by edit_output(weight) and the keys set to the
    values of keys (a bool or a uint32: {"llama.pooling_type": 1, "llama.attention.causal": False}); return dst."""
    import gguf

    reader = gguf.GGUFReader(os.fspath(src))
    tmp = f"{os.fspath(dst)}.tmp{os.getpid()}"
    w = gguf.GGUFWriter(tmp, arch=reader.get_field("general.architecture").contents())
    for f in reader.fields.values():
        if f.name.startswith("GGUF.") or f.name == "general.architecture" or f.name in (keys or {}):
            continue  # the writer writes these itself; keys are set below
        sub = f.types[1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(f.name, f.contents(), f.types[0], sub)
    for key, value in (keys or {}).items():
        w.add_bool(key, value) if isinstance(value, bool) else w.add_uint32(key, value)
    for t in reader.tensors:
        data = np.array(t.data)
        if t.name == "output.weight" and edit_output is not None:
            data = np.asarray(edit_output(data), dtype=np.float32)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    return os.fspath(dst)


def write_perturbed_copy(src, dst, noise, seed=0):
    """The model src with Gaussian noise (noise x the weights' std) on its output layer: same vocab, similar logits."""
    rng = np.random.default_rng(seed)
    return write_variant(src, dst, lambda w: w + noise * w.std() * rng.standard_normal(w.shape))


def first_divergence(a, b):
    """Index of the first position where the sequences differ (len of the shorter if one is a prefix), None if equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_stats(c, k_max=None, exact_steps=True):
    """Invariants of a Completion's stats. exact_steps: every step emitted its accepted drafts plus one token (no
    EOG or stop string cut the last step short)."""
    s = c.stats
    assert s.n_generated == len(c.tokens), s
    assert 0 <= s.n_accepted <= s.n_drafted, s
    assert sum(s.k_histogram.values()) == s.n_steps, s
    assert sum(k * n for k, n in s.k_histogram.items()) == s.n_drafted, s
    assert s.n_generated <= s.n_steps + s.n_accepted, s
    if exact_steps:
        assert s.n_generated == s.n_steps + s.n_accepted, s
    if k_max is not None:
        assert max(s.k_histogram) <= k_max, s
    assert all(0.0 <= a <= 1.0 for a in s.acceptance_by_position), s
    assert 0.0 <= s.acceptance_rate <= 1.0
    assert min(s.prefill_ms, s.draft_ms, s.verify_ms, s.sample_ms, s.generate_ms) >= 0.0, s
    assert s.n_ngram_steps <= s.n_steps
    assert s.n_plain_steps == s.k_histogram.get(0, 0), s  # the steps that drafted nothing, timed apart
    assert 0.0 <= s.plain_steps_ms <= s.generate_ms + 1e-6, s
    # every step decodes the rows up to its first rejection (or the bonus row), at most all of them
    assert s.n_steps + s.n_accepted <= s.n_verify_rows <= s.n_steps + s.n_drafted, s
    assert 0 <= s.n_cached < s.n_prompt


def check_memory(model):
    """llama.cpp's own memory holds exactly the positions specllm's list of cached tokens says: 0..len-1."""
    n = len(model.cached)
    assert (model.memory_pos_min, model.memory_pos_max) == ((0, n - 1) if n else (-1, -1)), \
        (model.memory_pos_min, model.memory_pos_max, n)


def check_kv(llm, prompt_tokens, completion):
    """After a generation the target's KV cache holds a prefix of prompt + generated tokens (+ the EOG token), and
    llama.cpp's memory of the target and of the draft model agrees with what specllm believes they hold."""
    cached = list(llm._engine.target.cached)
    seq = list(prompt_tokens) + list(completion.tokens)
    assert len(cached) <= len(seq) + 1, (cached, seq)
    assert cached[:len(seq)] == seq[:len(cached)], f"KV cache diverges at {first_divergence(cached, seq)}"
    check_memory(llm._engine.target)
    if llm._engine.draft is not None:
        check_memory(llm._engine.draft)


# --- statistics

def chi2_two_sample(a: Counter, b: Counter, min_expected=5.0):
    """Chi-square homogeneity statistic of two samples of outcomes, and its degrees of freedom. Outcomes with an
    expected count below min_expected in either sample are pooled into one cell (the usual validity rule)."""
    na, nb = sum(a.values()), sum(b.values())
    cells, pool = [], [0, 0]
    for key in set(a) | set(b):
        x, y = a.get(key, 0), b.get(key, 0)
        if (x + y) * min(na, nb) / (na + nb) < min_expected:
            pool[0] += x
            pool[1] += y
        else:
            cells.append((x, y))
    if pool[0] + pool[1]:
        cells.append(tuple(pool))
    stat = 0.0
    for x, y in cells:
        ex, ey = (x + y) * na / (na + nb), (x + y) * nb / (na + nb)
        stat += (x - ex) ** 2 / ex + (y - ey) ** 2 / ey
    return stat, len(cells) - 1


def chi2_critical(df, z=3.719):
    """Upper quantile of the chi-square distribution with df degrees of freedom (Wilson-Hilferty; z is the standard
    normal quantile: 3.719 gives the 1e-4 tail, accurate to a few percent for df >= 3)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def total_variation(a: Counter, b: Counter):
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(k, 0) / na - b.get(k, 0) / nb) for k in set(a) | set(b))


def run_cli(env, *args, timeout=120):
    """specllm-cli in a child process, its output captured (env: cli_env's)."""
    return subprocess.run([sys.executable, "-m", "specllm.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def cli_env(tmp_path) -> dict:
    """The environment of a specllm-cli child: a fresh HOME and model cache."""
    return dict(os.environ, HOME=str(tmp_path), SPECLLM_CACHE=str(tmp_path / "models"))
