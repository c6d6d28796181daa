"""The verify-cost profile of the "auto" policy: measured once per model, device and thread count, cached."""
from __future__ import annotations

import contextlib
import json
import math
import logging
from pathlib import Path

from . import profile_files

log = logging.getLogger("specllm.profile")  # specllm-cli shows this one on stderr

# batch sizes measured at load. The engine pads a verify batch to the cheapest measured size at least as large
# (AutoPolicy::padded_rows), so every size up to 16 is measured: on a 2-core EPYC T(13..15) = 151-166 ms but
# T(16) = 135, and interpolating T(12) and T(16) under-costed 13-15 rows by up to 30 ms. Large batches matter
# where llama.cpp's batch kernels are allowed (exact=False, GPU): they cost far less per token than small ones,
# so a copy in progress pays with long n-gram drafts. Exact mode verifies in chunks of at most verify_rows rows:
# only the sizes up to that are ever decoded, so only those are measured.
SIZES = list(range(1, 17)) + [20, 24, 28, 32, 40, 48]
N_REPS = 2
N_REPS_EXACT = 4  # exact mode measures 3 small sizes: more rounds, a steadier T(1)


MAX_MEASURES = 3  # a profile that looks busy is measured again, at most this many times in all ...
NOISY_LOADS = 3   # ... and if it still does, once more at each later load, until this many loads found it so: a
                  # machine busy for a moment does not keep its profile for good, one always busy measures 5 times
SHORT_CONTEXT = 32    # the context T(n) is measured at (Engine.profile_verify's default prefix)
LONG_CONTEXT = 1024   # ... and the context what the context adds is measured at
CONTEXT_ROWS = 16     # the batch size that measurement uses (exact mode: its largest chunk)
CONTEXT_REPS = 5      # ... and its rounds at each context (3 before 2026-11-29, below)


def context_row_cost(engine, sizes: list, verify_ms: list) -> float:
    """ms that each verify row after the first adds per token of context beyond SHORT_CONTEXT, beyond the plain
    step's own rise: the policy scales every cost by one level that the steps keep up to date (the context's rise and
    the machine's speed), and adds this times that level for each row after the first (each attends to the whole
    context). So it is T(1) x the rise of T(n) / T(1) from SHORT_CONTEXT to LONG_CONTEXT (each the median of its
    pairs, measured back to back) per row per token: a batch of n rows at the long context then costs what was
    measured there.

    On a 2-core EPYC, T(n) at 32 to 3,072 tokens rose almost as T(1) did (this term -0.006 to +0.004 ms over n = 2-16
    in two grids, medians 0.000 and 0.002; `python -m bench.context_costs`). Measured before 2026-11-29 as T(n) long
    minus T(n) short scaled by T(1)'s rise (3 rounds), the term was not divided by the level the policy multiplies it
    by; it read 0.0103 in the profile the benchmarks used and 0 to 0.0068 in eight measurements minutes apart. This
    way 0 to 0.0121 in six: the VM's speed moves between the two halves, and the clip at 0 keeps the high readings.
    Noisy, but no longer off by the level's factor. None where the context is too small to measure it (n_ctx 256):
    the profile marks it unmeasured, and a load with a larger context measures it (context_row_cost_later)."""
    if not context_row_cost_fits(engine, sizes):
        return None
    n = min(CONTEXT_ROWS, max(sizes))
    prefix = min(LONG_CONTEXT, engine.target.n_ctx - n - 1)
    short = engine.profile_verify([1, n], CONTEXT_REPS, SHORT_CONTEXT)
    long = engine.profile_verify([1, n], CONTEXT_REPS, prefix)
    return max(0.0, rows_term(verify_ms[0], short[0], short[n - 1], long[0], long[n - 1], n, prefix))


UNMEASURED = "context_unmeasured"  # a profile's mark: measured with a context too small for context_row_ms


def context_row_cost_fits(engine, sizes: list) -> bool:
    """Whether this engine's context has room to measure context_row_cost (a batch of 2+ rows after 256 tokens)."""
    n = min(CONTEXT_ROWS, max(sizes))
    return n >= 2 and min(LONG_CONTEXT, engine.target.n_ctx - n - 1) >= 8 * SHORT_CONTEXT


