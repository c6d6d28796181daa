"""The chat screen of specllm-cli: prompt, streamed replies, status lines, slash commands, history."""
from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import sys
import threading
import time

from .chat_session import ChatSession
from .cli_messages import MEASURING_THREAD, for_terminal, in_flags
from .errors import ContextOverflowError, SpecLLMError
from .llm import DEFAULT, default_draft

PROMPT = ">>> "
MORE = "... "  # the prompt of a message's next line
JUST_ASKED_S = 0.5  # a Ctrl-C this soon after the prompt appeared, on the last message's text: at an empty prompt
HELP = """\
/help                           this help
/reset                          forget the conversation (the system prompt and the drafting memory stay)
/forget                         forget the drafting memory (earlier replies drafts are copied from; with
                                --memory-file, the file is emptied too)
/system [TEXT|off]              show, set, or remove the system prompt
/stats                          statistics of the whole session
/save FILE                      save the conversation (JSON)
/load FILE                      take a saved conversation up again (with --prompt-cache-dir, its prefix is read
                                back from disk instead of decoded)
/draft on|off|ngram|NAME|PATH   change the drafter (the target and the conversation stay)
/exit                           quit (also Ctrl-D, or Ctrl-C at an empty prompt)
Ctrl-C during a reply stops it; what was written so far stays in the conversation.
A message goes on over several lines inside a ``` code fence (until the closing ```), or after a line that ends
with a backslash; a paste with newlines in it is one message (bracketed paste). A message may start with a
path or a comment (/usr/..., // ...): only the names above are commands; a space before the / sends any line."""
COMMANDS = ("/help", "/?", "/reset", "/forget", "/system", "/stats", "/save", "/load", "/draft", "/exit", "/quit",
            "/bye")


def is_command(line: str) -> bool:
    """A line for _command: it starts with /, and is one line whose first word is a command's name or no path
    (a typo is said, not sent); a paste of several lines or a path (/usr/bin/x, // a comment) is a message."""
    if not line.startswith("/"):
        return False
    name = line.split(None, 1)[0]
    return name in COMMANDS or ("\n" not in line and "/" not in name[1:])


