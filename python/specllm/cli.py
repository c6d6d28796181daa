"""specllm-cli: chat with, generate from and pull GGUF models, with speculative decoding.

    specllm-cli                                  chat with the default pair (qwen2.5-coder-1.5b + its draft)
    specllm-cli chat --model X --draft Y         Y: none, ngram, a registry name or a .gguf path
    specllm-cli generate "PROMPT" [--stats]      prompt from stdin when absent or "-"; --stats: JSON on stderr
    specllm-cli pull NAME ... / specllm-cli models

argparse rather than click: the standard library does all this needs, so no extra dependency.
Errors print one line, `specllm-cli: error: ...`, and exit with status 1 (argparse's usage errors: 2).
Colors only when stdout is a terminal and NO_COLOR is unset.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys

from . import registry
from .chat_session import ChatSession
from .errors import ContextOverflowError, SpecLLMError
from .llm import DEFAULT, LLM

PROG = "specllm-cli"
DEFAULT_MODEL = "qwen2.5-coder-1.5b"
PROMPT = ">>> "
HELP = """\
/help                           this help
/reset                          forget the conversation (the system prompt stays)
/system [TEXT]                  show, or set, the system prompt
/stats                          statistics of the whole session
/draft on|off|ngram|NAME|PATH   change the drafter (reloads the models; the conversation stays)
/exit                           quit (also Ctrl-D, or Ctrl-C at an empty prompt)
Ctrl-C during a reply stops it; what was written so far stays in the conversation."""


class Style:
    """ANSI styles when enabled; in a readline prompt, escapes must be wrapped in \\001..\\002 (prompt=True)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream) -> "Style":
        return cls(stream.isatty() and not os.environ.get("NO_COLOR"))  # no-color.org: set and non-empty

    def _wrap(self, code: str, text: str, prompt: bool = False) -> str:
        if not self.enabled:
            return text
        on, off = f"\033[{code}m", "\033[0m"
        if prompt:
            on, off = f"\001{on}\002", f"\001{off}\002"
        return on + text + off

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def bold(self, text: str, prompt: bool = False) -> str:
        return self._wrap("1", text, prompt)

    def red(self, text: str) -> str:
        return self._wrap("31", text)


# --- arguments

def _positive_int(s: str) -> int:
    n = int(s)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {n}")
    return n


def _temperature(s: str) -> float:
    t = float(s)
    if not 0 <= t < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (0 = greedy), got {s}")
    return t


def _draft_length(s: str):
    if s in ("auto", "heuristic"):
        return s
    try:
        k = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto, heuristic or an int from 0 to 16, got {s!r}") from None
    if not 0 <= k <= 16:
        raise argparse.ArgumentTypeError(f"must be from 0 to 16, got {k}")
    return k


def _draft(s: str):
    return None if s.lower() == "none" else s


def _model_args(p: argparse.ArgumentParser, max_tokens: int) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help=f"target model: registry name or .gguf path (default: {DEFAULT_MODEL})")
    g.add_argument("--draft", "-d", type=_draft, default=DEFAULT, metavar="none|ngram|NAME|PATH",
                   help="drafter: none (plain decoding), ngram (prompt lookup), or a draft model with the target's "
                        "vocabulary (default: the registry's draft for a registry target, none for a path)")
    g.add_argument("--ngram", action="store_true",
                   help="hybrid drafting: with a draft model, also draft by n-gram lookup when it pays better")
    g.add_argument("--ctx", type=_positive_int, default=4096, metavar="N", help="context window (default: 4096)")
    g.add_argument("--threads", "-t", type=_positive_int, default=None, metavar="N",
                   help="CPU threads (default: llama.cpp's choice)")
    g = p.add_argument_group("generation")
    g.add_argument("--temperature", type=_temperature, default=0.0, metavar="T",
                   help="sampling temperature (default: 0 = greedy)")
    g.add_argument("--max-tokens", type=_positive_int, default=max_tokens, metavar="N",
                   help=f"longest reply (default: {max_tokens})")
    g.add_argument("--draft-length", type=_draft_length, default="auto", metavar="auto|heuristic|K",
                   help="draft tokens per step: auto (cost model, default), heuristic, or a fixed K (0-16)")
    g.add_argument("--seed", type=int, default=None, help="sampling seed (default: a fresh one)")
    g.add_argument("--system", "-s", default=None, metavar="TEXT", help="system prompt")


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, description="Speculative decoding for GGUF models. Without a command: chat.",
        epilog=f"'{PROG} COMMAND -h' for the options of a command.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"specllm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("chat", help="chat in the terminal (the default command)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Chat in the terminal. Commands at the prompt:\n\n" + HELP)
    _model_args(p, max_tokens=1024)
    p.set_defaults(func=run_chat)

    p = sub.add_parser("generate", help="complete a prompt, streamed to stdout",
                       description="Complete PROMPT, streamed to stdout (nothing else goes to stdout).")
    p.add_argument("prompt", nargs="?", default="-", help="the prompt; absent or '-': read it from stdin")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--stats", action="store_true",
                   help="after the completion, print its stats as one JSON object on one line to stderr")
    _model_args(p, max_tokens=256)
    p.set_defaults(func=run_generate)

    p = sub.add_parser("pull", help="download registry models into the cache (sha256-checked)")
    p.add_argument("names", nargs="+", metavar="NAME", help="registry names (see 'models')")
    p.set_defaults(func=run_pull)

    p = sub.add_parser("models", help="list the known and the cached models")
    p.set_defaults(func=run_models)
    return parser


