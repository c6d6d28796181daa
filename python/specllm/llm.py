"""LLM: a target model, optionally a drafter, and generate / stream / chat over the C++ engine.

One LLM serializes its calls: a second caller waits until the running generation (or open stream) ends.
A stream holds the LLM until it is exhausted or closed (break out of the loop, or call .close()); it belongs to
the LLM, not to a thread (see stream.py and gate.py): any thread may advance or cancel it, and a stream nobody
advances is closed once another call has waited for it for stream_idle_timeout seconds.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import threading
import traceback
import weakref
from typing import Optional, Union

from . import _core, costs, embed, infill, logs, memory, tokens
from .exit_hooks import at_exit
from . import chat_template as chat_templates
from .errors import InvalidOptionError, SpecLLMError
from .load_options import DEFAULT, checked, check_ngram_sizes, default_draft, draft_arg  # noqa: F401 (default_draft)
from .load_options import check_found, drafter_options, model_options, resolve
from .options import FLOAT_CACHE_TYPES, _int, check_names, flag, make_options
from .options import text as _text
from .results import Completion, Stats
from .gate import Call, Gate
from .stream import Stream

from .tokens import Prompt


@contextlib.contextmanager
def _interrupt_after():
    """Ctrl-C inside the block is raised when it ends (main thread; elsewhere there is no Ctrl-C to defer)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hit = []
    previous = signal.signal(signal.SIGINT, lambda *_: hit.append(True))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if hit:
        raise KeyboardInterrupt


