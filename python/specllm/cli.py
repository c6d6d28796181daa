"""specllm-cli: chat with, generate from and pull GGUF models, with speculative decoding.

    specllm-cli                                  chat with the default pair (qwen2.5-coder-1.5b + its draft)
    specllm-cli chat --model X --draft Y         Y: none, ngram, a registry name or a .gguf path
    specllm-cli generate "PROMPT" [--system S]   a reply to PROMPT in the model's chat template, streamed to stdout
    specllm-cli generate "PROMPT" --raw          plain completion of the text as given (also: a model without a
                                                 template); PROMPT from stdin when absent or "-"; --stats: a summary
                                                 line on stderr; --stats-json: all the stats, one JSON line on stderr
    specllm-cli serve [--port 8000] [--api-key K]   an OpenAI-compatible server on 127.0.0.1 (needs specllm[server])
    specllm-cli pull NAME ... / specllm-cli models

argparse rather than click: the standard library does all this needs, so no extra dependency.
Errors print one line, `specllm-cli: error: ...`, and exit with status 1 (argparse's usage errors: 2).
Colors only when stdout is a terminal and NO_COLOR is unset.
"""
from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys

from . import cli_args, grammar, registry
from .chat_screen import HELP, Style, ended_by_signals, run_chat  # noqa: F401  (cli.Style)
from .cli_messages import NOTE_LOGGERS, PROG, for_terminal, show_notes, stderr_handler, valid_text
from .cli_messages import error as _error
from .errors import InvalidOptionError, SpecLLMError
from .llm import DEFAULT, LLM, default_draft
from .load_options import check_arguments


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Speculative decoding for GGUF models. Without a command: chat.",
        epilog=f"'{PROG} COMMAND -h' for the options of a command.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"specllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    parser.commands = sub.choices  # name -> the command's parser (_check's usage errors)

    p = sub.add_parser("chat", help="chat in the terminal (the default command)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Chat in the terminal. Commands at the prompt:\n\n" + HELP)
    cli_args.model_args(p, max_tokens=1024)
    p.set_defaults(func=_run_chat)

    p = sub.add_parser("generate", help="reply to a prompt, streamed to stdout",
                       description="Reply to PROMPT, streamed to stdout (nothing else goes to stdout). PROMPT is "
                                   "the user's message in the model's chat template, as in 'chat'; with --raw, or "
                                   "when the model has no chat template, the text is completed as given.")
    p.add_argument("prompt", nargs="?", default="-", help="the prompt; absent or '-': read it from stdin")
    p.add_argument("--raw", action="store_true",
                   help="complete the prompt as given, without the chat template (plain text completion)")
    p.add_argument("--chat", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for old scripts
    p.add_argument("--stats", action="store_true",
                   help="after the completion, print a summary on stderr: tokens, speed, drafts accepted, speed-up")
    p.add_argument("--stats-json", action="store_true",
                   help="after the completion, print all its stats as one JSON object on one line to stderr")
    p.add_argument("--json", action="store_true", help="reply with a JSON object")
    p.add_argument("--json-schema", default=None, metavar="FILE", help="reply with JSON following the schema in FILE")
    p.add_argument("--grammar", default=None, metavar="FILE", help="reply in the GBNF grammar in FILE")
    cli_args.model_args(p, max_tokens=256)
    p.set_defaults(func=run_generate)

    p = sub.add_parser("serve", help="serve the model over the OpenAI HTTP API",
                       description="Serve the model over the OpenAI HTTP API (/v1/chat/completions, /v1/completions, "
                                   "/v1/responses, /v1/models, /health, /metrics), Anthropic's /v1/messages, Ollama's "
                                   "/api/chat and /api/generate, embeddings, and llama-server's /infill for editor plugins, until "
                                   "Ctrl-C or SIGTERM.")
    cli_args.load_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    g.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    key = g.add_mutually_exclusive_group()
    key.add_argument("--api-key", default=None, metavar="KEY", help="require 'Authorization: Bearer KEY'")
    key.add_argument("--api-key-file", default=None, metavar="FILE", help="read the API key from FILE")
    g.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from ORIGIN (repeatable; default: none)")
    g.add_argument("--max-queue", type=cli_args.positive_int, default=16, metavar="N",
                   help="requests that may wait for the model; more get 429 (default: 16)")
    g.add_argument("--cache-reuse", type=cli_args.nonnegative_int, default=0, metavar="N",
                   help="as llama-server's: move runs of N+ cached tokens to where a new prompt holds them instead of "
                        "decoding them again (an editor's rotating chunks of other files; the moved tokens' cache was "
                        "computed after other text, so the output can differ from a fresh prompt's); 256 is what "
                        "llama.vscode suggests (default: 0, off)")
    g.add_argument("--remeasure-after", type=cli_args.nonnegative_float, default=10.0, metavar="S",
                   help="once the steps judge the cost profile stale (measured while the machine was busy), measure it "
                        "again after S seconds without a request; a request interrupts it (default: 10; 0: never, "
                        "until the next start)")
    g.add_argument("--embedding-model", default=None, metavar="PATH",
                   help="a GGUF embedding model (nomic-embed-text, bge, ...) for /v1/embeddings and Ollama's "
                        "/api/embed (default: the chat model's own hidden states, mean-pooled)")
    g.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="the least severe message logged, specllm's and uvicorn's (default: info)")
    g.add_argument("--no-access-log", dest="access_log", action="store_false",
                   help="leave out uvicorn's line per request (as uvicorn's own flag)")
    p.set_defaults(func=run_serve)

    p = sub.add_parser("pull", help="download registry models into the cache (sha256-checked)")
    p.add_argument("names", nargs="+", metavar="NAME", help="registry names (see 'models')")
    p.add_argument("--force", action="store_true", help="download again even if cached (a damaged copy)")
    p.set_defaults(func=run_pull)

    p = sub.add_parser("models", help="list the known and the cached models")
    p.set_defaults(func=run_models)
    return parser