def context_row_cost_later(engine, prof: dict, target: str, draft: str, n_threads: int, n_gpu_layers: int, kernels,
                           verify_rows: int) -> dict:
    """prof with its context term measured now (a load with room for it), written to the files of this target that
    hold prof's verify costs (its drafter's and the n-gram drafter's). A profile measured at n_ctx 256 held 0 for it,
    and every later load at 4096 took that 0: long prompts' batches costed as short ones'."""
    with profile_files.measuring(engine, target):
        context_ms = context_row_cost(engine, prof["sizes"], prof["verify_ms"])
    if context_ms is None:
        return prof

    def measured(on_file: dict) -> dict:
        out = dict(on_file, context_row_ms=float(context_ms))
        out.pop(UNMEASURED, None)
        return out
    _update(prof, target, [draft, ""], n_threads, n_gpu_layers, kernels, verify_rows, measured)
    return measured(prof)


def rows_term(t1: float, short_1: float, short_n: float, long_1: float, long_n: float, n: int, context: int) -> float:
    """ms per row per token that n rows add at `context` tokens beyond the plain step's rise, at a profile whose T(1)
    is t1: T(1) x the rise of T(n) / T(1) from SHORT_CONTEXT, per row after the first and token beyond it."""
    return t1 * (long_n / long_1 - short_n / short_1) / ((n - 1) * (context - SHORT_CONTEXT))


def increasing(verify_ms, tolerance: float = 0.9) -> bool:
    """Whether measured costs grow with the batch size: T(n) >= `tolerance` x T(m) for every measured m <= n/2,
    and T(1) > 0. A profile taken while the machine was busy (one size measured far above a larger one) fails
    this; the dips of real kernels (T(16) below T(13..15) on some CPUs, padded past) pass."""
    if not verify_ms or not verify_ms[0] > 0:
        return False
    at = {n: v for n, v in enumerate(verify_ms, 1) if v > 0}
    return all(t >= tolerance * at[m] for n, t in at.items() for m in at if 2 * m <= n)


def plausible(verify_ms, increase: float = 1.2) -> bool:
    """increasing(verify_ms), and no batch of n rows costs more than `increase` x n plain steps (T(1)): n rows never
    cost more than n single steps unless the machine got busy between the measurements (a 2-core VM measured
    T(1..3) = 104, 289, 391 ms while other work ran, 48, 89, 112 when quiet; with the first, "auto" never drafted)."""
    if not increasing(verify_ms):
        return False
    return all(t <= increase * n * verify_ms[0] for n, t in enumerate(verify_ms, 1) if t > 0)


