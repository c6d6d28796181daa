"""Reading a results file of bench.run, bench.multicall or bench.spread record: its shape checked for the kind the
tool expects, every problem said in one line that names the file (ResultsError; load_or_fail prints it and exits 1).

    run = results_file.load_or_fail(path, "run", system="plain", model=True)
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from bench.checks import fail

# kind -> (what makes one, the meta keys and record keys it needs, the tool that writes it)
KINDS = {
    "run": ("records", ("target", "tasks"), ("system", "task", "id", "turn", "text", "gen_tps"), "python -m bench.run"),
    "multicall": ("records", ("target", "sequences"), ("system", "sequence", "request", "text"),
                  "python -m bench.multicall"),
    "spread": ("prompts", (), (), "python -m bench.spread record"),
    # bench.run's records alone (meta not needed: bench.compare)
    "records": ("records", (), ("system", "task", "id", "turn", "text", "gen_tps"), "python -m bench.run"),
}
WRITER = {kind: v[3] for kind, v in KINDS.items()}


class ResultsError(Exception):
    pass


def kind_of(data) -> str | None:
    """"run", "multicall", "spread", or None for a JSON of none of those shapes."""
    if not isinstance(data, dict):
        return None
    if isinstance(data.get("profile"), dict) and isinstance(data.get("prompts"), dict):
        return "spread"
    records = data.get("records")
    if isinstance(records, list) and "meta" not in data:
        return "records"
    if isinstance(data.get("meta"), dict) and isinstance(records, list):
        first = records[0] if records and isinstance(records[0], dict) else {}
        return "multicall" if "sequence" in first or "sequences" in data["meta"] else "run"
    return None


def read_json(path) -> object:
    path = Path(path)
    if path.name.endswith(".records.jsonl"):
        raise ResultsError(f"{path} is the records log of a run that did not finish, not its results .json: run it "
                           "again (or to its end)")
    if path.is_dir():
        raise ResultsError(f"{path} is a folder: give a results .json file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such file") from None
    except OSError as e:
        raise ResultsError(f"cannot read {path}: {e.strerror or e}") from None
    if not data.strip():
        raise ResultsError(f"{path} is empty: not a results file")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ResultsError(f"{path} is not valid JSON (truncated or damaged?): {e}") from None


def load(path, kinds=("run",), system: str | None = None, model: bool = False) -> dict:
    """A results file of one of `kinds` ("run", "multicall", "spread"), its shape checked. system: a system that must
    have records in it (e.g. plain, whose answers are replayed); model: meta.target must be an existing file."""
    kinds = (kinds,) if isinstance(kinds, str) else tuple(kinds)
    data = read_json(path)
    kind = kind_of(data)
    if kind == "run" and "records" in kinds:
        kind = "records"
    if kind == "records" and "records" not in kinds:
        raise ResultsError(f"{path} has no meta: not a complete results file of {WRITER[kinds[0]]}")
    wanted = " or ".join(dict.fromkeys(WRITER[k] for k in kinds))
    if kind is None:
        shape = " or ".join(dict.fromkeys("'profile' and 'prompts'" if k == "spread" else "'meta' and 'records'"
                                          for k in kinds))
        raise ResultsError(f"{path} is not a results file of {wanted}: expected a JSON object with {shape}")
    if kind not in kinds:
        raise ResultsError(f"{path} is a results file of {WRITER[kind]}, not of {wanted}")
    if kind == "spread":
        if not data["prompts"] or not isinstance(data["profile"].get("verify_ms"), list):
            raise ResultsError(f"{path} has no prompts or no profile verify_ms: not a finished bench.spread record")
        return data
    _, meta_keys, record_keys, _ = KINDS[kind]
    missing = [k for k in meta_keys if k not in data["meta"]]
    if missing:
        raise ResultsError(f"{path} has no meta.{', meta.'.join(missing)}: not a complete results file of {wanted}")
    records = data["records"]
    if not records:
        raise ResultsError(f"{path} has no records: its run measured nothing")
    for i, rec in enumerate(records):
        gone = [k for k in record_keys if not isinstance(rec, dict) or k not in rec]
        if gone:
            raise ResultsError(f"{path}: record {i + 1} has no {', '.join(gone)}: the file is damaged")
    if system is not None and not any(r["system"] == system for r in records):
        ran = sorted({r["system"] for r in records})
        raise ResultsError(f"{path} has no records of system {system!r} (it ran {', '.join(ran)}): use a run that "
                           f"includes {system}")
    if model and not os.path.isfile(str(data["meta"]["target"])):
        raise ResultsError(f"{path}: its target model {data['meta']['target']} (meta.target) is not found: it was "
                           "moved or deleted, or the run was made on another machine")
    return data


def load_or_fail(path, kinds=("run",), system: str | None = None, model: bool = False) -> dict:
    try:
        return load(path, kinds, system, model)
    except ResultsError as e:
        fail(str(e))
