"""The state of a terminal chat: the loaded models, the conversation and the session totals. No terminal I/O here
(cli.py draws the screen), so it is testable without a terminal.

Each turn re-sends the whole conversation; the LLM reuses the KV cache of the common prefix, so only the new turn
is evaluated. A reply stopped early is kept in the conversation as what the assistant said.
"""
from __future__ import annotations

import contextlib
import json
import os
import stat
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

from . import files
from .errors import ContextOverflowError, InvalidOptionError
from .llm import DEFAULT, LLM, default_draft
from .options import path as _path
from .options import text as _text
from .results import Stats

MAX_LOAD_BYTES = 64 << 20  # a saved conversation is text a context holds: ~1 MB for 128k tokens

_SUMMED = ("n_prompt", "n_cached", "n_generated", "n_steps", "n_drafted", "n_accepted", "n_ngram_steps",
           "prefill_ms", "draft_ms", "verify_ms", "sample_ms", "generate_ms", "n_plain_steps", "plain_steps_ms")


def add_stats(total: Stats, s: Stats) -> None:
    """Add the counts and times of s into total (acceptance_by_position cannot be summed: it is left alone)."""
    for name in _SUMMED:
        setattr(total, name, getattr(total, name) + getattr(s, name))
    for k, n in s.k_histogram.items():
        total.k_histogram[k] = total.k_histogram.get(k, 0) + n


@dataclass
class Reply:
    text: str
    stats: Stats               # of this reply (a stopped one's from the engine; from its chunks, wall clock, if
    #                            the engine had none)
    finish_reason: str         # "stop", "length" or "interrupted"
    context_full: bool = False  # cut short because the context window has no more room


