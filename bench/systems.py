"""The systems under test: one small class each, with a common load() / run(prompt_text, max_tokens) -> Result.

specllm systems are data (SPECLLM_SYSTEMS): a new configuration joins the benchmark with one line.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass

from bench import anchors

# the Xeon VM's fast-mode pair profile (qwen2.5-coder 1.5b + 0.5b, 2 threads) as measured on 2026-11-27 while other
# work ran beside it: T(1) 15% dearer, batches 10-20% cheaper than quiet (T(2) = 1.23 T(1), quiet 1.56), plausible, so
# it was kept and used until 2026-11-28; the "busy-profile" systems draft with it, to measure what such a profile costs
BUSY_XEON_PAIR = [100.4, 123.1, 149.2, 147.8, 181.7, 204.5, 280.5, 252.6, 296.2, 324.6, 338.7, 322.7, 342.7, 393.6,
                  439.2, 326.6, 0.0, 0.0, 0.0, 406.4, 0.0, 0.0, 0.0, 526.7, 0.0, 0.0, 0.0, 558.4, 0.0, 0.0, 0.0, 585.2,
                  0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 769.3, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 832.9]

# name -> (draft, draft_length[, more specllm.LLM keyword arguments]); "{draft}" is the --draft model path,
# draft_length None leaves generate()'s default
SPECLLM_SYSTEMS = {
    "plain": (None, None),
    "draft-k3": ("{draft}", 3, {"ngram": False}),  # the draft model alone (a draft model is hybrid by default)
    "auto": ("{draft}", "auto", {"ngram": False}),
    "ngram": ("ngram", "auto"),
    "ngram-k3": ("ngram", 3),  # the best fixed k for the n-gram drafter in bench.simulate-style replays (k = 2-3)
    "hybrid": ("{draft}", "auto", {"ngram": True}),
    # the default (exact=False) spelled out: llama.cpp's CPU batch kernels allowed (cheaper long verify batches;
    # output may differ from plain on near-ties)
    "hybrid-fast": ("{draft}", "auto", {"ngram": True, "exact": False}),
    # exact mode (exact=True): greedy output equal to plain decoding on short contexts (verify chunks of <= 3 rows);
    # and plain decoding with exact=True, which is the same as plain (both load repacked weights)
    "hybrid-exact": ("{draft}", "auto", {"ngram": True, "exact": True}),
    "plain-exact": (None, None, {"exact": True}),
    # the default without the drafting memory (memory on: earlier prompts' outputs, never the same prompt's)
    "hybrid-nomem": ("{draft}", "auto", {"ngram": True, "memory_tokens": 0}),
    # the default drafting also from a memory match whose key the memory continues in more than one way: the
    # default until 2026-11-28
    "hybrid-ambiguous": ("{draft}", "auto", {"ngram": True, "engine": {"memory_ambiguous_drafts": True}}),
    "hybrid-fast-nomem": ("{draft}", "auto", {"ngram": True, "exact": False, "memory_tokens": 0}),
    # the default as before 2026-11-25: "auto" not told where a proposal crosses the end of a sentence (settings
    # under "engine" are Engine setters applied after the load)
    "hybrid-noboundary": ("{draft}", "auto", {"ngram": True, "engine": {"sentence_boundaries": False}}),
    # verify batches costed with the profile's shape and one level learned from every step: the default before
    # 2026-11-26 and again since 2026-11-26's "no timing in the choices"; kept for the runs that name it
    "hybrid-noshape": ("{draft}", "auto", {"ngram": True, "engine": {"learn_batch_costs": False}}),
    # also a factor per batch size learned from the verify batches' timing: the default on 2026-11-26 until then
    "hybrid-learn": ("{draft}", "auto", {"ngram": True, "engine": {"learn_batch_costs": True}}),
    # the default drafting with the Xeon VM's pair profile measured while the machine was busy (BUSY_XEON_PAIR)
    "hybrid-busy-profile": ("{draft}", "auto", {"ngram": True, "engine": {"verify_costs": BUSY_XEON_PAIR}}),
    # KV caches of 8 bits (K and V), and K of 8 bits with V of 4 (a K cache below 8 bits breaks Qwen2.5-Coder's
    # answers: bench.kv_cache); flash attention, llama.cpp's choice on a CPU: plain and the default
    "plain-q8": (None, None, {"cache_type_k": "q8_0", "cache_type_v": "q8_0"}),
    "hybrid-q8": ("{draft}", "auto", {"ngram": True, "cache_type_k": "q8_0", "cache_type_v": "q8_0"}),
    "plain-k8v4": (None, None, {"cache_type_k": "q8_0", "cache_type_v": "q4_0"}),
    "hybrid-k8v4": ("{draft}", "auto", {"ngram": True, "cache_type_k": "q8_0", "cache_type_v": "q4_0"}),
}
# llama.cpp-ngram: --spec-type ngram-simple; -ngram-cache and -ngram-mod: llama.cpp's n-gram cache and its
# rolling-hash pool (llama.cpp's defaults for each); llama.cpp-q8: llama-completion with -ctk q8_0 -ctv q8_0
LLAMA_CPP_PLAIN = {"llama.cpp": [], "llama.cpp-q8": ["-ctk", "q8_0", "-ctv", "q8_0"]}
LLAMA_CPP_SYSTEMS = ("llama.cpp", "llama.cpp-draft-k3", "llama.cpp-ngram", "llama.cpp-ngram-cache",
                     "llama.cpp-ngram-mod", "llama.cpp-q8")
LLAMA_CPP_PYTHON_SYSTEMS = ("llama-cpp-python", "llama-cpp-python-lookup")
ALL_SYSTEMS = tuple(SPECLLM_SYSTEMS) + LLAMA_CPP_SYSTEMS + LLAMA_CPP_PYTHON_SYSTEMS
# llama-cpp-python's README: "num_pred_tokens ... 10 is the default and generally good for gpu, 2 performs better
# for cpu-only machines"
LOOKUP_NUM_PRED_TOKENS = 10 if os.environ.get("SPECLLM_BENCH_GPU") else 2


def apply_engine_settings(llm, settings: dict) -> None:
    """A system's "engine" settings: Engine setters (set_<name>) applied after the load. Verify costs set so are the
    LLM's profile's too, so that its steps judge those (profile.mark_if_stale), not the files of the machine's."""
    for name, value in settings.items():
        getattr(llm._engine, "set_" + name)(value)
        if name == "verify_costs" and llm.profile is not None:
            llm._costs.profile = dict(llm.profile, verify_ms=list(value))