class LLM(tokens.TokenMethods, memory.MemoryMethods, embed.EmbedMethods, chat_templates.ChatMethods):
    """A target model and, optionally, a drafter (tokenize, detokenize and the prompt's tokens: tokens.TokenMethods;
    the drafting memory's methods: memory.MemoryMethods; the embeddings': embed.EmbedMethods; the chat template's
    and chat(): chat_template.ChatMethods)."""

    def __init__(
        self,
        model: Union[str, os.PathLike],
        draft: Union[str, os.PathLike, None] = DEFAULT,
        *,
        ngram: Optional[bool] = None,
        n_ctx: int = 4096,
        n_threads: Optional[int] = None,
        n_gpu_layers: int = -1,
        draft_n_gpu_layers: Optional[int] = None,
        seed: Optional[int] = None,
        n_batch: int = 512,
        ngram_min: int = 2,
        ngram_max: int = 4,
        profile_costs: bool = True,
        exact: bool = False,
        stream_idle_timeout: float = 10.0,
        memory_tokens: int = 32768,
        memory_file: Union[str, os.PathLike, None] = None,
        prompt_cache_mb: int = 512,
        prompt_cache_dir: Union[str, os.PathLike, None] = None,
        prompt_cache_disk_mb: int = 4096,
        learn_batch_costs: bool = False,
        embedding_model: Union[str, os.PathLike, None] = None,
        cache_type_k: str = "f16",
        cache_type_v: str = "f16",
        flash_attn: Union[str, bool] = "auto",
        chat_template: str = "",
        chat_template_kwargs: Optional[dict] = None,
    ):
        """Load a target model and, optionally, a drafter.

        model: a .gguf path or a registry name ("qwen2.5-coder-1.5b"; pulled on first use).
        draft: a .gguf path or registry name of a smaller model with the same vocabulary, "ngram" for prompt
            lookup, None for plain decoding; by default a registry target gets its known draft.
        ngram: with a draft model, also draft by n-gram lookup when it pays better (hybrid drafting); on by default
            (ngram=False: the draft model alone, as llama.cpp's speculative decoding does).
        n_gpu_layers / draft_n_gpu_layers: layers offloaded when llama-cpp-python was built with CUDA or Metal.
        seed: default sampling seed of every call (None: a fresh one per call, reported in stats.seed).
        exact: False (default): llama.cpp's fastest kernels (weight repacking; tiled K-quant matmuls for batches of
            8+ rows), whose rows differ slightly from single-token decoding, so greedy output can differ from
            plain decoding where two tokens are nearly tied (the README states how often). True: greedy output
            equal to plain decoding on short contexts: verifies in chunks of at most 3 rows (the rows llama.cpp
            computes with a single-token step's kernels), decoding a chunk only when every draft before it was
            accepted (slower on copy-heavy work).
        stream_idle_timeout: seconds a caller waits behind an open stream that nobody advances before closing it
            (an abandoned stream must not block the LLM forever).
        memory_tokens: the drafting memory: the n-gram drafter also looks up this LLM's earlier outputs (at most
            this many tokens, the oldest dropped first), so that a reply repeating an earlier one (the same JSON
            shape, code written two requests ago) is drafted; "auto" tracks its acceptance apart and does not use
            it where it does not pay. 0 = off. reset() and clear_memory() empty it; save_memory/load_memory keep
            it across processes.
        memory_file: a file that keeps the drafting memory across processes: read now if it exists (a file that is
            not one is a MemoryFileError, never overwritten), written atomically after every generation and after
            reset / clear_memory / load_memory (a failed write after a generation is logged, not raised).
        prompt_cache_mb: the prompt cache: KV states of earlier prompts (at most this many MiB of RAM, least
            recently used out first; 0 = off), so that a prompt continuing a conversation other than the last one
            reuses its prefix instead of decoding it again (an assistant asking for a title between two turns,
            interleaved agents). A state is kept when a prompt cuts 64+ tokens off the cache; reset() empties it.
        prompt_cache_dir: a directory (made if missing) that keeps prompt states across processes: after each
            generation the KV state of its prompt and reply is written there (by a thread of its own, atomically,
            unless a state there holds all but 64 of its tokens), and a prompt that shares 64+ more tokens with a
            stored state than with what is cached reads it back instead of decoding them: a long system prompt
            (an agent's tools) or a chat taken up again after a restart. At most prompt_cache_disk_mb MiB of state
            files in it, least recently used out first (~28 KiB a token for a 1.5B model). The files hold the
            conversation's tokens (mode 0600); reset() removes this model's. None (default): nothing on disk.
        learn_batch_costs: False (default): "auto" costs a verify batch as the cost profile's shape times one level
            learned from the steps, so its choices depend on the profile and the text only, never on the clock (the
            same prompt drafts alike, and in fast mode writes the same text, in every process). True: it also learns
            from the verify batches' (and a draft model's) timing what a batch of each size costs now against a plain
            step, which follows a machine whose batches and single steps slow unequally (a laptop on battery, a busy
            shared machine, a profile measured at another moment) at the price of choices that move with the timing
            (README, "What a batch costs now").
        profile_costs: True (default): measure this machine's verify costs at the first load (cached; see
            measure_costs) for "auto" to decide with. False: no measurement, and "auto" decides on placeholder costs
            in which a batch of n rows costs n plain steps, so it drafts nothing (for tests; give a fixed
            draft_length to draft).
        embedding_model: a GGUF embedding model (nomic-embed-text, bge, ...) that embed() uses, loaded now with its
            own pooling; None (default): embed() pools the target's own hidden states (a second llama.cpp context
            over the same weights, made at the first embed(): no second copy of the weights).
        cache_type_k / cache_type_v: the KV cache's types, the target's and the draft model's (llama-server's
            --cache-type-k/-v): "f16" (default), "bf16", "f32", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl".
            "q8_0" for both halves the cache's memory and a prompt state's bytes, so a long context or more cached
            prompts fit (README, "KV cache types", for what it costs in speed and output); a quantized type's block
            of 32 values must divide the model's attention head size.
        flash_attn: "auto" (default: llama.cpp's choice for the device, on for CPUs), "on" or "off"; a quantized V
            cache needs it.
        chat_template: the template chat() formats conversations with (llama-server's --chat-template): "" (default)
            the model's own; a Jinja template; or a llama.cpp built-in name ("chatml", "llama3", ...).
        chat_template_kwargs: the template's own variables for every conversation (llama-server's
            --chat-template-kwargs; e.g. {"enable_thinking": False} for Qwen3's); chat() can add more per call.
        """
        model, prompt_cache_dir, self._memory_file, kv, template = checked(
            model, n_ctx=n_ctx, n_batch=n_batch, n_gpu_layers=n_gpu_layers, draft_n_gpu_layers=draft_n_gpu_layers,
            n_threads=n_threads, ngram_min=ngram_min, ngram_max=ngram_max, memory_tokens=memory_tokens,
            memory_file=memory_file, prompt_cache_mb=prompt_cache_mb, prompt_cache_dir=prompt_cache_dir,
            prompt_cache_disk_mb=prompt_cache_disk_mb, learn_batch_costs=learn_batch_costs,
            stream_idle_timeout=stream_idle_timeout, seed=seed, exact=exact, profile_costs=profile_costs,
            cache_type_k=cache_type_k, cache_type_v=cache_type_v, flash_attn=flash_attn, chat_template=chat_template,
            chat_template_kwargs=chat_template_kwargs)
        if kv[0] not in FLOAT_CACHE_TYPES + ("q8_0",):
            logs.logger.warning("a K cache of %s (below 8 bits) breaks some models' answers (Qwen2.5-Coder's were "
                                "garbage, as with llama.cpp's own tools; README, KV cache types): q8_0 for K with a "
                                "smaller V is safer", kv[0])
        draft, ngram = draft_arg(model, draft, ngram)
        if draft not in (None, "ngram"):  # a mistyped draft said before the target's download, not after it
            check_found(draft)

        opts = _core.EngineOptions()
        opts.ngram.n_min, opts.ngram.n_max = ngram_min, ngram_max
        check_ngram_sizes(draft, ngram, opts.ngram)
        opts.target = model_options(resolve(model), n_ctx, n_threads, n_gpu_layers, n_batch, True)
        opts.target.cache_type_k, opts.target.cache_type_v, opts.target.flash_attn = kv
        on_cpu = n_gpu_layers == 0 or not _core.supports_gpu_offload()
        opts.verify_rows = _core.exact_verify_rows if exact and on_cpu else 0
        opts.memory_tokens = memory_tokens
        self._draft_n_gpu_layers = n_gpu_layers if draft_n_gpu_layers is None else draft_n_gpu_layers
        opts.draft_kind, opts.draft = drafter_options(draft, ngram, self._draft_n_gpu_layers, opts.target)
        self.model_path = opts.target.path
        self.draft = draft
        self.seed = seed
        self._model = model  # as given: a registry name finds its default draft (set_draft)
        self._opts = opts
        self._gate = Gate(float(stream_idle_timeout))
        # the interpreter's exit waits (bounded) for a load another thread runs; one that fails frees its models
        # here, inside that wait (freed by a later garbage collection as Python finalized, they crashed it)
        with costs.exit_waits():
            try:
                self._embedder = None if embedding_model is None else embed.load(
                    embedding_model, opts.target.n_threads, n_gpu_layers)  # None: the target's, made when first used
                self.embedding_model = None if self._embedder is None else self._embedder.path
                try:
                    self._engine = _core.Engine(opts)
                finally:
                    logs.drain()
                self._engine.set_learn_batch_costs(learn_batch_costs)
                self._engine.set_prompt_cache_bytes(int(prompt_cache_mb) << 20)
                if prompt_cache_dir is not None:
                    # the states' numbers depend on the model file, the kernels (exact mode, GPU), llama.cpp's version
                    numerics = f"{_core.llama_cpp_version}|verify_rows={opts.verify_rows}|gpu={not on_cpu}"
                    if kv != ("f16", "f16", -1):  # another cache's states (and their layout without flash attention)
                        numerics += "|kv={}/{}|fa={}".format(*kv)
                    try:
                        self._engine.set_prompt_store(prompt_cache_dir, int(prompt_cache_disk_mb) << 20,
                                                      _core.prompt_store_identity(self.model_path, numerics))
                    finally:
                        logs.drain()
                self._exit_hook = functools.partial(at_exit, weakref.ref(self), prompt_cache_dir is not None)
                atexit.register(self._exit_hook)  # removed by close(): 1000 LLMs made and closed kept 1000
                if self._engine.draft_kind == _core.DraftKind.none:  # a recurrent target drafts nothing (logged)
                    opts.draft_kind, draft = _core.DraftKind.none, None
                self._set_chat_template(template)
                self.last_stats: Optional[Stats] = None  # stats of the latest generation (also one closed early)
                self._costs = costs.Costs(self._engine, opts, self.model_path, profile_costs)
                self._drafter_loaded(draft, swapped=False)
                if self._memory_file is not None:
                    saved = self._memory_file.read(self._engine.target.n_vocab, keep=self._engine.memory_tokens,
                                                   vocab=self._vocab_hash())
                    if saved:
                        self._engine.set_memory(saved)
                    elif not os.path.exists(self._memory_file.path):  # one now: a place that cannot be written
                        # fails at load (an empty memory already there is not written: a read-only one failed)
                        self._memory_file.create(self._engine.target.n_vocab, self.model_path, self._vocab_hash())
            except BaseException as e:
                traceback.clear_frames(e.__traceback__)  # the frames it came through hold the engine too
                self._free()
                raise

    def set_draft(self, draft: Union[str, os.PathLike, None] = DEFAULT, *, ngram: Optional[bool] = None,
                  draft_n_gpu_layers: Optional[int] = None) -> None:
        """Change the drafter: None (plain decoding), "ngram", or a draft model's path or registry name (ngram:
        hybrid drafting, as in LLM(...)); by default the registry target's known draft. The target stays loaded
        with its KV cache, so a conversation goes on without evaluating its prefix again (except the first time
        an LLM made without a drafter gets one on a machine with no cost profile of its target yet: measuring
        the profile clears the cache). The new drafter is loaded before the old one is freed; if it cannot be
        (a typed error), the old one stays. Waits for a running generation (see stream_idle_timeout). Ctrl-C while the new drafter loads is raised once it is in place."""
        draft, ngram = draft_arg(self._model, draft, ngram)
        check_ngram_sizes(draft, ngram, self._opts.ngram)
        if draft_n_gpu_layers is not None:
            _int("draft_n_gpu_layers", draft_n_gpu_layers)
        dngl = self._draft_n_gpu_layers if draft_n_gpu_layers is None else draft_n_gpu_layers
        kind, dopts = drafter_options(draft, ngram, dngl, self._opts.target)  # may pull the model first
        with Call(self._gate), _interrupt_after():  # the swap and what says which drafter is in place are one
            try:
                self._engine.set_drafter(kind, dopts, self._opts.ngram)
            finally:
                logs.drain()
            self._opts.draft_kind, self._opts.draft = self._engine.draft_kind, dopts
            self._drafter_loaded(draft if self._engine.draft_kind != _core.DraftKind.none else None, swapped=True)

    def _drafter_loaded(self, draft, swapped: bool) -> None:
        opts = self._opts
        has_model = opts.draft_kind in (_core.DraftKind.model, _core.DraftKind.hybrid)
        self.draft = draft
        self.draft_path = opts.draft.path if has_model else None
        self._costs.drafter_loaded(self.draft_path, opts.draft_kind != _core.DraftKind.none, swapped)

    @property
    def profile(self) -> Optional[dict]:
        """The cost profile of the current drafter (None without one, or with profile_costs=False)."""
        return self._costs.profile

    @property
    def hybrid(self) -> bool:
        """Whether a draft model drafts with n-gram lookup beside it."""
        return self._opts.draft_kind == _core.DraftKind.hybrid

    def reset(self, keep_memory: bool = False) -> None:
        """Forget the cached conversation prefix (the next call evaluates its whole prompt) and, unless
        keep_memory, the drafting memory with what "auto" learned about its drafts (as in a new process)."""
        flag("keep_memory", keep_memory)  # keep_memory="no" would have kept it
        with Call(self._gate):
            self._engine.reset(keep_memory)
            self._memory_changed()

    @property
    def prompt_cache_used(self) -> int:
        """Bytes of KV states the prompt cache holds now (at most prompt_cache_mb MiB)."""
        return self._engine.prompt_cache_used

    @property
    def prompt_cache_stored(self) -> int:
        """Bytes of this model's prompt states in prompt_cache_dir (0 without one), once the writes queued are
        done."""
        self._engine.flush_prompt_store()
        return self._engine.prompt_store_bytes

    # --- generation
    def generate(self, prompt: Prompt, **options) -> Completion:
        """Generate a completion of prompt (text or token ids): plain text completion of the prompt as given, no
        chat template applied (as in llama-cpp-python; chat() is the conversation API, and `specllm-cli generate`
        uses the chat template unless --raw). Options: max_tokens=256 (0: process the prompt only), temperature=0.0 (greedy), top_k, top_p,
        min_p, repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0 and penalty_last_n=64 (llama.cpp's
        repetition penalties over the last n tokens of prompt and output; -1 = all), logit_bias ({token id: bias}
        added to those tokens' logits, target and draft model alike, after the penalties; -100 all but bans a token,
        float("-inf") bans it), seed, stop, draft_length ("auto",
        "heuristic" or an int k >= 0), logprobs (None; n in 0..20: each
        token's log-probability under the target and the n most likely tokens at its position), prompt_logprobs (None;
        n: the same for the prompt's tokens, the first None, as an eval harness scores a text; the prompt is then
        processed whole, no cached prefix reused; max_tokens=0 scores it without generating), grammar (GBNF
        rules with a "root" rule that the output follows; specllm.grammar.json() for JSON or a JSON schema),
        grammar_triggers (words: a lazy grammar, free text until the output holds one of them and the grammar from
        it on, its root beginning with the word, as llama-server constrains tool calls), grammar_trigger_patterns
        (regular expressions searched in the output, llama.cpp's: the grammar from the first group on), suffix (fill in the middle: prompt is the text before the insertion point, suffix the text after it, and
        the model writes what goes between; a code model trained for it, see infill_prompt), cache_reuse (0; n:
        llama-server's --cache-reuse, runs of n+ tokens the KV cache holds later than the prompt does are moved to
        their place instead of decoded again, as when an editor's ring of other files' chunks drops its oldest; the
        moved tokens' cache was computed after other text, so the output can differ from a fresh prompt's)."""
        text, tokens, logprobs, last = [], [], [], None
        with self.stream(prompt, **options) as stream:
            for chunk in stream:
                text.append(chunk.text)
                tokens.extend(chunk.tokens)
                logprobs.extend(chunk.logprobs or [])
                last = chunk
        return Completion("".join(text), tokens, last.finish_reason, last.stats,
                          logprobs if last.logprobs is not None else None, stream.prompt_logprobs)

    def stream(self, prompt: Prompt, **options) -> Stream:
        """Like generate(), yielding one Chunk per speculative step (complete UTF-8 text only). The options are
        checked now; the generation starts at the first next(). The Stream can be cancel()ed from any thread."""
        suffix = options.pop("suffix", None)
        if suffix is None:
            tokens = self._prompt_tokens(prompt)
        else:
            tokens = self.infill_prompt(prompt, suffix, max_tokens=options.get("max_tokens", 256))
        opts = self._options(options)
        return Stream(self, tokens, opts, self._finished)

    def _finished(self, stats: Stats) -> None:  # the stream still holds the gate
        self.last_stats = stats
        self._memory_changed()
        self._costs.check(self.draft_path)

    @property
    def profile_stale(self) -> bool:
        """Whether this LLM's steps have judged its cost profile stale (measured while the machine ran slower, or
        its batches' shape bent by other work): measure_costs() takes a new one now, as the next load would."""
        return self._costs.stale

    def measure_costs(self, stop: Optional[threading.Event] = None) -> bool:
        """Measures this machine's verify costs (and the draft model's token cost) again, as a load does for a
        profile on file judged stale, writes them to the profile cache and drafts by them from the next call on:
        what the steps had taught the policy against the old costs starts again. About a minute on a 2-core CPU;
        clears the KV cache (the prompt cache keeps its states); waits for a running generation. stop: an Event that
        another thread sets to end this measurement within one timed step, even before it has begun (while it waits
        for the generation): the costs stay as they were and False is returned; stop_measuring() ends whatever
        measurement runs at that moment. A
        server calls it while idle once its profile was judged stale (`specllm-cli serve --remeasure-after`).
        Counts as a load that measured again (profile.STALE_LOADS: a profile measured again at 3 loads in a row and
        still judged stale is kept). False without a drafter or with profile_costs=False."""
        with Call(self._gate):
            return self._costs.measure(self.draft_path, stop)

    def stop_measuring(self) -> None:
        """From any thread: a measure_costs() in progress ends within one timed step (it returns False); nothing
        otherwise (a generation is not interrupted)."""
        self._costs.stop()

    def check_options(self, **options) -> None:
        """Raise what generate(**options) would raise for these options (InvalidOptionError, TypeError)."""
        options = dict(options)
        suffix = options.pop("suffix", None)
        if suffix is not None:
            _text("suffix", suffix)
            infill.check_model(self._engine.target)  # a model without FIM tokens: generate's error, said here too
        opts = self._options(options)
        n_vocab = self._engine.target.n_vocab
        for t, _ in opts.sampling.logit_bias:  # generate's error (Engine::start says it), which nothing said here
            if not 0 <= t < n_vocab:
                raise InvalidOptionError(f"logit_bias: token id {t} is not in the model's vocabulary "
                                         f"(0..{n_vocab - 1})")

    def _options(self, options: dict):
        check_names(options)
        opts = make_options(**self._with_seed(options))
        n_vocab = self._engine.target.n_vocab
        if len({t for t, b in opts.sampling.logit_bias if b == float("-inf") and t < n_vocab}) == n_vocab:
            raise InvalidOptionError(f"logit_bias bans every token of the vocabulary (-inf on all {n_vocab}): nothing "
                                     "could be generated (token 0 was, every step); lift the ban on some")
        if opts.grammar:
            # the parser's message now, not at the first step
            self._engine.target.check_grammar(opts.grammar, list(opts.grammar_triggers),
                                              list(opts.grammar_trigger_patterns))
        return opts

    def _with_seed(self, options: dict) -> dict:
        if options.get("seed") is None and self.seed is not None:
            options = dict(options, seed=self.seed)
        return options

    # --- lifetime
    def close(self) -> None:
        """Free the target and the draft model now (both llama.cpp models and contexts), after the running
        generation; later calls raise SpecLLMError. Closing twice is harmless. `with LLM(...) as llm:` closes."""
        if isinstance(self._engine, _Closed):
            return
        with Call(self._gate, closing=True):
            self._free()
            logs.drain()

    def _free(self) -> None:
        if getattr(self, "_exit_hook", None) is not None:
            atexit.unregister(self._exit_hook)
            self._exit_hook = None
        self._embedder = None  # before the engine: one over the target's weights keeps them alive
        engine, self._engine = getattr(self, "_engine", None), _Closed()
        if hasattr(self, "_costs"):
            self._costs.engine = self._engine  # the profile's part holds no engine either
        del engine  # the last reference: the C++ engine frees both models (without the GIL)

    @property
    def closed(self) -> bool:
        return isinstance(self._engine, _Closed)

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and not self.closed:  # the block was left by an error or Ctrl-C: a stream it left
            self._gate.end_idle_stream("closed")      # open will not be advanced (close() waited idle_timeout)
        self.close()

    def __repr__(self) -> str:
        return f"LLM(model={self.model_path!r}, draft={self.draft!r}{', closed' if self.closed else ''})"


class _Closed:
    """Stands in for the engine of a closed LLM: any use says so."""

    def __getattr__(self, name):
        raise SpecLLMError("this LLM was closed (close() or the end of its with block); create a new one")