class ChatSession:
    def __init__(self, model: str, draft=DEFAULT, *, ngram: Optional[bool] = None, system: Optional[str] = None,
                 llm_options: Optional[dict] = None, gen_options: Optional[dict] = None):
        """model, draft and llm_options go to LLM(...); gen_options (max_tokens, temperature, draft_length, seed)
        to every llm.chat(...). ngram: whether a draft model (now or after /draft) drafts with n-gram lookup
        beside it (hybrid); None (default) = yes."""
        self.model = os.fspath(model)
        self.ngram = ngram is not False
        self.llm_options = dict(llm_options or {})
        self.gen_options = dict(gen_options or {})
        self.max_tokens = self.gen_options.pop("max_tokens", 1024)
        self.system = system
        self.turns: List[Dict[str, str]] = []  # user and assistant messages, the system prompt apart
        self.totals = Stats()
        self.n_replies = 0
        self.n_stopped = 0  # replies stopped early whose stats were counted from chunks, without prompt or prefill
        self.n_from_disk = 0  # prompt tokens read back from LLM(prompt_cache_dir=...)
        self.llm = LLM(self.model, draft, ngram=self.ngram, **self.llm_options)
        if self._system is not None:
            self.set_system(self._system)  # --system that the template refuses: said now, not at every message
        # The draft model that "/draft on" brings back: the one asked for, else the registry's default.
        self.draft_model = self._draft_model(self.llm.draft) or self._draft_model(DEFAULT)

    def _draft_model(self, draft) -> Optional[str]:
        if draft == DEFAULT:
            draft = default_draft(self.model)
        return draft if draft not in (None, "ngram") else None

    # --- what is loaded
    @property
    def draft_label(self) -> str:
        """"none", "ngram", or the draft model (with "+ngram" when hybrid)."""
        draft = self.llm.draft
        if draft is None or draft == "ngram":
            return str(draft).lower()
        return os.path.basename(draft) + (" +ngram" if self.llm.hybrid else "")

    @property
    def n_ctx(self) -> int:
        return self.llm.n_ctx

    def set_draft(self, draft: Optional[str]) -> None:
        """Another drafter ("ngram", None, a name or a path) for the same target, whose KV cache stays: the
        conversation goes on without evaluating its prefix again. If the new drafter cannot be loaded, the old
        one stays."""
        try:
            self.llm.set_draft(draft, ngram=self.ngram)
        finally:  # Ctrl-C during the load is raised once the new drafter is in place
            if self.llm.draft == draft and draft not in (None, "ngram"):
                self.draft_model = draft

    # --- the conversation
    def messages(self) -> List[Dict[str, str]]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + self.turns

    def n_tokens(self, messages=None) -> int:
        """Tokens of the conversation as the next prompt (at most one too many: a BOS the template may hold)."""
        messages = self.messages() if messages is None else messages
        if not messages:
            return 0
        return len(self.llm.tokenize(self.llm.apply_chat_template(messages, add_generation_prompt=True)))

    @property
    def system(self) -> Optional[str]:
        return self._system

    @system.setter
    def system(self, value: Optional[str]) -> None:
        """InvalidOptionError for text with no UTF-8 form (a lone surrogate), which no reply or save could take."""
        self._system = None if value is None else _text("the system prompt", value)

    def set_system(self, value: Optional[str]) -> None:
        """The system prompt (None: none), refused (InvalidOptionError, the old one kept) when the chat template
        refuses it (Gemma's: "System role not supported") or it leaves no room in the context for a message and a
        reply: taken, either failed every message after it (the second as if the message were too long)."""
        before = self._system
        self.system = value
        if value is not None:
            probe = [{"role": "system", "content": value}, {"role": "user", "content": "x"}]
            try:
                n = self.n_tokens(probe)
            except InvalidOptionError as e:
                self._system = before
                raise InvalidOptionError(f"the model's chat template takes no such system prompt: {e}") from None
            if n >= self.n_ctx:
                self._system = before
                raise InvalidOptionError(f"the system prompt is {n} tokens with a one-word message, more than the "
                                         f"context window (n_ctx={self.n_ctx}) holds with a reply: shorten it, or "
                                         f"use a larger context")

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays). The drafting memory and the prompt states on disk stay
        too (LLM.reset(), which this called, empties a --memory-file and removes every state of the model in
        --prompt-cache-dir, other processes' too); the next reply's prompt reuses the cached system prompt."""
        self.turns.clear()

    def forget_memory(self) -> int:
        """Forget the drafting memory (LLM.clear_memory: earlier replies, and what "auto" learned from them; a
        memory_file is emptied too); the conversation stays. The number of tokens it held."""
        n = self.llm.memory_size
        self.llm.clear_memory()
        return n

    def save(self, path: str) -> None:
        """Write the conversation (the system prompt and the messages, as JSON) to path atomically, for load()."""
        path = _path("the file", os.fspath(path))
        body = json.dumps({"specllm_chat": 1, "system": self.system, "messages": self.turns}, ensure_ascii=False,
                          indent=1)
        try:
            files.write_atomic(path, body.encode("utf-8"))
        except OSError as e:
            raise InvalidOptionError(f"cannot save the conversation to {path}: {e.strerror or e}") from None

    def load(self, path: str) -> None:
        """Replace the conversation with one save() wrote (or an OpenAI-style list of messages: system, user and
        assistant, with string contents). The next reply sends it whole: with LLM(prompt_cache_dir=...) a
        conversation this model had before is read back instead of decoded. InvalidOptionError (the conversation
        unchanged) for a file that is not one."""
        path = _path("the file", os.fspath(path))
        try:
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO hung the chat, /dev/zero filled the memory
                raise InvalidOptionError(f"cannot read {path}: not a regular file; give a file /save wrote")
            with open(path, encoding="utf-8-sig") as f:  # an editor's byte order mark was "not JSON"
                if os.fstat(f.fileno()).st_size > MAX_LOAD_BYTES:
                    raise InvalidOptionError(f"{path} is not a saved conversation: larger than "
                                             f"{MAX_LOAD_BYTES >> 20} MiB, more than any context holds")
                data = json.load(f)
        except OSError as e:
            raise InvalidOptionError(f"cannot read {path}: {e.strerror or e}") from None
        except InvalidOptionError:  # said above (a ValueError too: not "not JSON")
            raise
        except (ValueError, RecursionError) as e:
            raise InvalidOptionError(f"{path} is not a saved conversation (not JSON: {e})") from None
        system, messages = None, data
        if isinstance(data, dict):
            system, messages = data.get("system"), data.get("messages")
        if isinstance(messages, list) and messages and isinstance(messages[0], dict) and \
                messages[0].get("role") == "system" and system is None:
            system, messages = messages[0].get("content"), messages[1:]
        ok = isinstance(messages, list) and (system is None or isinstance(system, str)) and all(
            isinstance(m, dict) and m.get("role") in ("user", "assistant") and isinstance(m.get("content"), str)
            for m in messages)
        if not ok:
            raise InvalidOptionError(f"{path} is not a saved conversation: expected {{\"system\": ..., \"messages\": "
                                     f"[{{\"role\": \"user\" or \"assistant\", \"content\": TEXT}}, ...]}} "
                                     f"(what /save writes) or a list of such messages")
        for i, m in enumerate(messages):  # a "\udce9" escape in the file: text that cannot be sent or saved
            _text(f"{path}: message {i + 1}", m["content"])
        before = self._system, self.turns
        try:
            self.set_system(system or None)  # one the chat template refuses: said now, not at every message
            self.turns = [{"role": m["role"], "content": m["content"]} for m in messages]
            try:  # the next message must be takeable: a file ending with a user message broke Gemma's template
                self.n_tokens(self.messages() + [{"role": "user", "content": "x"}])  # (roles must alternate)
            except InvalidOptionError as e:
                last = " (it ends with the user's message: add the reply, or leave that message out)" if \
                    self.turns and self.turns[-1]["role"] == "user" else ""
                raise InvalidOptionError(f"{path}: the model's chat template refuses a message after this "
                                         f"conversation{last}: {e}") from None
            n = self.n_tokens()
            if n >= self.n_ctx:  # taken, the next message failed with "context full"
                raise InvalidOptionError(f"{path}: the conversation is {n} tokens, more than the context window "
                                         f"(n_ctx={self.n_ctx}) holds with a reply; load it with a larger context")
        except BaseException:
            self._system, self.turns = before
            raise

    def reply(self, text: str, on_text: Callable[[str], None] = lambda s: None,
              stop_requested: Callable[[], bool] = lambda: False) -> Reply:
        """Add the user's message, stream the reply through on_text and add it. stop_requested is polled after
        each chunk: when true, the reply stops there and is kept (finish_reason "interrupted").
        On an error the conversation is left as it was before (message and partial reply dropped)."""
        self.turns.append({"role": "user", "content": text})
        parts: List[str] = []
        partial = Stats()
        final = None
        try:
            n_prompt = self.n_tokens()
            room = self.n_ctx - n_prompt
            if room < 1:
                raise ContextOverflowError(
                    f"the conversation ({n_prompt} tokens) fills the context window (n_ctx={self.n_ctx})")
            max_tokens = min(self.max_tokens, room)
            t0 = time.perf_counter()
            stream = self.llm.chat(self.messages(), stream=True, max_tokens=max_tokens, **self.gen_options)
            with contextlib.closing(stream):
                for chunk in stream:
                    parts.append(chunk.text)
                    on_text(chunk.text)
                    if chunk.stats is not None:
                        final = chunk
                        break
                    partial.n_generated += len(chunk.tokens)
                    partial.n_drafted += chunk.n_drafted
                    partial.n_accepted += chunk.n_accepted
                    partial.n_steps += 1
                    partial.k_histogram[chunk.n_drafted] = partial.k_histogram.get(chunk.n_drafted, 0) + 1
                    if stop_requested():
                        break
            partial.generate_ms = 1000 * (time.perf_counter() - t0)  # with the prompt's time (the engine's: without)
            if final is None and stream.stats is not None and stream.stats.n_generated == partial.n_generated > 0:
                partial = stream.stats  # the stopped generation's own (its speed without the prompt's time)
        except BaseException:
            del self.turns[-1]
            raise
        reply_text = "".join(parts)
        if reply_text or final is not None:
            self.turns.append({"role": "assistant", "content": reply_text})
        else:
            del self.turns[-1]  # stopped before a word: forget the question too (two user turns in a row break
            # the strict templates)
        if final is not None:
            stats, reason = final.stats, final.finish_reason
        else:
            stats, reason = partial, "interrupted"
            self.n_stopped += not partial.n_prompt  # counted from its chunks: no prompt tokens, no prefill time
        self.n_replies += 1
        add_stats(self.totals, stats)
        self.n_from_disk += stats.n_restored if stats.restored_from_disk else 0
        return Reply(reply_text, stats, reason, context_full=(reason == "length" and max_tokens < self.max_tokens))

    def summary(self) -> str:
        """The session's totals and the conversation's size, as lines of text for /stats."""
        t, n = self.totals, self.n_replies
        lines = [f"{n} repl{'y' if n == 1 else 'ies'}, {t.n_generated} tokens in {t.generate_ms / 1000:.1f} s "
                 f"({t.tokens_per_second:.1f} tok/s)"]
        if t.n_drafted:
            lines.append(f"drafted {t.n_drafted}, accepted {t.n_accepted} ({t.acceptance_rate:.0%}); mean draft "
                         f"length {t.mean_draft_length:.2f}; {t.n_steps} steps, "
                         f"{t.n_generated / max(t.n_steps, 1):.2f} tokens/step")
            lines.append("steps by draft length: " + ", ".join(f"{k}:{c}" for k, c in sorted(t.k_histogram.items())))
            if t.speedup:
                lines.append(f"about {t.speedup:.2f}x plain decoding (its step timed on the {t.n_plain_steps} steps "
                             "that drafted nothing)")
        stopped = f" (not counting {self.n_stopped} stopped)" if self.n_stopped else ""
        disk = f" ({self.n_from_disk} read from --prompt-cache-dir)" if self.n_from_disk else ""
        lines.append(f"prompts {t.n_prompt} tokens, {t.n_cached} reused from the cache{disk}; prefill "
                     f"{t.prefill_ms / 1000:.1f} s{stopped}")
        n = len(self.turns)
        lines.append(f"conversation: {n} message{'' if n == 1 else 's'}, {self.n_tokens()} of {self.n_ctx} tokens; "
                     f"drafter: {self.draft_label}")
        return "\n".join(lines)