# a profile measured while the machine ran slower than it does now passes plausible() when the slowdown was even (a
# 2-core Xeon VM measured T(1) = 319 ms while a test suite ran beside it, 83 ms quiet, with T(2) = 1.03 T(1) against
# 1.5 quiet and a row's context cost 0.038 ms against 0.005): the online level scales its costs back, not its shape.
# Once STALE_STEPS steps have taught the level (plain steps' measured / profiled cost: a running mean over the first
# 10 steps, then an EMA of weight 0.1, so about the last 10; "auto" only) and it reads below STALE_LEVEL, the profile
# on file is marked stale and measured again at the next load (measuring now would clear the KV cache and hold up the
# next request for 10-40 s). One measured again this way at STALE_LOADS loads in a row is kept (each load ran under
# contention; delete the file)
# (The level the checks read is learned from steps at a context of at most 512 tokens only, AutoPolicy::step_level: the
# costs' own level takes in the context, and at 3,000 tokens read 1.3-1.55 on a quiet machine as fast as its profile)
STALE_LEVEL = 0.7
STALE_STEPS = 32
# The level learns from every step, batches included, so a profile whose shape is wrong escapes it: measured while other
# work ran beside it (pytest on the same 2 cores), a 2-core Xeon VM's pair profile read T(1) = 100, T(2) = 123, T(8) =
# 253 ms, plausible and with a level of 0.86; quiet, its steps ran at 86, 134 and 299 ms (T(2) = 1.56 T(1), against
# the profile's 1.23), so "auto" drafted as if batches cost 20-40% less than they do. Once STALE_BATCHES verify
# batches have shown them costing more than STALE_SHAPE x the profile's shape against the plain steps of their moment
# (AutoPolicy::batch_shape; 1.16-1.30 on those steps, 1.04-1.07 on a profile measured quiet), the profile is marked stale
# too. Only too cheap: a profile that overprices batches (measured quiet, run busy) drafts too little, never slower
STALE_SHAPE = 1.12
STALE_BATCHES = 24
# ... judged only while the steps run at most STALE_SHAPE_LEVEL x the profile's costs: a machine slower now than when it
# was profiled is the busy one now, and what its batches cost says nothing against a profile measured quiet (under a
# test suite's load, the Xeon VM's steps ran at 4.15 x a quiet profile, batches read 1.185, and the profile was marked
# and measured again there, busy)
STALE_SHAPE_LEVEL = 1.15
STALE_LOADS = 3
STALE_MARKS = ("stale", "stale_shape")  # a profile's marks (why: the level, or the batches' shape) ...
COUNT_KEYS = ("stale_loads", "stale_for")  # ... and the count of loads that measured it again ("shape": for that)
STALE_MIN_MS = 2.0  # ... for a profile whose T(1) is at least this: steps of 0.1 ms (the tests' tiny models) run at
                    # 0.6-1.4 of a profile measured a second earlier


def sizes_for(verify_rows: int) -> list[int]:
    return [n for n in SIZES if n <= verify_rows] if verify_rows > 0 else SIZES


def _read(path: Path, verify_rows: int) -> dict | None:
    """The profile in path, or None (none yet, unreadable, damaged, or for other batch sizes): measured again."""
    try:
        prof = json.loads(path.read_text())
        if isinstance(prof, dict) and _valid(prof, sizes_for(verify_rows)):
            return prof
    except (OSError, ValueError, OverflowError, RecursionError):  # OverflowError: an integer of 400 digits
        pass
    return None


def _valid(prof: dict, sizes: list) -> bool:
    """Costs the engine takes: T(n) for n = 1..max(sizes), finite, >= 0 (0: not measured), T(1) > 0; a row's
    context cost, the draft token cost and the stale marks finite and >= 0 (a mark "x" failed set_draft with a
    TypeError after the drafter was swapped). A damaged file (strings, NaN, a cut list) stopped every
    load with an error instead of being measured again."""
    def ms(x) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0

    v = prof.get("verify_ms")
    return (prof.get("sizes") == sizes and isinstance(v, list) and len(v) == max(sizes) and all(map(ms, v))
            and v[0] > 0 and isinstance(prof.get("context_row_ms"), float) and ms(prof["context_row_ms"])
            and ms(prof.get("draft_token_ms", 0.0)) and all(ms(prof[k]) for k in STALE_MARKS if k in prof))


def noisy_loads(prof: dict | None) -> int:
    """How many loads measured this profile busy (its "noisy" mark; true in files before 2026-11-26 counts as 1)."""
    if prof is None or plausible(prof["verify_ms"]):
        return 0
    mark = prof.get("noisy", 0)
    return int(mark) if isinstance(mark, (bool, int)) else 0


def cached(target: str, draft: str, n_threads: int, n_gpu_layers: int, kernels,
           verify_rows: int = 0, busy_ok: bool = False) -> dict | None:
    """The cached profile of this pair and settings if it can be used as it is: plausible, or found busy at
    NOISY_LOADS loads, or busy_ok (any profile on file); else None."""
    prof = _read(profile_files.path(target, draft, n_threads, n_gpu_layers, kernels, verify_rows), verify_rows)
    if prof is not None and (busy_ok or ((plausible(prof["verify_ms"]) or noisy_loads(prof) >= NOISY_LOADS)
                                         and "stale" not in prof)):
        return prof
    return None


