"""Request and response bodies of the OpenAI API, as far as specllm serves it.

Unknown request fields are ignored (clients send many); fields specllm cannot honour are checked in
`unsupported()` and refused with a 400 rather than silently ignored.
"""
from __future__ import annotations

import typing
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator


class _Request(BaseModel):
    """Every request body's fields: strict types (true is not the number 1, "0.5" not 0.5, 5.0 not the integer 5:
    as OpenAI's API refuses them; pydantic's lax mode read "max_tokens": true as 1 and "top_k": true as greedy),
    and null for a field that takes no null read as the field not given (openai's client sends stream=None as
    null; llama-server's json_value takes null as the default)."""
    model_config = ConfigDict(extra="ignore", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_not_given(cls, data):
        if isinstance(data, dict) and None in data.values():
            fields = cls.model_fields
            return {k: v for k, v in data.items() if v is not None or k not in fields or _takes_none(fields[k])}
        return data


def _takes_none(field) -> bool:
    ann = field.annotation
    return ann is Any or ann is type(None) or type(None) in typing.get_args(ann)


class StreamOptions(_Request):
    include_usage: bool = False


class ContentPart(_Request):
    type: str
    text: Optional[str] = None


class Message(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, List[ContentPart], None] = None
    tool_calls: Optional[List[Dict[str, Any]]] = None  # an assistant's earlier calls
    tool_call_id: Optional[str] = None                  # a tool's result: the call it answers
    name: Optional[str] = None
    reasoning_content: Optional[str] = None             # a thinking model's earlier thoughts (llama-server's field)


class OwnFields(_Request):
    """specllm's (and llama-server's) sampling fields beyond OpenAI's, which chat, completions, Responses and
    Anthropic's messages all take (Responses and messages left out grammar, the penalties and logit_bias: ignored)."""
    top_k: Optional[int] = Field(None, ge=0)
    min_p: Optional[float] = Field(None, ge=0, le=1)
    draft_length: Union[int, str, None] = None  # "auto" | "heuristic" | k, checked by make_options
    acceptance: Optional[str] = None  # "coupled" | "rejection", checked by make_options
    grammar: Optional[str] = None  # GBNF the output follows (as llama-server's); response_format is OpenAI's way
    n_cache_reuse: Optional[int] = Field(None, ge=0)  # llama-server's: the server's --cache-reuse for this request
    # repetition penalties as llama-server applies them: over the last repeat_last_n (64) tokens of prompt and reply
    presence_penalty: Optional[float] = Field(None, ge=-2, le=2)
    frequency_penalty: Optional[float] = Field(None, ge=-2, le=2)
    repeat_penalty: Optional[float] = Field(None, gt=0)  # llama-server's own
    repeat_last_n: Optional[int] = Field(None, ge=-1, le=2**31 - 1)  # llama-server's own: -1 = all, 0 = off
    logit_bias: Optional[Dict[str, Any]] = None  # {"token id": bias}; bias.parse takes llama-server's forms too


OWN_FIELDS = tuple(OwnFields.model_fields)


class SamplingFields(OwnFields):
    """What chat and completions requests share."""
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    seed: Optional[int] = None
    stop: Union[str, List[str], None] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    n: Optional[int] = Field(None, ge=1)
    logprobs: Optional[Union[bool, int]] = None  # chat: true/false; completions: how many top tokens (logprobs.py)
    top_logprobs: Optional[int] = None           # chat: how many top tokens
    # accepted only where they change nothing
    tools: Optional[List[Any]] = None
    tool_choice: Optional[Any] = None
    functions: Optional[List[Any]] = None
    function_call: Optional[Any] = None
    response_format: Optional[Any] = None  # text, json_object, json_schema (grammar.response_format checks it)


class ChatRequest(SamplingFields):
    messages: List[Message]
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    parallel_tool_calls: Optional[bool] = None  # false: at most one call (tool_grammar.call_grammar)
    chat_template_kwargs: Optional[dict] = None  # the template's own variables (llama-server's), over the server's


class CompletionRequest(SamplingFields):
    # a text, texts, token ids, or token id lists; strict: [true] was token 1 (pydantic's lax int)
    prompt: Union[str, List[Union[str, List[StrictInt]]], List[StrictInt]]
    max_tokens: Optional[int] = Field(None, ge=0)  # 0: no reply (with echo and logprobs: the prompt scored)
    echo: Optional[bool] = None
    best_of: Optional[int] = None
    suffix: Optional[str] = None


def unsupported(req: SamplingFields) -> Optional[tuple]:
    """(param, message) for the first field the request sets that specllm cannot honour, else None."""
    checks = [
        ("tools", bool(req.tools) and not isinstance(req, ChatRequest), "tools are served by /v1/chat/completions"),
        ("functions", bool(req.functions), "functions (the deprecated form of tools) are not supported; use tools"),
        ("tool_choice", req.tool_choice not in (None, "none", "auto") and not isinstance(req, ChatRequest),
         "tool_choice is served by /v1/chat/completions"),
        ("function_call", req.function_call not in (None, "none"), "function_call is not supported"),
    ]
    if isinstance(req, CompletionRequest):
        checks += [("best_of", req.best_of not in (None, 1), "best_of > 1 is not supported (n > 1 is: ask for n "
                                                                  "completions and choose among them)")]
    for param, bad, message in checks:
        if bad:
            return param, message
    return None


# --- responses
class Speculative(BaseModel):
    """What speculative decoding did for this request."""
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float
    mean_accepted_per_step: float
    steps: int
    tokens_per_second: float
    speedup: Optional[float] = None  # over plain decoding timed on the request's undrafted steps (Stats.speedup)
    prompt_tokens_cached: int
    queue_ms: float
    draft_length: Union[int, str]


class PromptTokensDetails(BaseModel):
    cached_tokens: int


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class _Response(BaseModel):
    """What every completion body and chunk starts with."""
    id: str
    created: int
    model: str


class _Choice(BaseModel):
    index: int = 0
    logprobs: Optional[Dict[str, Any]] = None  # when asked for: logprobs.py's chat() or completion()


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaToolCall(ToolCall):
    index: int


class ChatMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str]
    tool_calls: Optional[List[ToolCall]] = None