def _check(parser, args) -> None:
    parser = parser.commands.get(args.command, parser)  # the command's usage with its error
    if getattr(args, "ngram", None) and args.draft in (None, "ngram"):
        parser.error("--ngram (hybrid drafting) needs a draft model, not --draft " + str(args.draft).lower())
    if getattr(args, "ngram", None) and args.draft == DEFAULT and args.model in registry.known_models():
        if default_draft(args.model) is None:  # it was ignored: no drafting at all
            parser.error(f"--ngram (hybrid drafting) needs a draft model, and {args.model} has none by default: "
                         f"give --draft MODEL, or --draft ngram for n-gram lookup alone")
    if args.command == "serve":
        if args.api_key is not None and not args.api_key.strip():  # --api-key "$UNSET": every request refused
            parser.error("--api-key is empty (an unset variable?): give the key, or leave --api-key out")
        if any(not origin.strip() for origin in args.cors_origin):
            parser.error("--cors-origin is empty: give an origin such as http://localhost:3000")
    if args.command == "generate" and args.raw:
        if args.system is not None:
            parser.error("--system goes into the chat template; --raw completes the prompt as given, without it")
        if args.chat:
            parser.error("--chat (the chat template, the default) and --raw contradict each other")


def _llm_options(args) -> dict:
    given = (("exact", args.exact), ("memory_tokens", args.memory_tokens), ("memory_file", args.memory_file),
             ("prompt_cache_mb", args.prompt_cache_mb), ("prompt_cache_dir", args.prompt_cache_dir),
             ("prompt_cache_disk_mb", args.prompt_cache_disk_mb), ("learn_batch_costs", args.learn_batch_costs),
             ("embedding_model", getattr(args, "embedding_model", None)), ("cache_type_k", args.cache_type_k),
             ("cache_type_v", args.cache_type_v), ("flash_attn", args.flash_attn),
             ("chat_template", cli_args.chat_template_option(args)),
             ("chat_template_kwargs", args.chat_template_kwargs))
    extra = {k: v for k, v in given if v is not None}
    return {"n_ctx": args.ctx, "n_threads": args.threads, "seed": getattr(args, "seed", None), **extra}


def _gen_options(args) -> dict:
    return {"max_tokens": args.max_tokens, "temperature": args.temperature, "draft_length": args.draft_length,
            "repeat_penalty": args.repeat_penalty, "penalty_last_n": args.repeat_last_n,
            "presence_penalty": args.presence_penalty, "frequency_penalty": args.frequency_penalty}


# --- commands

def _run_chat(args) -> int:
    if sys.stdin is None:  # started with stdin closed (<&-): input() raised "lost sys.stdin"
        raise SpecLLMError("chat reads your messages from stdin, which is closed; run it in a terminal, or give "
                           "generate the prompt")
    return run_chat(args, _llm_options(args), _gen_options(args))


def run_generate(args) -> int:
    with ended_by_signals():  # SIGTERM, SIGHUP: the reply so far kept as on Ctrl-C (its prompt state, the memory file)
        return _generate(args)