def stale_loads(prof: dict | None) -> int:
    """How many loads in a row measured this profile again because it was found stale (STALE_LOADS)."""
    mark = prof.get("stale_loads", 0) if prof is not None else 0
    return int(mark) if isinstance(mark, int) and not isinstance(mark, bool) and mark > 0 else 0


def mark_if_stale(engine, prof: dict, target: str, drafts: list, n_threads: int, n_gpu_layers: int, kernels,
                  verify_rows: int = 0, since: int = 0) -> dict | None:
    """After a generation: if STALE_STEPS+ steps since the drafter was set (`since`: the engine's count then) have
    shown the engine's level below STALE_LEVEL (prof was measured while the machine was slower), or STALE_BATCHES+
    verify batches since the costs were set have cost more than STALE_SHAPE x the profile's shape (it was measured
    while other work slowed its plain steps more than its batches; judged while the level is at most
    STALE_SHAPE_LEVEL), marks its files (mark_stale) and warns. None
    while not judged stale (check again after the next generation); once judged, the profile with its mark ("stale":
    the level; "stale_shape": the batches' shape, if that is why), which a drafter set later takes its verify costs
    from, or prof as it is if it was measured again at STALE_LOADS loads in a row already. A profile measured again
    that the steps agree with (the level; and the shape once judged, where the shape was why: "stale_for") loses its
    count (in prof and its files): the loads in a row start again."""
    if prof["verify_ms"][0] < STALE_MIN_MS:
        return None
    level, steps = engine.step_level()
    if steps - since < STALE_STEPS:
        return None
    shape, batches = engine.batch_shape()
    # the shape: judged on STALE_BATCHES+ batches since the last check that found the machine busier than profiled
    # (the level follows about the last 10 plain steps, the shape about the last 20 batches: a busy spell's batches
    # stay in the shape after the level has come back), and not while it is busier now
    if level > STALE_SHAPE_LEVEL:
        prof["busy_batches"] = batches  # in this LLM's profile only (never written: load_or_measure's keys)
    judged = batches - prof.get("busy_batches", 0) >= STALE_BATCHES and level <= STALE_SHAPE_LEVEL
    bent = judged and shape > STALE_SHAPE
    if level >= STALE_LEVEL and not bent:
        # the steps agree: with the level, where that was why it was measured again, and with the shape judged too
        # where the shape was (stale_for; a machine that never drafts 24 batches keeps the count of those)
        if "stale_loads" in prof and (judged or prof.get("stale_for") != "shape"):
            _update(prof, target, drafts, n_threads, n_gpu_layers, kernels, verify_rows,
                    lambda on_file: ({k: v for k, v in on_file.items() if k not in COUNT_KEYS}
                                     if "stale_loads" in on_file and "stale" not in on_file else None))
            if not judged:  # kept here: a shape judged bent later on counts on from it, not from 0
                prof["stale_loads_cleared"] = prof["stale_loads"]
            for k in COUNT_KEYS:
                prof.pop(k, None)
        return None
    why = (f"decoding steps run at {level:.2f} of what this machine's cost profile says" if level < STALE_LEVEL else
           f"verify batches cost {shape:.2f} x what this machine's cost profile says against its plain steps")
    count = max(stale_loads(prof), prof.get("stale_loads_cleared", 0))
    if count >= STALE_LOADS:
        log.warning("%s, and it was measured again at %d loads in a row already (each while the machine was busy?): "
                    "kept as it is; delete the profile files in %s to measure again", why, count,
                    profile_files.cache_dir())
        return prof
    marks = {"stale_shape": round(shape, 3)} if level >= STALE_LEVEL else {}
    if "stale_loads_cleared" in prof:  # the count the level's agreement cleared from the files, written back
        marks["stale_loads"] = count
    marked = mark_stale(prof, level, target, drafts, n_threads, n_gpu_layers, kernels, verify_rows, **marks)
    if marked:
        log.warning("%s (it was measured while the machine was slower or busy): it will be measured again at the next "
                    "load (%s)", why, ", ".join(map(str, marked)))
    return dict(prof, stale=round(level, 3), **marks)


