"""What a grammar costs, and what drafting gains under one: JSON replies (response_format json_object / a JSON
schema) from plain decoding and the default drafting, with and without the grammar, interleaved per round.

    python -m bench.grammar                      # the default pair, 3 rounds, 4 prompts
    python -m bench.grammar --rounds 5 --max-tokens 160
    python -m bench.grammar --temperature 0.7      # sampled (a seed per round and prompt, the same for every system)
    python -m bench.grammar --full-mask            # every row masked whole: what the shortcuts (grammar.h) save
    python -m bench.grammar --temperature 0.7 --top-p 0.9   # top-p: masked whole, the draft-length policy knows it
    python -m bench.grammar --baseline-no-grammar-drafts     # what drafting the text a grammar forces gains
    python -m bench.grammar --tools              # tool prompts, tool_choice "auto": the server's lazy call grammar

Reported per prompt kind: tokens per second of each system (medians over rounds and prompts), the default's
speedup over plain decoding under the same grammar, the grammar's cost in each system (ms per token of
stats.sample_ms, where the grammar's checks and masks run) and whether every constrained reply parsed as JSON.
The prompts were written for this benchmark and never used to tune anything.
"""
from __future__ import annotations

import argparse
import json
import statistics

from bench.checks import positive_int

RECORD = {"type": "object", "properties": {
    "title": {"type": "string"}, "year": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["title", "year", "tags"], "additionalProperties": False}
PROMPTS = [  # (kind, prompt, schema or None for a JSON object)
    ("object", "Return a JSON object describing the HTTP status code 404: code, name, meaning, and whether a client "
               "should retry.", None),
    ("object", "Turn this into JSON with keys host, port, user and debug: host is db.internal, port 5432, user is "
               "app_reader, debug is off.", None),
    ("schema", "A JSON record for the book 'The Pragmatic Programmer' (1999), tagged with three topics.", RECORD),
    ("schema", "A JSON record for the film 'Spirited Away' (2001) with a few genre tags.", RECORD),
]


def _tool(name, description, properties, required):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = [
    _tool("book_table", "Book a restaurant table", {"restaurant": {"type": "string"}, "party_size": {
        "type": "integer"}, "time": {"type": "string"}}, ["restaurant", "party_size", "time"]),
    _tool("convert_currency", "Convert an amount of money", {"amount": {"type": "number"}, "from": {
        "type": "string"}, "to": {"type": "string"}}, ["amount", "from", "to"]),
    _tool("create_reminder", "Create a reminder", {"text": {"type": "string"}, "when": {"type": "string"}},
          ["text", "when"]),
]
TOOL_PROMPTS = [  # (kind, prompt): "call" asks for a tool, "answer" does not; tool_choice "auto"
    ("call", "Book a table for four at Luigi's tomorrow at 7pm."),
    ("call", "Convert 250 US dollars to euros."),
    ("call", "Remind me to call the dentist on Friday morning."),
    ("answer", "What is the capital of Australia? Answer in one sentence."),
]


def main(argv=None) -> None:
    import specllm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--rounds", type=positive_int, default=3)
    ap.add_argument("--max-tokens", type=positive_int, default=128)
    ap.add_argument("--threads", type=positive_int, default=2)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--top-p", type=float, default=1.0, help="below 1, every constrained row is masked whole")
    ap.add_argument("--full-mask", action="store_true", help="mask every row whole (the engine's test switch)")
    ap.add_argument("--baseline-no-grammar-drafts", action="store_true",
                    help="the baseline ('plain' columns) is the default with drafts of the text a grammar forces "
                         "turned off, not plain decoding: what those drafts gain")
    ap.add_argument("--tools", action="store_true",
                    help="tool prompts with tool_choice 'auto': the server's lazy call grammar (free text until a call "
                         "opens) against none; calls counted when the whole reply reads as its calls")
    ap.add_argument("--memory-tokens", type=int, default=None,
                    help="the drafting memory's size (0: off, every request a first one; default: the library's)")
    args = ap.parse_args(argv)
    mem = {} if args.memory_tokens is None else {"memory_tokens": args.memory_tokens}
    systems = {"plain": specllm.LLM(args.model, None, n_threads=args.threads, n_ctx=2048),
               "default": specllm.LLM(args.model, n_threads=args.threads, n_ctx=2048, **mem)}
    if args.baseline_no_grammar_drafts:
        systems["plain"] = specllm.LLM(args.model, n_threads=args.threads, n_ctx=2048, **mem)
        systems["plain"]._engine.set_grammar_drafts(False)
        print("baseline ('plain' columns): the default without drafts of grammar-forced text")
    for llm in systems.values():
        llm._engine.set_grammar_full_mask_for_tests(args.full_mask)
    tps = {}       # (kind, system, constrained) -> tokens per second per run
    cost = {}      # (kind, system) -> extra sample_ms per token, constrained minus not
    parsed = []
    if args.tools:
        from specllm.server import tool_grammar, tools as tool_calls

        rules, lazy = tool_grammar.call_grammar("auto", TOOLS)
        cases = [(kind, prompt, None) for kind, prompt in TOOL_PROMPTS]
    else:
        cases = PROMPTS
    for r in range(args.rounds):
        for i, (kind, prompt, schema) in enumerate(cases):
            messages = [{"role": "user", "content": prompt}]
            sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": 1000 * r + i}
            for name, llm in systems.items():
                if args.tools:
                    text = llm.apply_chat_template(messages, tools=TOOLS)
                    free = llm.generate(text, max_tokens=args.max_tokens, **sampling)
                    bound = llm.generate(text, max_tokens=args.max_tokens, grammar=rules, **lazy, **sampling)
                    tps.setdefault((kind, name, False), []).append(free.stats.tokens_per_second)
                    tps.setdefault((kind, name, True), []).append(bound.stats.tokens_per_second)
                    cost.setdefault((kind, name), []).append(bound.stats.sample_ms / bound.stats.n_generated -
                                                             free.stats.sample_ms / free.stats.n_generated)
                    calls = tool_calls.reply_parts(TOOLS, "", bound.text)[1]
                    parsed.append(bool(calls) == (kind == "call") and bound.finish_reason == "stop")
                    continue
                rules = specllm.grammar.json(schema)
                free = llm.chat(messages, max_tokens=args.max_tokens, **sampling)
                bound = llm.chat(messages, max_tokens=args.max_tokens, grammar=rules, **sampling)
                tps.setdefault((kind, name, False), []).append(free.stats.tokens_per_second)
                tps.setdefault((kind, name, True), []).append(bound.stats.tokens_per_second)
                cost.setdefault((kind, name), []).append(bound.stats.sample_ms / bound.stats.n_generated -
                                                         free.stats.sample_ms / free.stats.n_generated)
                try:
                    json.loads(bound.text)
                    parsed.append(bound.finish_reason == "stop")
                except ValueError:
                    parsed.append(False)
    med = statistics.median
    print("| prompts | plain tok/s | plain + grammar | default | default + grammar | default / plain, grammar "
          "| grammar ms/token plain / default |")
    print("|---|---|---|---|---|---|---|")
    for kind in dict.fromkeys(k for k, _, _ in cases):
        row = [med(tps[kind, s, c]) for s in systems for c in (False, True)]
        print(f"| {kind} | " + " | ".join(f"{v:.1f}" for v in row) + f" | {row[3] / row[1]:.2f} | "
              f"{med(cost[kind, 'plain']):.2f} / {med(cost[kind, 'default']):.2f} |")
    what = "made calls (call prompts) or none (answers) and ended" if args.tools else "parsed as JSON and ended"
    print(f"constrained replies that {what}: {sum(parsed)} of {len(parsed)}")


if __name__ == "__main__":
    main()