def _generate(args) -> int:
    if args.prompt == "-" and sys.stdin is None:
        raise SpecLLMError("no prompt: stdin is closed; give the prompt as an argument")
    if args.prompt == "-" and sys.stdin.isatty():  # it waited without a word
        print("reading the prompt from stdin (Ctrl-D ends it)", file=sys.stderr, flush=True)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not (prompt if args.raw else prompt.strip()):
        raise SpecLLMError("the prompt is empty")
    rules = grammar.from_cli(args.json, args.json_schema, args.grammar)  # a bad file: an error before the load
    llm = LLM(args.model, args.draft, ngram=args.ngram is not False, **_llm_options(args))  # hybrid unless --no-ngram
    if not args.raw and llm.chat_template:
        system = [{"role": "system", "content": args.system}] if args.system is not None else []
        try:
            prompt = llm.apply_chat_template(system + [{"role": "user", "content": prompt.strip()}])
        except InvalidOptionError as e:  # the template's own word: it refuses a system prompt, llama.cpp does not
            # know it, ... (every one was "llama.cpp does not know this model's chat template")
            raise SpecLLMError(f"{e}; --raw completes the prompt as given") from None
    elif args.system is not None:
        raise SpecLLMError("this model has no chat template to put --system in; without --system, generate "
                           "completes the prompt as given")
    # else: --raw, or a model without a chat template: plain completion of the text as given
    last, ends_line, text, on_terminal = None, True, [], sys.stdout.isatty()
    for chunk in llm.stream(prompt, **_gen_options(args), **({"grammar": rules} if rules else {})):
        text.append(chunk.text)
        sys.stdout.write(for_terminal(chunk.text) if on_terminal else chunk.text)  # piped: exactly the text
        sys.stdout.flush()
        ends_line = chunk.text.endswith("\n") if chunk.text else ends_line
        last = chunk
    if sys.stdout.isatty() and not ends_line:
        sys.stdout.write("\n")  # only on a terminal: piped, stdout is exactly the completion
        ends_line = True
    sys.stdout.flush()
    lines = []
    if args.stats:
        lines.append(stats_line(last.stats, last.finish_reason, drafter=llm.draft is not None, profile=llm.profile))
    if args.stats_json:
        lines.append(json.dumps({"finish_reason": last.finish_reason, **last.stats.as_dict()}))
    if lines:
        # the completion's last line is unfinished and the stats would land on it: on a terminal, or in the same
        # file or pipe as stdout (2>&1); stdout itself gets nothing but the completion
        start = "\n" if not ends_line and _beside_stdout(sys.stderr) else ""
        sys.stderr.write(start + "\n".join(lines) + "\n")
        sys.stderr.flush()
    if rules and last.finish_reason == "length" and not _whole_json(args, "".join(text)):
        # a cut JSON reply went out with exit status 0 and no word
        raise SpecLLMError(f"the reply was cut at --max-tokens {args.max_tokens} before its "
                           f"{'JSON' if args.json or args.json_schema else 'grammar'} was complete; give a larger "
                           f"--max-tokens")
    return 0


def _whole_json(args, text: str) -> bool:
    """A reply under --json or --json-schema that parses (max_tokens ran out on its last token); False under
    --grammar, whose end cannot be told from here."""
    if not (args.json or args.json_schema):
        return False
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def stats_line(stats, finish_reason: str, drafter: bool, profile) -> str:
    """generate --stats: e.g. "256 tokens · 24.1 tok/s · 61% of drafted tokens accepted · 1.4x plain decoding".
    The speed-up is Stats.speedup, plain decoding timed on this reply's own undrafted steps (the machine as it is
    now); with fewer of them, 1000 / T(1) of the cost profile, measured when it was made (a quieter or busier
    moment: its words say so). None when nothing was drafted (a plain decoding run) or nothing is known."""
    s = stats
    parts = [f"{s.n_generated} token{'' if s.n_generated == 1 else 's'}", f"{s.tokens_per_second:.1f} tok/s"]
    if drafter:
        parts.append(f"{s.acceptance_rate:.0%} of drafted tokens accepted" if s.n_drafted else "nothing drafted")
    plain = _plain_rate(profile)
    if s.n_drafted and s.speedup:
        parts.append(f"{s.speedup:.2f}x plain decoding (timed on its {s.n_plain_steps} undrafted steps)")
    elif s.n_drafted and plain and s.tokens_per_second > 0:
        parts.append(f"{s.tokens_per_second / plain:.2f}x the plain rate of the cost profile")
    if finish_reason == "length":
        parts.append("cut at --max-tokens")
    return " · ".join(parts)


def _plain_rate(profile) -> float:
    """Tokens per second of plain decoding by the cost profile, 1000 / T(1); 0 when unknown."""
    try:
        t1 = profile["verify_ms"][profile["sizes"].index(1)]
    except (TypeError, KeyError, ValueError, IndexError):
        return 0.0
    return 1000.0 / t1 if isinstance(t1, (int, float)) and t1 > 0 else 0.0


