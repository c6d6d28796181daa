"""What a quantization type does to the verify costs on this machine: T(n) of one model requantized to other types,
timed interleaved: T(1) (a plain step) and T(n) / T(1) (what a verify batch costs against it).

    python -m bench.quant_costs --types q8_0,q4_0 --rounds 4 --out bench/results/quant-costs/DATE-vm.json
    # ~4 min on a 2-core CPU with the default target (requantizing takes ~10 s a type)

The requantized files (llama_model_quantize from the target, which may be quantized already: they are for timing
only, their quality is below a file quantized from f16) go to --dir (default: a temporary directory, deleted after).
Each round times every file's sizes with Engine.profile_verify (each T(n) beside a 1-row step), files in turn; the
table gives the medians. llama.cpp repacks the weights it can for its CPU GEMM kernels, as specllm.LLM does (exact
mode too); --unrepacked also times each file loaded without that (loaded after the repacking buffer type is taken
out of the CPU backend's list, as the AMX rule takes out AMX: cpp/src/amx.cpp), interleaved with the rest, to show
what repacking buys. Costs move with the machine's load: run it on a quiet one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.checks import positive_int

SIZES = [1, 2, 3, 4, 6, 8, 12, 16]
TYPES = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
         "q6_k": "LLAMA_FTYPE_MOSTLY_Q6_K", "q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "f16": "LLAMA_FTYPE_MOSTLY_F16"}


def quantize(src: str, dst: str, kind: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, TYPES[kind])
    params.allow_requantize = True
    params.nthread = threads
    if llama_cpp.llama_model_quantize(src.encode(), dst.encode(), params) != 0:
        raise RuntimeError(f"llama_model_quantize could not make {kind} of {src}")


def measure(files: dict, threads: int, rounds: int, exact: bool, unrepacked: bool = False) -> dict:
    """{name: [T(n) per size, one list a round]}, the files timed in turn each round; with `unrepacked`, each file
    a second time as "<name>, not repacked"."""
    import specllm
    from specllm import _core

    def load(path):
        return specllm.LLM(path, draft="ngram", profile_costs=False, exact=exact, n_threads=threads)

    llms = {name: load(path) for name, path in files.items()}
    if unrepacked:
        if _core.drop_extra_buffer_type("CPU_REPACK") == 0:
            raise SystemExit("--unrepacked: this llama.cpp build does not repack weights (no CPU_REPACK buffer type)")
        llms.update({f"{name}, not repacked": load(path) for name, path in files.items()})
    out = {name: [] for name in llms}
    for r in range(rounds):
        for name, llm in llms.items():
            ms = llm._engine.profile_verify(SIZES, 5)
            out[name].append([ms[n - 1] for n in SIZES])
            print(f"round {r}, {name}: " + ", ".join(f"T({n}) {out[name][-1][i]:.1f}" for i, n in enumerate(SIZES)),
                  flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="GGUF path or registry name")
    p.add_argument("--types", default="q8_0,q4_0", help=f"comma-separated, of {', '.join(TYPES)}")
    p.add_argument("--threads", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=4, help="rounds over all files (medians are taken)")
    p.add_argument("--exact", action="store_true", help="specllm's exact mode (the same repacked weights)")
    p.add_argument("--unrepacked", action="store_true", help="also each file loaded without weight repacking")
    p.add_argument("--dir", default=None, help="keep the requantized files here (default: a temporary directory)")
    p.add_argument("--out", default=None, help="write the measurements to this JSON file")
    args = p.parse_args(argv)
    kinds = [k.strip().lower() for k in args.types.split(",") if k.strip()]
    bad = [k for k in kinds if k not in TYPES]
    if bad or not kinds:
        p.error(f"--types: unknown {', '.join(bad) or '(none given)'}; known: {', '.join(TYPES)}")
    if args.rounds < 1 or args.threads < 1:
        p.error("--rounds and --threads must be at least 1")

    from bench.run import resolve_model

    target = resolve_model(args.target)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.dir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        files = {"as given": target}
        for kind in kinds:
            path = folder / f"{Path(target).stem}.{kind}.gguf"
            if not path.exists():
                quantize(target, str(path), kind, args.threads)
            files[kind] = str(path)
        sizes = {name: os.path.getsize(path) for name, path in files.items()}
        timed = measure(files, args.threads, args.rounds, args.exact, args.unrepacked)
    sizes.update({f"{name}, not repacked": size for name, size in list(sizes.items()) if args.unrepacked})
    med = {name: [statistics.median(r[i] for r in rows) for i in range(len(SIZES))] for name, rows in timed.items()}
    print("\n| type | file MB | T(1) ms | " + " | ".join(f"T({n})/T(1)" for n in SIZES[1:]) + " |")
    print("|---|---:|---:|" + "---:|" * (len(SIZES) - 1))
    for name, t in med.items():
        print(f"| {name} | {sizes[name] / 1e6:.0f} | {t[0]:.1f} | " + " | ".join(f"{v / t[0]:.2f}" for v in t[1:]) + " |")
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_suffix(out.suffix + ".tmp")  # whole or not at all
        tmp_out.write_text(json.dumps({"target": target, "threads": args.threads, "exact": args.exact, "unrepacked": args.unrepacked,
                                       "sizes": SIZES, "file_bytes": sizes, "rounds": timed, "median_ms": med},
                                      indent=1))
        os.replace(tmp_out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