def _check(parser, args) -> None:
    if getattr(args, "ngram", False) and args.draft in (None, "ngram"):
        parser.error("--ngram (hybrid drafting) needs a draft model, not --draft " + str(args.draft).lower())
    if args.command == "generate" and args.system and not args.chat:
        parser.error("--system needs --chat")


def _llm_options(args) -> dict:
    return {"n_ctx": args.ctx, "n_threads": args.threads, "seed": args.seed}


def _gen_options(args) -> dict:
    return {"max_tokens": args.max_tokens, "temperature": args.temperature, "draft_length": args.draft_length}


# --- commands

def run_generate(args) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if args.chat:
        prompt = prompt.strip()
    if not prompt:
        raise SpecLLMError("the prompt is empty")
    llm = LLM(args.model, args.draft, ngram=args.ngram, **_llm_options(args))
    if args.chat:
        system = [{"role": "system", "content": args.system}] if args.system else []
        stream = llm.chat(system + [{"role": "user", "content": prompt}], stream=True, **_gen_options(args))
    else:
        stream = llm.stream(prompt, **_gen_options(args))
    last, ends_line = None, True
    for chunk in stream:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        ends_line = chunk.text.endswith("\n") if chunk.text else ends_line
        last = chunk
    if sys.stdout.isatty() and not ends_line:
        sys.stdout.write("\n")  # only on a terminal: piped, stdout is exactly the completion
    sys.stdout.flush()
    if args.stats:
        print(json.dumps({"finish_reason": last.finish_reason, **last.stats.as_dict()}), file=sys.stderr)
    return 0


def run_pull(args) -> int:
    for name in args.names:
        path = registry.pull(name, progress=sys.stderr.isatty())
        print(f"{name}: {path} ({_size(os.path.getsize(path))})")
        draft = registry.default_draft(name)
        if draft and draft != "ngram" and not os.path.isfile(registry.cached_path(draft)):
            print(f"  its default draft is not cached yet: {PROG} pull {draft}")
    return 0