class Style:
    """ANSI styles when enabled; in a readline prompt, escapes must be wrapped in \\001..\\002 (prompt=True)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    @classmethod
    def for_stream(cls, stream) -> "Style":
        # no-color.org: NO_COLOR set and non-empty; a dumb terminal shows escape codes as they are
        return cls(stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb")

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




# --- chat

def status_line(reply, style: Style, plain: bool) -> str:
    s = reply.stats
    parts = [f"{s.tokens_per_second:.1f} tok/s"]
    if not plain and s.n_drafted == 0:
        parts.append("nothing drafted")  # "auto" found no draft that would pay
    elif not plain:
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
    name, arg = (line.split(None, 1) + [""])[:2]  # a tab after the name too
    arg = arg.strip()
    if name in ("/exit", "/quit", "/bye"):
        return False
    if name in ("/help", "/?"):
        print(HELP)
    elif name == "/reset":
        session.reset()
        print(style.dim("conversation forgotten" + (" (the system prompt stays)" if session.system else "")))
    elif name == "/forget":
        n = session.forget_memory()
        kept = session.llm_options.get("memory_file")
        print(style.dim(f"drafting memory forgotten ({n} tokens" + (f"; {kept} emptied)" if kept else ")")))
    elif name == "/system":
        if arg.lower() == "off":
            session.set_system(None)
            print(style.dim("system prompt removed"))
        elif arg:
            try:
                session.set_system(arg)
            except SpecLLMError as e:
                print(style.red(f"error: {in_flags(str(e))}"))
                return True
            print(style.dim("system prompt set"))
        else:
            print(session.system if session.system else style.dim("no system prompt (/system TEXT sets one)"))
    elif name == "/stats":
        print(session.summary())
    elif name in ("/save", "/load"):
        if not arg:
            print(style.red(f"{name} FILE"))
            return True
        try:
            getattr(session, name[1:])(os.path.expanduser(arg))
        except SpecLLMError as e:
            print(style.red(f"error: {in_flags(str(e))}"))
            return True
        n = len(session.turns)
        print(style.dim(f"{'saved' if name == '/save' else 'loaded'} {n} message{'' if n == 1 else 's'}" +
                        (" and the system prompt" if session.system else "") + (f" to {arg}" if name == "/save"
                                                                                else f" from {arg}")))
    elif name == "/draft":
        draft = {"on": session.draft_model, "off": None, "none": None, "ngram": "ngram"}.get(arg.lower(),
                                                                                          os.path.expanduser(arg))
        if not arg or (arg.lower() == "on" and draft is None):
            print(style.red("/draft on|off|ngram|NAME|PATH" + ("" if not arg else ": no draft model known for "
                                                                "this target, give its NAME or PATH")))
            return True
        print(style.dim(f"loading drafter {str(draft).lower()} ..."), flush=True)
        try:
            session.set_draft(draft)
        except SpecLLMError as e:
            print(style.red(f"error: {in_flags(str(e))}"), f"(kept drafter {session.draft_label})")
            return True
        except KeyboardInterrupt:  # raised once the load ended: the label says which drafter is in place
            print(style.dim(f"interrupted; drafter: {session.draft_label}"))
            return True
        print(style.dim(f"drafter: {session.draft_label}"))
    else:
        print(style.red(f"unknown command {name}; /help lists them (a message that starts with / is sent when it "
                        f"begins with a space)"))
    return True


def _reply(session: ChatSession, text: str, style: Style) -> None:
    stop = []
    replying = [False]
    ends_line = [True]
    on_terminal = sys.stdout.isatty()

    def on_text(piece: str) -> None:
        replying[0] = True  # the prompt is processed: from now on Ctrl-C stops after the current step
        if piece:
            sys.stdout.write(for_terminal(piece) if on_terminal else piece)
            sys.stdout.flush()
            ends_line[0] = piece.endswith("\n")

    def on_sigint(*_) -> None:
        if not replying[0]:  # still processing the prompt: abandon it (the engine polls signals between batches)
            raise KeyboardInterrupt
        stop.append(True)  # replying: stop after the current step, keep the partial reply

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        reply = session.reply(text, on_text, stop_requested=lambda: bool(stop))
    except KeyboardInterrupt:
        print(style.dim("(interrupted while reading the prompt; the message was dropped)"))
        return
    except SpecLLMError as e:
        full = isinstance(e, ContextOverflowError)
        print(("" if ends_line[0] else "\n") + style.red(f"{'context full' if full else 'error'}: {in_flags(str(e))}"))
        if full and session.turns:
            print(style.dim(f"/reset forgets the conversation (or restart with a larger --ctx than {session.n_ctx})"))
        elif full:  # the message (with the system prompt) alone does not fit: /reset cannot help
            print(style.dim(f"the message{' with the system prompt' if session.system else ' alone'} is longer than "
                            f"the context: shorten it{' or /system off' if session.system else ''}, or restart with a "
                            f"larger --ctx than {session.n_ctx}"))
        return
    finally:
        signal.signal(signal.SIGINT, previous)
    if not ends_line[0]:
        print()
    print(status_line(reply, style, plain=session.llm.draft is None))


class IdleMeasure:
    """A cost profile the replies judged stale (measured while the machine was busy) is measured again while the
    user types, on a thread; the next message or command stops it within one timed step (measure_costs' stop) and a
    later pause tries again. Without it the chat drafts by the stale costs until the next start."""

    def __init__(self, llm, style: Style):
        self.llm, self.style = llm, style
        self.thread = None
        self.stopped = None  # the running measurement's stop (LLM.measure_costs)
        self.told = False

    def start(self) -> None:
        if self.thread is not None or not self.llm.profile_stale:
            return
        if not self.told:
            print(self.style.dim("(the cost profile looks measured while the machine was busy: measuring it again "
                                 "while you type; a message stops it)"))
            self.told = True
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(self.stopped,), name=MEASURING_THREAD, daemon=True)
        self.thread.start()

    def _run(self, stopped: threading.Event) -> None:
        try:
            self.llm.measure_costs(stop=stopped)
        except Exception:  # the old costs stay; the chat goes on
            pass

    def stop(self) -> None:
        if self.thread is None:
            return
        self.stopped.set()  # ends the measurement, even one that has not begun yet
        self.thread.join()
        self.thread = None


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
    if os.environ.get("TERM", "dumb") != "dumb":  # a dumb terminal would show the request's escape codes
        try:  # Python turns it off; on, the terminal marks a paste and its lines are one message, not one each
            readline.parse_and_bind("set enable-bracketed-paste on")
        except Exception:  # libedit (macOS) does not know it
            pass

    def save():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
        except OSError:
            pass

    return readline, save


def wants_more(text: str) -> bool:
    """Does a message typed so far go on: a ``` fence left open, or a last line that ends with a backslash?"""
    return text.count("```") % 2 == 1 or text.endswith("\\")


def message_text(typed: str) -> str:
    """The message of what was typed: one line stripped; several (a paste) without the blank lines around them but
    with the first line's indentation (a pasted method's "    def" lost it: code that no longer lined up)."""
    lines = typed.rstrip().split("\n")
    while lines and not lines[0].strip():
        del lines[0]
    return lines[0].strip() if len(lines) == 1 else "\n".join(lines)


def read_message(first: str, read_line) -> str:
    """The whole message that starts with the line `first`: lines from read_line() are added while wants_more().
    A trailing backslash joins its line to the next with a newline. EOF ends the message where it is."""
    text = first
    while wants_more(text):
        if text.endswith("\\"):
            text = text[:-1]
        try:
            text += "\n" + read_line()
        except EOFError:
            break
    return text


def run_chat(args, llm_options: dict, gen_options: dict) -> int:
    style = Style.for_stream(sys.stdout)
    draft = args.draft
    if draft == DEFAULT:
        draft = default_draft(args.model)
    draft = str(draft).lower() if draft in (None, "ngram") else draft
    print(style.dim(f"loading {args.model} (drafter: {draft}) ..."), flush=True)
    session = ChatSession(args.model, args.draft, ngram=args.ngram, system=args.system,
                          llm_options=llm_options, gen_options=gen_options)
    print(style.dim(f"{os.path.basename(session.model)} · drafter {session.draft_label} · context "
                    f"{session.n_ctx} · /help for commands, Ctrl-D to quit"))
    with ended_by_signals():
        return _chat(session, style)


class Killed(BaseException):  # not an Exception: no handler of errors on the way takes it for one
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def ended_by_signals():
    """SIGTERM, SIGHUP and SIGQUIT end the block (a chat, a pull, a generate) as Ctrl-D or Ctrl-C would, with exit
    status 128 + the signal's number (SystemExit), so that its cleanup runs: killed at the prompt by the signal's
    default action, a chat left the terminal without echo (readline restores it only on the way out of input()), a
    pull left pip running and its pieces in the cache, a generate its prompt state unwritten; the chat's history is
    saved and the drafting memory written (atexit)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum, frame):
        raise Killed(signum)

    # no SIGHUP or SIGQUIT (Ctrl-\, which left the terminal without echo under sh) on Windows
    sigs = [signal.SIGTERM] + [getattr(signal, name) for name in ("SIGHUP", "SIGQUIT") if hasattr(signal, name)]
    old = {sig: signal.signal(sig, on_signal) for sig in sigs}
    try:
        yield
    except Killed as k:
        raise SystemExit(128 + k.signum) from None
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _chat(session: ChatSession, style: Style) -> int:
    readline, save_history = _open_history()
    edited = readline is not None and sys.stdin.isatty()  # input() reads through readline: it takes \001..\002
    prompt = style.bold(PROMPT, prompt=edited)
    more = style.bold(MORE, prompt=edited)
    line, asked = "", 0.0
    continuing = []  # set while a message's next line is read

    def next_line() -> str:
        continuing.append(True)
        return input(more)

    idle = IdleMeasure(session.llm, style)
    try:
        while True:
            try:
                idle.start()
                continuing.clear()
                asked = time.monotonic()
                line = read_message(input(prompt), next_line)
                idle.stop()
            except EOFError:  # Ctrl-D
                print()
                return 0
            except KeyboardInterrupt:  # Ctrl-C: at an empty prompt quit, else drop the line (or the message)
                print()
                if continuing:  # a message of several lines was being typed: it is dropped, the chat goes on
                    continue
                typed = readline.get_line_buffer() if readline is not None else ""
                # a Ctrl-C just as the prompt appears can still see the previous line in readline's buffer
                if typed.strip() and (typed != line or time.monotonic() - asked > JUST_ASKED_S):
                    continue
                return 0
            spaced, line = line[:1].isspace(), message_text(line)  # " /etc is ...": a message, as it was meant
            if not line:
                continue
            if is_command(line) and not spaced:
                try:
                    if not _command(session, line, style):
                        return 0
                except KeyboardInterrupt:  # a /load or /save that waits on its file: the chat goes on
                    print(style.dim("interrupted"))
            else:
                _reply(session, line, style)
    finally:
        idle.stop()
        save_history()