@dataclass
class Result:
    text: str                   # generated text (no prompt)
    n_gen: int                  # generated tokens
    gen_tps: float              # generation tokens per second, prompt processing excluded
    prompt_ms: float            # prompt processing time
    n_drafted: int = 0          # draft tokens proposed for verification
    n_accepted: int = 0         # draft tokens accepted
    n_steps: int = 0            # target verification steps (one per emitted chunk)
    load_ms: float | None = None  # model load time, for systems that load per run (the llama.cpp tools)


@dataclass
class Config:
    target: str                 # target model path
    draft: str                  # draft model path
    n_ctx: int = 4096
    n_threads: int = 2
    temperature: float = 0.0
    repeat_penalty: float = 1.0  # specllm systems only (over the last 64 tokens, as llama-server's)


class SpecllmSystem:
    def __init__(self, name: str, cfg: Config):
        draft, self.draft_length, *extra = SPECLLM_SYSTEMS[name]
        self.name, self.cfg, self.llm_kwargs = name, cfg, dict(extra[0] if extra else {})
        self.engine_settings = self.llm_kwargs.pop("engine", {})
        self.draft = draft.format(draft=cfg.draft) if draft else None
        self.llm = None
        # (prompt, the drafting memory and what "auto" had learned before its first run)
        self._memory_for = (None, None, None)

    def load(self) -> float:
        import specllm

        t0 = time.perf_counter()
        self.llm = specllm.LLM(self.cfg.target, draft=self.draft, n_ctx=self.cfg.n_ctx, n_threads=self.cfg.n_threads,
                               **self.llm_kwargs)
        apply_engine_settings(self.llm, self.engine_settings)
        return (time.perf_counter() - t0) * 1e3

    def run(self, prompt_text: str, max_tokens: int, keep_cache: bool = False) -> Result:
        steps = self.steps(prompt_text, max_tokens, keep_cache)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def steps(self, prompt_text: str, max_tokens: int, keep_cache: bool = False):
        """run() one speculative step at a time: yields after each step, returns the Result (bench.run --lockstep
        advances several systems' generators in turn)."""
        if not keep_cache:
            # the KV cache goes (every prompt is evaluated whole); the drafting memory of earlier prompts stays, as
            # in a server, but a prompt run again (rounds) finds the memory as it was before its first run, never
            # its own earlier answer, and "auto" as it was then: the memory's acceptance estimates carry over from
            # one prompt to the next, and a round after the first would otherwise start from what the prompt's own
            # earlier round taught them (rounds repeat a measurement; they are not a user asking again)
            self.llm.reset(keep_memory=True)
            prompt, before, policy = self._memory_for
            if prompt == prompt_text:
                self.llm._engine.set_memory(before)
                self.llm._engine.set_policy_state(policy)
            else:
                self._memory_for = (prompt_text, self.llm._engine.memory(), self.llm._engine.policy_state())
        kwargs = {} if self.draft_length is None else {"draft_length": self.draft_length}
        if self.cfg.repeat_penalty != 1.0:
            kwargs["repeat_penalty"] = self.cfg.repeat_penalty
        parts, s, finish = [], None, None
        with self.llm.stream(prompt_text, max_tokens=max_tokens, temperature=self.cfg.temperature, **kwargs) as stream:
            for chunk in stream:
                parts.append(chunk.text)
                if chunk.finish_reason is not None:
                    s, finish = chunk.stats, chunk.finish_reason
                    break
                yield
        s = s or stream.stats
        return Result("".join(parts), s.n_generated, counted_rate(s, finish), s.prefill_ms, s.n_drafted,
                      s.n_accepted, s.n_steps)