class ChatChoice(_Choice):
    message: ChatMessage
    finish_reason: str


class ChatCompletion(_Response):
    object: Literal["chat.completion"] = "chat.completion"
    choices: List[ChatChoice]
    usage: Usage
    speculative: Speculative


class Delta(BaseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    tool_calls: Optional[List[DeltaToolCall]] = None


class ChunkChoice(_Choice):
    delta: Delta
    finish_reason: Optional[str] = None


class ChatCompletionChunk(_Response):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: List[ChunkChoice]
    usage: Optional[Usage] = None
    speculative: Optional[Speculative] = None


class TextChoice(_Choice):
    text: str
    finish_reason: Optional[str] = None


class TextCompletion(_Response):
    object: Literal["text_completion"] = "text_completion"
    choices: List[TextChoice]
    usage: Optional[Usage] = None
    speculative: Optional[Speculative] = None


class ModelCard(BaseModel):
    """OpenAI's model object, with the fields of Anthropic's beside it (its client's models.list reads the same
    path and required type, display_name and created_at)."""
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "specllm"
    type: Literal["model"] = "model"
    display_name: str = ""
    created_at: str = ""

    def model_post_init(self, _context) -> None:
        import datetime
        self.display_name = self.display_name or self.id
        self.created_at = self.created_at or datetime.datetime.fromtimestamp(
            self.created, datetime.timezone.utc).isoformat().replace("+00:00", "Z")


class ModelList(BaseModel):
    """OpenAI's list, with Anthropic's paging fields (one page)."""
    object: Literal["list"] = "list"
    data: List[ModelCard]
    has_more: bool = False
    first_id: Optional[str] = None
    last_id: Optional[str] = None

    def model_post_init(self, _context) -> None:
        if self.data:
            self.first_id, self.last_id = self.data[0].id, self.data[-1].id


class ErrorBody(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorResponse(BaseModel):
    error: ErrorBody