def run_models(args) -> int:
    cached = {m["name"]: m for m in registry.list_cached()}
    rows = [("NAME", "ROLE", "SIZE", "CACHED", "DEFAULT DRAFT", "DESCRIPTION")]
    for name, entry in sorted(registry.known_models().items()):
        if name in cached:
            size = _size(cached[name]["size"])
        else:
            sizes = [s.get("size") for s in entry.get("sources", {}).values() if s.get("size")]
            size = _size(sizes[0]) if sizes else "?"
        rows.append((name, entry.get("role") or "", size, "yes" if name in cached else "no",
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


# --- chat

def status_line(reply, style: Style, plain: bool) -> str:
    s = reply.stats
    parts = [f"{s.tokens_per_second:.1f} tok/s"]
    if not plain:
        parts += [f"{s.acceptance_rate:.0%} accepted", f"draft {_mean(s.mean_draft_length)}"]
    parts.append(f"{s.n_generated} tokens")
    if reply.finish_reason == "interrupted":
        parts.append("stopped")
    elif reply.context_full:
        parts.append("context full: /reset to start over")
    elif reply.finish_reason == "length":
        parts.append("cut at --max-tokens")
    return style.dim(" · ".join(parts))


def _mean(x: float) -> str:
    return f"{x:.2f}" if 0 < x < 0.1 else f"{x:.1f}"  # a rare draft must not read as "draft 0.0"


def _command(session: ChatSession, line: str, style: Style) -> bool:
    """Run a slash command; False when it is /exit."""
    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit", "/bye"):
        return False
    if name in ("/help", "/?"):
        print(HELP)
    elif name == "/reset":
        session.reset()
        print(style.dim("conversation forgotten" + (" (the system prompt stays)" if session.system else "")))
    elif name == "/system":
        if arg:
            session.system = arg
            print(style.dim("system prompt set"))
        else:
            print(session.system if session.system else style.dim("no system prompt (/system TEXT sets one)"))
    elif name == "/stats":
        print(session.summary())
    elif name == "/draft":
        draft = {"on": session.draft_model, "off": None, "none": None}.get(arg.lower(), arg)
        if not arg or (arg.lower() == "on" and draft is None):
            print(style.red("/draft on|off|ngram|NAME|PATH" + ("" if not arg else ": no draft model known for "
                                                                "this target, give its NAME or PATH")))
            return True
        print(style.dim(f"loading {session.model} with drafter {str(draft).lower()} ..."), flush=True)
        try:
            session.set_draft(draft)
        except SpecLLMError as e:
            print(style.red(f"error: {e}"), f"(kept drafter {session.draft_label})")
            return True
        print(style.dim(f"drafter: {session.draft_label}"))
    else:
        print(style.red(f"unknown command {name}; /help lists them"))
    return True


def _reply(session: ChatSession, text: str, style: Style) -> None:
    stop = []
    ends_line = [True]

    def on_text(piece: str) -> None:
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()
            ends_line[0] = piece.endswith("\n")

    previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))  # Ctrl-C: stop after this step
    try:
        reply = session.reply(text, on_text, stop_requested=lambda: bool(stop))
    except SpecLLMError as e:
        full = isinstance(e, ContextOverflowError)
        print(("" if ends_line[0] else "\n") + style.red(f"{'context full' if full else 'error'}: {e}"))
        if full:
            print(style.dim(f"/reset forgets the conversation (or restart with a larger --ctx than {session.n_ctx})"))
        return
    finally:
        signal.signal(signal.SIGINT, previous)
    if not ends_line[0]:
        print()
    print(status_line(reply, style, plain=session.llm.draft is None))


def _open_history():
    """Line editing and history through readline, when available. Returns a function that saves the history."""
    try:
        import readline
    except ImportError:  # e.g. Windows: plain input()
        return None, lambda: None
    path = pathlib.Path.home() / ".cache" / "specllm" / "history"
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)

    def save():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass

    return readline, save


def run_chat(args) -> int:
    style = Style.for_stream(sys.stdout)
    draft = args.draft
    if draft == DEFAULT:
        draft = None if os.path.exists(args.model) else registry.default_draft(args.model)
    draft = str(draft).lower() if draft in (None, "ngram") else draft
    print(style.dim(f"loading {args.model} (drafter: {draft}) ..."), flush=True)
    session = ChatSession(args.model, args.draft, ngram=args.ngram, system=args.system,
                          llm_options=_llm_options(args), gen_options=_gen_options(args))
    print(style.dim(f"{os.path.basename(session.model)} · drafter {session.draft_label} · context "
                    f"{session.n_ctx} · /help for commands, Ctrl-D to quit"))
    readline, save_history = _open_history()
    prompt = style.bold(PROMPT, prompt=True)
    line = ""
    try:
        while True:
            try:
                line = input(prompt)
            except EOFError:  # Ctrl-D
                print()
                return 0
            except KeyboardInterrupt:  # Ctrl-C: at an empty prompt quit, else drop the line
                print()
                typed = readline.get_line_buffer() if readline is not None else ""
                # a Ctrl-C just as the prompt appears can still see the previous line in readline's buffer
                if typed.strip() and typed != line:
                    continue
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not _command(session, line, style):
                    return 0
            else:
                _reply(session, line, style)
    finally:
        save_history()


# --- entry point

def _error(message: str) -> None:
    first, *rest = str(message).strip().splitlines() or ["(no message)"]
    print(f"{PROG}: error: {first}", file=sys.stderr)
    for line in rest:
        print(f"  {line}", file=sys.stderr)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv = ["chat"] + argv  # no command: chat
    parser = make_parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")  # odd bytes or a narrow locale must not kill a reply
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # `specllm-cli generate ... | head`
        sys.stdout = open(os.devnull, "w")
        return 1
    except SpecLLMError as e:
        _error(e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
