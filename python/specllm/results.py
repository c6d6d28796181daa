"""Structured results: what generate() returns and what stream() yields."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple


MIN_PLAIN_STEPS = 3  # Stats.speedup: undrafted steps needed to time plain decoding in the generation itself


@dataclass
class Stats:
    n_prompt: int = 0          # prompt tokens
    n_cached: int = 0          # prompt tokens reused from the KV cache of an earlier call
    n_restored: int = 0        # of them, from a state the prompt cache saved (LLM(prompt_cache_mb=...))
    n_shifted: int = 0         # of them, moved from later in the cache (cache_reuse=n)
    restored_from_disk: bool = False  # that state was read from LLM(prompt_cache_dir=...)
    n_generated: int = 0       # tokens generated
    n_steps: int = 0           # target verify calls
    n_drafted: int = 0         # draft tokens proposed
    n_accepted: int = 0        # draft tokens accepted
    n_ngram_steps: int = 0     # steps drafted by n-gram lookup
    n_memory_steps: int = 0    # of them, drafted from the memory of earlier outputs
    n_grammar_steps: int = 0   # steps that drafted the text a grammar forces next (keys, punctuation)
    n_verify_rows: int = 0     # rows the target decoded to verify (exact mode skips chunks after a rejection)
    n_pad_rows: int = 0        # filler rows decoded beside them: a batch padded to a size the profile found cheaper
    prefill_ms: float = 0.0    # prompt processing (target and draft)
    draft_ms: float = 0.0      # drafting
    verify_ms: float = 0.0     # the target's batched decodes
    sample_ms: float = 0.0     # verification arithmetic (argmax, rejection sampling)
    generate_ms: float = 0.0   # wall time of generation, prefill excluded
    n_plain_steps: int = 0     # steps that drafted nothing: plain decoding steps, timed in this generation ...
    plain_steps_ms: float = 0.0  # ... their wall time
    seed: int = 0              # the sampling seed used (drawn when none was given)
    k_histogram: Dict[int, int] = field(default_factory=dict)    # draft length -> steps
    acceptance_by_position: List[float] = field(default_factory=list)  # P(accept) at draft position i

    @property
    def acceptance_rate(self) -> float:
        return self.n_accepted / self.n_drafted if self.n_drafted else 0.0

    @property
    def mean_accepted_per_step(self) -> float:
        return self.n_accepted / self.n_steps if self.n_steps else 0.0

    @property
    def mean_draft_length(self) -> float:
        return self.n_drafted / self.n_steps if self.n_steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return 1000.0 * self.n_generated / self.generate_ms if self.generate_ms > 0 else 0.0

    @property
    def speedup(self) -> float:
        """Estimated speed-up over plain decoding of this generation: plain decoding takes a step per token the
        target produced (the accepted drafts and one per step, an end-of-turn token included), each at the mean
        wall time of this generation's own steps that drafted nothing, so a busy machine slows both sides alike.
        0.0 when fewer than MIN_PLAIN_STEPS steps drafted nothing (no live measure of plain decoding)."""
        if self.n_plain_steps < MIN_PLAIN_STEPS or self.generate_ms <= 0:
            return 0.0
        return (self.n_steps + self.n_accepted) * (self.plain_steps_ms / self.n_plain_steps) / self.generate_ms

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        for k in ("acceptance_rate", "mean_accepted_per_step", "mean_draft_length", "tokens_per_second", "speedup"):
            d[k] = getattr(self, k)
        return d

    @classmethod
    def from_core(cls, s) -> "Stats":
        return cls(
            n_prompt=s.n_prompt, n_cached=s.n_cached, n_restored=s.n_restored, n_shifted=s.n_shifted,
            restored_from_disk=s.restored_from_disk,
            n_generated=s.n_generated, n_steps=s.n_steps,
            n_drafted=s.n_drafted, n_accepted=s.n_accepted, n_ngram_steps=s.n_ngram_steps,
            n_memory_steps=s.n_memory_steps, n_grammar_steps=s.n_grammar_steps,
            n_verify_rows=s.n_verify_rows,
            n_pad_rows=s.n_pad_rows,
            prefill_ms=s.prefill_ms, draft_ms=s.draft_ms, verify_ms=s.verify_ms, sample_ms=s.sample_ms,
            generate_ms=s.generate_ms, n_plain_steps=s.n_plain_steps, plain_steps_ms=s.plain_steps_ms, seed=s.seed,
            k_histogram={k: n for k, n in enumerate(s.k_hist) if n},
            acceptance_by_position=[a / d for a, d in zip(s.n_accepted_at, s.n_drafted_at) if d],
        )


@dataclass
class TokenLogprob:
    """An emitted token's log-probability under the target model (log_softmax of its raw logits: temperature 1,
    no top-k/top-p/min-p, whatever the sampling options) and the most likely tokens at its position."""
    token: int
    logprob: float
    top: List[Tuple[int, float]] = field(default_factory=list)  # (token, logprob), most likely first

    @classmethod
    def from_core(cls, entries) -> List["TokenLogprob"]:
        return [cls(t, lp, [(a, b) for a, b in top]) for t, lp, top in entries]


@dataclass
class Chunk:
    """A piece of a stream: the text and tokens committed by one speculative step."""
    text: str
    tokens: List[int]
    n_drafted: int = 0
    n_accepted: int = 0
    finish_reason: Optional[str] = None  # set on the last chunk: "stop", "length" or "cancelled"
    stats: Optional[Stats] = None        # set on the last chunk
    logprobs: Optional[List[TokenLogprob]] = None  # one per token, when asked for (logprobs=n)
    # on the first chunk, when asked for (prompt_logprobs=n): one per prompt token, None for the first
    prompt_logprobs: Optional[List[Optional[TokenLogprob]]] = None


@dataclass
class Completion:
    text: str
    tokens: List[int]
    finish_reason: str  # "stop" (end of generation or a stop string), "length" (max_tokens) or "cancelled"
    stats: Stats
    logprobs: Optional[List[TokenLogprob]] = None  # one per token, when asked for (logprobs=n)
    # one per prompt token when asked for (prompt_logprobs=n): the first None (nothing before it to score it by),
    # then each token's log-probability after the tokens before it, with the n most likely tokens there
    prompt_logprobs: Optional[List[Optional[TokenLogprob]]] = None