def mark_stale(prof: dict, level: float, target: str, drafts: list, n_threads: int, n_gpu_layers: int, kernels,
               verify_rows: int = 0, **marks) -> list:
    """Marks the cached profiles of `target` with each of `drafts` ("" = the n-gram drafter) that hold prof's verify
    costs as stale (the steps cost `level` x what they say; `marks`: more to write beside it, e.g. stale_shape), so
    that the next load measures them again. Returns the paths marked; a file that cannot be written is left as it is."""
    return _update(prof, target, drafts, n_threads, n_gpu_layers, kernels, verify_rows,
                   lambda on_file: (None if "stale" in on_file or stale_loads(on_file) >= STALE_LOADS
                                    else dict(on_file, stale=round(level, 3), **marks)))


def _update(prof: dict, target: str, drafts: list, n_threads: int, n_gpu_layers: int, kernels,
            verify_rows: int, change) -> list:
    """Rewrites the cached profiles of `target` with each of `drafts` that hold prof's verify costs as
    change(on_file) says (None: left as it is). Returns the paths written."""
    written = []
    for draft in dict.fromkeys(drafts):
        try:  # a model file moved or deleted since the load (os.stat in profile_files.path), a full disk: left as it is
            path = profile_files.path(target, draft, n_threads, n_gpu_layers, kernels, verify_rows)
            on_file = _read(path, verify_rows)
            new = None if on_file is None or on_file["verify_ms"] != prof["verify_ms"] else change(on_file)
            if new is not None:
                profile_files.write(path, new)
                written.append(path)
        except OSError:
            pass
    return written


def load_or_measure(engine, target: str, draft: str, n_threads: int, n_gpu_layers: int, kernels,
                    verify_rows: int = 0, known: dict | None = None, swapped: bool = False,
                    measure: bool = False) -> dict:
    """Gives the engine its verify costs T(n) and draft token cost, from the cache or measured now. `known`: a
    profile of the same target and settings with another drafter, whose verify costs are taken instead of
    measured (measuring clears the target's KV cache). swapped: the drafter changed under a live KV cache, so a
    profile on file is taken as it is even if busy (a busy one is measured again at a load, never here). measure:
    measured now whatever is on file (LLM.measure_costs), counted as a load that measured a stale profile again."""
    sizes = sizes_for(verify_rows)
    path = profile_files.path(target, draft, n_threads, n_gpu_layers, kernels, verify_rows)
    prof = None if measure else cached(target, draft, n_threads, n_gpu_layers, kernels, verify_rows, busy_ok=swapped)
    if prof is not None and known is not None and "stale" in known and "stale" not in prof:
        shape_mark = {"stale_shape": known["stale_shape"]} if "stale_shape" in known else {}
        if mark_stale(known, known["stale"], target, [draft], n_threads, n_gpu_layers, kernels, verify_rows,
                      **shape_mark):
            prof = dict(prof, stale=known["stale"], **shape_mark)  # the same costs, judged stale under another drafter
    if prof is None and (known is None or known.get("sizes") != sizes):  # measured here: one process at a time
        target_only = profile_files.path(target, "", n_threads, n_gpu_layers, kernels, verify_rows)
        with profile_files.measuring(engine, target):
            if not measure:  # what another process measured meanwhile (waited for, or ended just before the lock)
                prof = cached(target, draft, n_threads, n_gpu_layers, kernels, verify_rows, busy_ok=swapped)
                if prof is None and known is None:  # another drafter's: its verify costs are the target's
                    known = cached(target, "", n_threads, n_gpu_layers, kernels, verify_rows, busy_ok=swapped)
            if prof is None:
                prof = _measure(engine, path, sizes, target, draft, n_threads, n_gpu_layers, kernels, verify_rows,
                                known)
                if draft and "noisy" not in prof and _read(target_only, verify_rows) is None:
                    # the target's verify costs for the n-gram drafter (and, through it, for any other): a load of
                    # another drafter takes them instead of measuring a minute again
                    with contextlib.suppress(OSError):
                        kept = {k: prof[k] for k in ("sizes", "verify_ms", "context_row_ms", UNMEASURED)
                                if k in prof}  # the mark too: unmarked, that file's 0 was taken for good
                        profile_files.write(target_only, kept | {"draft_token_ms": 0.0})
    elif prof is None:
        prof = _measure(engine, path, sizes, target, draft, n_threads, n_gpu_layers, kernels, verify_rows, known)
    if prof.get(UNMEASURED) and not swapped and context_row_cost_fits(engine, sizes):
        prof = context_row_cost_later(engine, prof, target, draft, n_threads, n_gpu_layers, kernels, verify_rows)
    engine.set_verify_costs(prof["verify_ms"])
    engine.set_context_row_cost(prof["context_row_ms"])
    if prof.get("draft_token_ms"):
        engine.set_draft_token_cost(prof["draft_token_ms"])
    return prof