def counted_rate(stats, finish_reason) -> float:
    """tokens/s as the llama.cpp tools count them: an answer that ends on its own counts its end-of-generation
    token, whose step is timed (llama-speculative-simple counts it in n_predict; llama-completion's runs are one
    decode per text token, specllm's steps one more, as its first decodes the prompt's last token). Counted as
    Stats.tokens_per_second (n tokens over n + 1 steps), a short answer read ~10% slower against llama.cpp than it
    ran (a reviewer: 8 tokens, 25.6 decodes/s both, llama.cpp 1.10x plain)."""
    if stats.generate_ms <= 0:
        return stats.tokens_per_second
    return (stats.n_generated + (finish_reason == "stop")) / stats.generate_ms * 1e3


class LlamaCppPythonSystem:
    """llama-cpp-python's Llama, plain or with its prompt-lookup draft model."""

    def __init__(self, name: str, cfg: Config):
        self.name, self.cfg, self.lookup = name, cfg, name.endswith("-lookup")
        self.llm = self.draft_model = None

    def load(self) -> float:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        from specllm.amx import guard_llama_cpp_python

        class CountingLookup(LlamaPromptLookupDecoding):
            n_calls = n_proposed = 0

            def __call__(self, input_ids, /, **kwargs):
                out = super().__call__(input_ids, **kwargs)
                self.n_calls, self.n_proposed = self.n_calls + 1, self.n_proposed + len(out)
                return out

        self.draft_model = CountingLookup(num_pred_tokens=LOOKUP_NUM_PRED_TOKENS) if self.lookup else None
        t0 = time.perf_counter()
        # logits_all with a draft model: llama-cpp-python 0.3.36 forces it on for decoding but sizes its score
        # buffer by the argument, so without it any position past n_batch (512) fails to store its logits
        guard_llama_cpp_python()  # as specllm loads where llama.cpp offers AMX (specllm/amx.py)
        self.llm = Llama(self.cfg.target, n_ctx=self.cfg.n_ctx, n_threads=self.cfg.n_threads,
                         n_threads_batch=self.cfg.n_threads, draft_model=self.draft_model, logits_all=self.lookup,
                         flash_attn=True, seed=0, verbose=False)  # specllm's flash_attn="auto" on a CPU: the same
        # attention kernels (llama-cpp-python's default, off, read 1.9x plain on a tiny model's 2k-token prompts)
        return (time.perf_counter() - t0) * 1e3

    def run(self, prompt_text: str, max_tokens: int, keep_cache: bool = False) -> Result:
        import llama_cpp

        if not keep_cache:
            self.llm.reset()
        if self.draft_model:
            self.draft_model.n_calls = self.draft_model.n_proposed = 0
        # tokenized like create_completion and the llama.cpp tools: special tokens parsed, BOS as the vocab says
        tokens = self.llm.tokenize(prompt_text.encode("utf-8"), add_bos=True, special=True)
        out, t0, t_first = [], time.perf_counter(), None
        for token in self.llm.generate(tokens, temp=self.cfg.temperature, top_k=0, top_p=1.0, min_p=0.0,
                                       repeat_penalty=1.0):  # reuses the KV prefix it still holds
            if t_first is None:
                t_first = time.perf_counter()
            if llama_cpp.llama_token_is_eog(self.llm._model.vocab, token):
                break
            out.append(token)
            if len(out) >= max_tokens:
                break
        t_end = time.perf_counter()
        n_gen = len(out)
        gen_tps = (n_gen - 1) / (t_end - t_first) if n_gen > 1 else 0.0
        text = self.llm.detokenize(out).decode("utf-8", errors="replace")
        if not self.draft_model:
            return Result(text, n_gen, gen_tps, (t_first - t0) * 1e3, n_steps=n_gen)
        # one verification batch per draft call; every step emits its accepted drafts plus one token (estimate:
        # llama-cpp-python does not count acceptances)
        n_steps = min(max(self.draft_model.n_calls, 1), n_gen)
        return Result(text, n_gen, gen_tps, (t_first - t0) * 1e3, self.draft_model.n_proposed,
                      max(n_gen - n_steps, 0), n_steps)