def _beside_stdout(stream) -> bool:
    """Whether text written to stream shows up beside stdout's: a terminal, or the same file or pipe as stdout."""
    try:
        if stream.isatty():
            return True
        a, b = os.fstat(sys.stdout.fileno()), os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation: a stream with no file (a test's)
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def run_serve(args) -> int:
    try:
        from .server import serve
        from .server.jobs import model_id as server_model_id
    except ImportError as e:
        raise SpecLLMError(f"the server needs its extra: pip install 'specllm[server]' ({e})") from None
    api_key = args.api_key
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                api_key = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise SpecLLMError(f"cannot read the API key file: {e}") from None
        if not api_key:
            raise SpecLLMError(f"the API key file {args.api_key_file} is empty")
    log = logging.getLogger("specllm.server")
    if not any(getattr(h, "specllm_cli", False) for h in log.handlers):
        log.addHandler(stderr_handler())
    for name in ("specllm.server",) + NOTE_LOGGERS:  # and uvicorn's (serve)
        logging.getLogger(name).setLevel(args.log_level.upper())

    def load() -> LLM:  # on the server's worker thread: /health answers 503 until it returns
        return LLM(args.model, args.draft, ngram=args.ngram is not False, **_llm_options(args))

    # what the load would refuse in its first second (--threads 10000, --memory-file on a directory): said before
    # the port is bound and the server started
    check_arguments(args.model, args.draft, ngram=args.ngram is not False, **_llm_options(args))

    serve(load, host=args.host, port=args.port, api_key=api_key, cors_origins=args.cors_origin,
          model_id=server_model_id(args.model),  # /v1/models names it while it loads
          max_queue=args.max_queue, cache_reuse=args.cache_reuse, remeasure_after=args.remeasure_after,
          log_level=args.log_level, access_log=args.access_log)
    return 0


def run_pull(args) -> int:
    with ended_by_signals():  # SIGTERM: pip stopped and the pieces removed, as on Ctrl-C (killed, they stayed)
        for name in args.names:
            _pull_one(name, args.force)
    return 0


def _pull_one(name: str, force: bool) -> None:
    path = registry.pull(name, progress=sys.stderr.isatty(), force=force)
    print(f"{name}: {path} ({_size(os.path.getsize(path))})")
    draft = registry.default_draft(name)
    if draft and draft != "ngram" and not os.path.isfile(registry.cached_path(draft)):
        print(f"  its default draft is not cached yet: {PROG} pull {draft}")


def run_models(args) -> int:
    cached = {m["name"]: m for m in registry.list_cached()}
    rows = [("NAME", "ROLE", "SIZE", "CACHED", "DEFAULT DRAFT", "DESCRIPTION")]
    for name, entry in sorted(registry.known_models().items()):
        if name in cached:
            size = _size(cached[name]["size"])
        else:
            sizes = [s.get("size") for s in entry.get("sources", {}).values() if s.get("size")]
            size = _size(sizes[0]) if sizes else "?"
        state = ("damaged: pull again" if cached[name]["damaged"] else "yes") if name in cached else "no"
        kept = registry.pieces_kept(name) if name not in cached else None
        if kept:
            state = f"no ({kept[0]} of {kept[1]} pieces kept: pull goes on)"
        rows.append((name, entry.get("role") or "", size, state,
                     entry.get("default_draft") or "-", entry.get("description", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    print(f"\ncache: {registry.cache_dir()} ({len(cached)} of {len(rows) - 1} models); "
          f"'{PROG} pull NAME' downloads one")
    return 0


def _size(n: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" or n >= 100 else f"{n:.1f} {unit}"
        n /= 1000


# --- entry point

OUTPUT_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)  # stdout on a full disk, over a size limit


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if sys.stderr is None:  # started with 2>&-: errors go nowhere, but not as an AttributeError
        sys.stderr = open(os.devnull, "w")
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["chat"] + argv  # no command: chat
    parser = make_parser()
    if sys.stdout is None:  # >&-: print() writes nothing (serve, pull, models go on); a reply written to None was
        sys.stdout = open(os.devnull, "w")  # an AttributeError: generate and chat refuse below
        if argv[0] in ("generate", "chat"):
            _error(SpecLLMError(f"stdout is closed: {argv[0]}'s reply could not be written; give it a file or a pipe"))
            return 1
    args = parser.parse_args(argv)
    _check(parser, args)
    for stream in (sys.stdin, sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")  # odd bytes or a narrow locale must not kill a reply
    for name in ("prompt", "system"):
        if isinstance(getattr(args, name, None), str):
            setattr(args, name, valid_text(getattr(args, name)))
    show_notes()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specllm-cli generate ... | head`
        sys.stdout = open(os.devnull, "w")
        return 1
    except OSError as e:
        if e.errno not in OUTPUT_ERRORS or e.filename is not None:
            raise
        sys.stdout = open(os.devnull, "w")  # (its buffer is not flushed again at exit)
        what = "read the input or write the output" if e.errno == errno.EIO else "write the output"  # EIO: either
        _error(SpecLLMError(f"cannot {what}: {e.strerror}"))  # > /dev/full was a traceback
        return 1
    except SpecLLMError as e:
        _error(e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
