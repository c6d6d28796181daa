"""specllm-cli with odd input, found by a sweep of chat and generate in a terminal: files that are not files, a
system prompt the template refuses, messages that start with a path, a dumb terminal, stdout on a full disk or
closed, a JSON reply cut short. Tiny random models, as in test_cli.py."""

import json
import os
import subprocess
import sys

import pytest

from test_cli import ask, chat, cli_args, env, exits_cleanly, tiny  # noqa: F401 (env, tiny: fixtures)

pexpect = pytest.importorskip("pexpect")

NO_SYSTEM = ("{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
             "{% endif %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def test_load_refuses_what_is_not_a_regular_file_or_too_large(tiny, env, tmp_path):
    """/load of a FIFO hung the chat (Ctrl-C then ended it, the conversation lost); /dev/zero filled the memory."""
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate(65 << 20)  # sparse: 65 MiB of nothing on disk
    child = chat(tiny, env, "--max-tokens", "8")
    assert "tok/s" in ask(child, "hello")
    out = ask(child, f"/load {tmp_path / 'fifo'}")
    assert f"error: cannot read {tmp_path / 'fifo'}: not a regular file" in out and "not JSON" not in out
    out = ask(child, f"/load {tmp_path / 'huge.json'}")
    assert "larger than 64 MiB" in out and "not JSON" not in out
    assert "conversation: 2 messages" in ask(child, "/stats")  # as it was
    assert "not a regular file" in ask(child, f"/save {tmp_path / 'fifo'}")  # and not replaced by a file
    assert (tmp_path / "fifo").is_fifo()
    child.sendeof()
    exits_cleanly(child)


def test_a_system_prompt_the_template_refuses_is_refused_and_one_can_be_removed(tiny, env, tmp_path):
    """A template without a system role (Gemma's): /system took the text, then every message failed, and nothing
    removed it (/system "" set the text '""')."""
    (tmp_path / "nosys.jinja").write_text(NO_SYSTEM)
    child = chat(tiny, env, "--max-tokens", "8", "--chat-template-file", str(tmp_path / "nosys.jinja"))
    out = ask(child, "/system be nice")
    assert "takes no such system prompt" in out and "System role not supported" in out
    assert "no system prompt" in ask(child, "/system")
    (tmp_path / "saved.json").write_text(json.dumps({"system": "be nice", "messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}))
    assert "takes no such system prompt" in ask(child, f"/load {tmp_path / 'saved.json'}")  # from a file too
    assert "conversation: 0 messages" in ask(child, "/stats")
    assert "tok/s" in ask(child, "hello")  # the chat goes on
    child.sendeof()
    exits_cleanly(child)
    child = chat(tiny, env, "--max-tokens", "8")
    assert "system prompt set" in ask(child, "/system be nice")
    assert "system prompt removed" in ask(child, "/system off")
    assert "no system prompt" in ask(child, "/system")
    child.sendeof()
    exits_cleanly(child)
    r = subprocess.run([sys.executable, *cli_args(tiny, "chat", "--system", "be nice", "--chat-template-file",
                                                  str(tmp_path / "nosys.jinja"))],
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "takes no such system prompt" in r.stderr, r.stderr
    # generate said "llama.cpp does not know this model's chat template" for any refusal, the template's word lost
    r = subprocess.run([sys.executable, *cli_args(tiny, "generate", "hello", "--system", "be nice",
                                                  "--chat-template-file", str(tmp_path / "nosys.jinja"))],
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "System role not supported" in r.stderr, r.stderr
    assert "does not know" not in r.stderr and "--raw" in r.stderr


def test_a_message_starting_with_a_path_is_a_message_and_commands_take_a_tab(tiny, env, tmp_path):
    """'/usr/bin/python3 says ...' or a pasted '// comment' was an unknown command, the text dropped."""
    child = chat(tiny, env, "--max-tokens", "8")
    assert "tok/s" in ask(child, "/usr/bin/python3 says 'No module named foo' - why?")
    assert "unknown command /sav" in ask(child, "/sav x.json")  # a typo is still said, not sent
    assert "tok/s" in ask(child, " /etc is a folder?")  # a space before it: a message
    assert "drafter: ngram" in ask(child, "/draft NGRAM")
    assert "saved 4 messages" in ask(child, f"/save\t{tmp_path / 'c.json'}")
    child.sendeof()
    exits_cleanly(child)


def test_a_dumb_terminal_gets_no_escape_codes(tiny, env):
    child = chat(tiny, dict(env, TERM="dumb"), "--max-tokens", "8")
    out = ask(child, "hello") + ask(child, "/nope")
    assert "tok/s" in out and "\033[" not in out
    child.sendeof()
    exits_cleanly(child)


def test_generate_on_a_full_disk_or_a_closed_stdout_says_so_in_one_line(tiny, env):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, *cli_args(tiny, "generate", "hello there", "--max-tokens", "8")],
                           env=env, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "specllm-cli: error: cannot write the output: No space left on device"
    r = subprocess.run([sys.executable, *cli_args(tiny, "generate", "hello", "--max-tokens", "8")], env=env,
                       stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=lambda: os.close(1))
    assert r.returncode == 1 and "error: stdout is closed" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "specllm.cli", "models"], env=env, stderr=subprocess.PIPE, text=True,
                       timeout=120, preexec_fn=lambda: os.close(1))
    assert r.returncode == 0 and not r.stderr, r.stderr  # a command that only prints goes on (serve: its log)
    r = subprocess.run([sys.executable, *cli_args(tiny, "chat")], env=env, capture_output=True, text=True,
                       timeout=120, preexec_fn=lambda: os.close(0))
    assert r.returncode == 1 and "error: chat reads your messages from stdin, which is closed" in r.stderr, r.stderr


def test_a_json_reply_cut_at_max_tokens_is_an_error(tiny, env):
    r = subprocess.run([sys.executable, *cli_args(tiny, "generate", "hi", "--json", "--max-tokens", "1")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "the reply was cut at --max-tokens 1 before its JSON was complete" in r.stderr
    # whole when max_tokens ran out (the tiny model writes "{}", then spaces): no error
    r = subprocess.run([sys.executable, *cli_args(tiny, "generate", "hi", "--json", "--max-tokens", "3",
                                                  "--stats-json")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "{}" and '"finish_reason": "length"' in r.stderr, r.stderr


def test_a_value_the_library_refuses_is_named_by_its_flag(tiny, env):
    r = subprocess.run([sys.executable, *cli_args(tiny, "generate", "hi", "--presence-penalty", "1e308")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "--presence-penalty must be a finite number" in r.stderr, r.stderr


def test_a_system_prompt_that_leaves_no_room_is_refused(tiny, env):
    """/system took a prompt longer than the context; then every message failed with "the message alone is longer
    than the context" (a 2-token "hi") and /stats showed 1249 of 256 tokens."""
    long = " ".join(["word"] * 400)
    child = chat(tiny, env, "--max-tokens", "8", "--ctx", "256")
    out = ask(child, f"/system {long}")
    assert "the system prompt is" in out and "n_ctx" not in out and "--ctx" in out, out
    assert "no system prompt" in ask(child, "/system")  # not taken
    assert "tok/s" in ask(child, "hi")  # the chat goes on
    child.sendeof()
    exits_cleanly(child)
    r = subprocess.run([sys.executable, *cli_args(tiny, "chat", "--ctx", "256", "--system", long)],
                       env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "the system prompt is" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["/save {d}/a\x00b.json", "/load {d}/a\x00b.json", "/draft {d}/a\x00b.gguf"])
def test_a_path_with_a_nul_character_is_an_error_line_not_a_crash(tiny, env, tmp_path, command):
    """A NUL in a /save or /draft path (a scripted chat on a pipe) ended the chat with a traceback ("embedded null
    byte"); /load called it "not JSON"."""
    r = subprocess.run([sys.executable, *cli_args(tiny, "chat", "--max-tokens", "4")], env=env,
                       input=command.format(d=tmp_path) + "\n/stats\n", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert "holds a NUL character" in r.stdout and "not JSON" not in r.stdout, r.stdout
    assert "conversation: 0 messages" in r.stdout  # the chat went on to the next command


STRICT = ("{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
          "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
          "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")


def test_a_paste_in_a_real_terminal_is_one_message_with_its_indentation(tiny, env, tmp_path):
    """A terminal marks a paste only when the program asks it to (ESC[?2004h), which Python's readline does not:
    a pasted function was sent line by line, one reply each; and the first line of a paste lost its indentation."""
    child = chat(tiny, dict(env, TERM="xterm-256color"), "--max-tokens", "4")
    assert "\x1b[?2004h" in child.before  # asked before the first prompt
    child.send("\x1b[200~\n    def area(self):\n        return self.w * self.h\n\x1b[201~")
    child.sendline("")
    child.expect("tok/s")
    child.expect(">>> ")
    assert "saved 2 messages" in ask(child, f"/save {tmp_path / 'c.json'}")
    saved = json.loads((tmp_path / "c.json").read_text())["messages"]
    assert saved[0] == {"role": "user", "content": "    def area(self):\n        return self.w * self.h"}
    assert "tok/s" in ask(child, "  hi  ")
    assert "saved 4 messages" in ask(child, f"/save {tmp_path / 'c.json'}")
    assert json.loads((tmp_path / "c.json").read_text())["messages"][2]["content"] == "hi"  # one line: stripped
    child.sendeof()
    exits_cleanly(child)


def test_draft_takes_a_home_relative_path_and_load_refuses_what_the_template_cannot_go_on_from(tiny, env, tmp_path):
    (tmp_path / "strict.jinja").write_text(STRICT)
    os.makedirs(tmp_path / "m")
    os.symlink(tiny["draft"], tmp_path / "m" / "d.gguf")  # HOME is tmp_path
    child = chat(tiny, env, "--max-tokens", "4", "--chat-template-file", str(tmp_path / "strict.jinja"))
    out = ask(child, "/draft ~/m/d.gguf")
    assert "error" not in out and "drafter" in ask(child, "/stats"), out
    assert "d.gguf" in ask(child, "/stats")
    # a conversation that ends with the user's message: the next message would be refused by the template
    (tmp_path / "user_last.json").write_text(json.dumps([{"role": "user", "content": "What is 2+2?"}]))
    out = ask(child, f"/load {tmp_path / 'user_last.json'}")
    assert "refuses a message after this conversation" in out and "ends with the user's message" in out, out
    assert "conversation: 0 messages" in ask(child, "/stats")
    assert "tok/s" in ask(child, "hello")  # the chat goes on
    assert "conversation: 2 messages" in ask(child, "/stats")
    child.sendeof()
    exits_cleanly(child)


def test_piped_messages_with_a_terminal_for_output_get_no_readline_markers(tiny, env):
    """input() reads without readline when stdin is not a terminal: the prompt's \\001..\\002 were written raw."""
    line = " ".join([sys.executable, *cli_args(tiny, "chat", "--max-tokens", "4")])
    child = pexpect.spawn("bash", ["-c", f"printf 'hi\\nthere\\n' | {line}"], env=dict(env, TERM="xterm"),
                          encoding="utf-8", timeout=120)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and child.before.count("tok/s") == 2, child.before[-500:]
    assert "\x01" not in child.before and "\x02" not in child.before and "\x1b[1m" in child.before


def test_escape_sequences_in_a_reply_are_shown_not_obeyed_on_a_terminal(tiny, env, tmp_path):
    """A reply is written to the terminal as it comes: an ESC sequence in it (a prompt can ask a model for one)
    set colours, the window title or the clipboard (OSC 52). On a terminal it is shown as cat -v shows it; piped,
    stdout is exactly the reply."""
    (tmp_path / "esc.gbnf").write_text('root ::= "\\x1b[31mred\\x1b]52;c;eA==\\x07"\n')
    args = ["generate", "hi", "--raw", "--grammar", str(tmp_path / "esc.gbnf"), "--max-tokens", "40"]
    piped = subprocess.run([sys.executable, *cli_args(tiny, *args)], env=env, capture_output=True, text=True,
                           timeout=120)
    assert piped.returncode == 0 and piped.stdout == "\x1b[31mred\x1b]52;c;eA==\x07", piped
    child = pexpect.spawn(sys.executable, cli_args(tiny, *args), env=dict(env, TERM="xterm"), encoding="utf-8",
                          timeout=120)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "^[[31mred^[]52;c;eA==^G" in child.before and "\x1b]52" not in child.before