class LlamaCppToolSystem:
    """llama.cpp's own tools, one process per prompt: llama-completion (plain) or llama-speculative-simple."""

    def __init__(self, name: str, cfg: Config):
        self.name, self.cfg = name, cfg
        self.paths = None

    def load(self) -> float:
        self.paths = anchors.build_anchors()
        return 0.0  # each run loads the model; its load time is in Result.load_ms

    def command(self, prompt_file: str, max_tokens: int) -> list[str]:
        c = self.cfg
        common = dict(model=c.target, prompt_file=prompt_file, n_ctx=c.n_ctx, n_threads=c.n_threads,
                      temperature=c.temperature)
        if self.name in LLAMA_CPP_PLAIN:
            return anchors.completion_cmd(self.paths["llama-completion"], n_predict=max_tokens,
                                          **common) + LLAMA_CPP_PLAIN[self.name]
        spec = {"llama.cpp-draft-k3": ("draft-simple", c.draft), "llama.cpp-ngram": ("ngram-simple", None),
                "llama.cpp-ngram-cache": ("ngram-cache", None), "llama.cpp-ngram-mod": ("ngram-mod", None)}[self.name]
        return anchors.speculative_cmd(self.paths["llama-speculative-simple"], spec_type=spec[0], draft=spec[1],
                                       n_draft=3, max_tokens=max_tokens, **common)

    def run(self, prompt_text: str, max_tokens: int, keep_cache: bool = False) -> Result:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8", delete=False) as f:
            f.write(anchors.prompt_file_text(prompt_text))
        try:
            cmd = self.command(f.name, max_tokens)
            if self.name in LLAMA_CPP_PLAIN:
                p = anchors.run_parsed(cmd, anchors.parse_completion)
            else:
                p = anchors.run_parsed(cmd, anchors.parse_speculative, prompt_text, max_tokens)
        finally:
            os.unlink(f.name)
        if self.name in LLAMA_CPP_PLAIN:
            return Result(p["text"], p["n_gen"], p["gen_tps"], p["prompt_ms"], n_steps=p["n_gen"],
                          load_ms=p["load_ms"])
        return Result(p["text"], p["n_gen"], p["gen_tps"], p["prompt_ms"], p["n_drafted"], p["n_accepted"],
                      p["n_steps"], load_ms=p["load_ms"])


def make_system(name: str, cfg: Config):
    if name in SPECLLM_SYSTEMS:
        return SpecllmSystem(name, cfg)
    if name in LLAMA_CPP_SYSTEMS:
        return LlamaCppToolSystem(name, cfg)
    if name in LLAMA_CPP_PYTHON_SYSTEMS:
        return LlamaCppPythonSystem(name, cfg)
    raise ValueError(f"unknown system {name!r}: expected one of {', '.join(ALL_SYSTEMS)}")