def _measure(engine, path: Path, sizes: list, target: str, draft: str, n_threads: int, n_gpu_layers: int, kernels,
             verify_rows: int, known: dict | None) -> dict:
    """load_or_measure's profile when none on file is taken: measured (or the verify costs taken from `known`),
    with the counts and marks carried from the file, and written."""
    on_file = _read(path, verify_rows)
    before = noisy_loads(on_file)  # loads that found the cached profile busy
    # loads in a row that measured again a profile found stale (STALE_LOADS), kept through a busy measurement
    count = stale_loads(on_file) + (on_file is not None and "stale" in on_file)
    carried = {"stale_loads": count} if count else {}
    if count and ("stale_shape" in on_file if "stale" in on_file else on_file.get("stale_for") == "shape"):
        carried["stale_for"] = "shape"  # the last mark was for the batches' shape: it is judged before the count
    if known is not None and known.get("sizes") == sizes:
        verify_ms, context_ms = known["verify_ms"], known.get("context_row_ms", 0.0)
        if known.get(UNMEASURED):
            context_ms = None
        before = noisy_loads(known) - 1  # not measured here: the pair's file carries known's count
        # ... and its marks: costs judged stale are measured again at the next load, with the others
        carried = {k: known[k] for k in STALE_MARKS + COUNT_KEYS if k in known}
    else:
        log.info("measuring this machine's verify costs for batch sizes %s, to decide how many tokens to "
                 "draft (once per model, machine, thread count and mode; about a minute on a 2-core CPU, half "
                 "that in exact mode)",
                 ", ".join(map(str, sizes)))
        attempts = 1 if before else MAX_MEASURES
        for attempt in range(attempts):
            verify_ms = engine.profile_verify(sizes, N_REPS_EXACT if verify_rows > 0 else N_REPS)
            if plausible(verify_ms):
                break
            later = ("measuring again at the next load" if before + 1 < NOISY_LOADS
                     else "keeping them (delete the file to measure again)")
            log.warning("the measured verify costs do not grow with the batch size, or grow faster than one "
                        "plain step per row (%s ms): the machine was busy; %s",
                        ", ".join(f"{v:.0f}" if v >= 10 else f"{v:.2g}" for v in verify_ms if v > 0),
                        "measuring again" if attempt + 1 < attempts else f"using them for now, {later} "
                        f"({path})")
        context_ms = context_row_cost(engine, sizes, verify_ms)
    prof = {"sizes": sizes, "verify_ms": verify_ms, "draft_token_ms": engine.profile_draft(3),
            "context_row_ms": float(context_ms or 0.0), **carried}
    if context_ms is None:
        prof[UNMEASURED] = True
    if not plausible(verify_ms):
        prof["noisy"] = before + 1  # cached all the same: measured again at the next load, up to NOISY_LOADS
    try:
        profile_files.write(path, prof)
    except OSError as e:  # a read-only home or a full disk: measured again at the next load
        log.warning("the cost profile could not be saved to %s (%s); set SPECLLM_PROFILES to a directory this "
                    "process may write (unsaved, the costs are measured again at later loads)", path,
                    e.strerror or e)
    return prof
