"""Tool calls in the Hermes format that Qwen2.5's chat template asks for (and NousResearch Hermes, and other
templates that say "<tool_call>"): the model answers `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
one block per call, and the server returns them as OpenAI `tool_calls` (finish_reason "tool_calls"). A block that is
not a JSON object with a string name stays in the reply's text, as llama-server leaves what it cannot parse.

Small models often answer a tool prompt with the call alone, as a JSON object (bare or in a ```json fence) instead
of the tagged block (Qwen2.5-Coder 1.5B does): a reply that is nothing but such an object, naming one of the
request's tools, is a call too, and so is one that ends with such an object on lines of its own after some text
("Let me check the weather in Paris for you.\n{"name": "get_weather", ...}", as the 1.5B model answers later turns;
llama-server's Hermes parser finds a call there too): the text is the reply's content, the object its call.

`ToolStream` does the same for a streamed reply: text is passed on until a block may begin (a tail that could be
the start of "<tool_call>" is held back), and everything from the first block on is held and parsed at the end; a
reply that begins like a JSON object, or with a bare or json code fence, is held whole until it ends (then passed on
if it is not a call); a fence of another language (```python) is passed on as it comes, and is not a call. After
some text, a line that may begin a call of one of the tools (`{"name": "` and a tool's name, bare or fenced) is held
from its line end on while it may, and to the reply's end once it names a tool."""
from __future__ import annotations

import json
import re
import uuid
from typing import List, Optional, Tuple

from .errors import json_text

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.S)


def template_calls_tools(template: str) -> bool:
    """The chat template asks for Hermes-style tool calls."""
    return OPEN in template


def names_of(tools: list) -> set:
    """The function names of a request's tools."""
    return {t["function"].get("name") for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)}


def check_names(tools: Optional[list]) -> None:
    """ValueError naming the first tool whose function has no name that is a string (OpenAI requires one)."""
    for i, t in enumerate(tools or []):
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and not isinstance(fn.get("name"), str):
            raise ValueError(f"tools[{i}].function.name must be a string (the function's name), got "
                             f"{type(fn.get('name')).__name__}")
        if isinstance(fn, dict) and not fn["name"]:
            raise ValueError(f"tools[{i}].function.name is empty; give the function's name")


def template_call(call: dict) -> dict:
    """An earlier call from a request, as a chat template gets it: its arguments (a JSON string in the API) as an
    object, which templates write out with tojson."""
    fn = call.get("function")
    if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
        try:
            args = json.loads(fn["arguments"])
        except (ValueError, RecursionError):  # nested deeper than Python's json reads: left as text
            args = None
        if isinstance(args, dict):
            call = dict(call, function=dict(fn, arguments=args))
    return call


_FENCE_OPEN = r"```[ \t]*(?i:json)?[ \t]*\n"  # a bare or json fence's first line: the fences a call may be in
_FENCE = re.compile(r"^" + _FENCE_OPEN + r"(.*)\n```$", re.S)


# where a call may begin after text: a line that opens a JSON object or a fence
_LINE_OPENS = re.compile(r"\n[ \t]*(?=\{|```)")


def _call(body: str, names=None) -> Optional[dict]:
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    if names is not None and obj["name"] not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        try:
            args = json.loads(args)
        except (ValueError, RecursionError):
            return None
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": obj["name"], "arguments": json_text(args)}}


def _opens_call(text: str, names) -> Optional[bool]:
    """Whether text (from a line end on) begins a JSON call of one of names, bare or in a bare or json fence: True
    once its name is written, None while it may still, False once it cannot."""
    s = text.lstrip()
    if not s or "```".startswith(s):
        return None
    if s.startswith("```"):
        fence = re.match(_FENCE_OPEN, s)
        if fence is None:
            return None if "\n" not in s else False  # the fence's language not known yet, or another language
        s = s[fence.end():].lstrip()
        if not s:
            return None
    squeezed = re.sub(r"\s+", "", s[:400])
    wants = ['{"name":"' + re.sub(r"\s+", "", json_body(n)) + '"' for n in names if isinstance(n, str)]
    wants.append('{"arguments":')  # the name after them, as parse() reads a call too
    if any(squeezed.startswith(w) for w in wants):
        return True
    return None if any(w.startswith(squeezed) for w in wants) else False


def json_body(name: str) -> str:
    """A name as JSON writes it between its quotes."""
    return json.dumps(name, ensure_ascii=False)[1:-1]


def _closed(text: str) -> str:
    """text with a last block the model left open at the end of its reply closed (small models end their turn
    there); a block cut short stays unparseable all the same."""
    at = text.rfind(OPEN)
    return text + CLOSE if at >= 0 and CLOSE not in text[at:] else text


def parse(text: str, names=None, strict: bool = False) -> Tuple[str, List[dict]]:
    """(the reply's text without its tool-call blocks, the calls). Text that is not a well-formed call stays text:
    if any block fails to parse, nothing is taken out (the reply is returned as the model wrote it). `names`: the
    request's tool names; given, a reply that is only a JSON call of one of them (bare or fenced) is a call.
    strict: a block must name one of them too (a forced call: the model was made to name a tool)."""
    closed = _closed(text)
    blocks = list(_BLOCK.finditer(closed))
    if not blocks:
        if names:
            body = text.strip()
            fenced = _FENCE.match(body)
            call = _call(fenced.group(1).strip() if fenced else body, names)
            if call is not None:
                return "", [call]
            for m in _LINE_OPENS.finditer(text):  # a call on lines of its own that end the reply, after text
                tail = text[m.start():].strip()
                fenced = _FENCE.match(tail)
                call = _call(fenced.group(1).strip() if fenced else tail, names)
                if call is not None:
                    return text[:m.start()].rstrip(), [call]
        return text, []
    calls = [_call(m.group(1).strip(), names if strict else None) for m in blocks]
    if any(c is None for c in calls):
        return text, []
    rest = _BLOCK.sub("", closed).strip()
    return rest, calls


def reply_parts(tools: Optional[list], forced: str, text: str) -> Tuple[str, List[dict]]:
    """(text, calls) of a whole reply that began with `forced` (a forced call's opening, or ""): parse() with the
    request's tool names, strict for a forced call; (text, []) without tools. A forced call that is not whole (cut
    by max_tokens) is ("", []): its opening is the server's words, not the model's."""
    if not tools:
        return forced + text, []
    text, calls = parse(forced + text, names_of(tools), bool(forced))
    return ("", []) if forced and not calls else (text, calls)


def reply_stream(tools: Optional[list], forced: str) -> Optional["ToolStream"]:
    """The ToolStream a streamed reply passes through (None without tools), fed the forced opening of a call."""
    if not tools:
        return None
    held = ToolStream(names_of(tools), strict=bool(forced))
    if forced:
        held.feed(forced)  # held from the start: the reply is a call
    return held


class ToolStream:
    """Feed it a streamed reply's pieces; it gives back the text to pass on now, and at the end the rest: (text,
    calls)."""

    def __init__(self, names=None, strict: bool = False):
        self.names = names
        self.strict = strict
        self.held = ""       # a tail that may be the start of OPEN, or everything from the first OPEN on
        self.in_call = False
        self.started = False  # some text was passed on
        self.line_start = False  # ... and it ended a line (a JSON call may begin with the next piece)

    def feed(self, piece: str) -> str:
        if self.in_call:
            self.held += piece
            return ""
        text = self.held + piece
        if not self.started and self.names:
            head = text.lstrip()
            fence = head.startswith("```")
            if fence and "\n" not in head:  # the fence's language is not known yet
                self.held = text
                return ""
            if head.startswith("{") or (fence and re.match(_FENCE_OPEN, head)):
                self.in_call, self.held = True, text  # may be a whole-reply call: held until the reply ends
                return ""
            if not head or "```".startswith(head):  # nothing yet, or a fence may be starting
                self.held = text
                return ""
        at = text.find(OPEN)
        if at >= 0:
            before = text[:at]
            if not self.started and not before.strip():
                before = ""  # whitespace before a call that opens the reply is not text (parse strips it too)
            self.in_call, self.held = True, text[at:]
            self.started = self.started or bool(before)
            return before
        # a line after text that may begin a JSON call: held from its start while it may, to the end once it does
        starts = ([0] if self.line_start else []) + [m.end() for m in re.finditer(r"\n", text)] if self.names else []
        for at in starts:
            verdict = _opens_call(text[at:], self.names) if text[at:].strip(" \t") else False
            if verdict is not False:
                self.in_call, self.held = bool(verdict), text[at:]
                self.started = self.started or at > 0
                self.line_start = self.line_start if at == 0 else True
                return text[:at]
        keep = 0  # the longest tail of text that is a proper prefix of OPEN
        for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
            if OPEN.startswith(text[-n:]):
                keep = n
                break
        out = text[:len(text) - keep]
        if keep and not self.started and not out.strip():  # whitespace, then what may open a call: held whole
            self.held = text
            return ""
        self.held = text[len(text) - keep:]
        self.started = self.started or len(text) > keep
        if out:  # indentation alone after a line's end (a piece of its own) keeps the line's start
            self.line_start = (re.search(r"\n[ \t]*\Z", out) is not None or
                               (self.line_start and not out.strip(" \t")))
        return out

    def pass_on(self, piece: str, finished: bool) -> Tuple[str, List[dict]]:
        """(the text to pass on now, and the calls once the reply has ended) of a streamed piece."""
        text = self.feed(piece)
        if not finished:
            return text, []
        rest, calls = self.finish()
        return text + rest, calls

    def finish(self) -> Tuple[str, List[dict]]:
        """(text still to pass on, the calls) once the reply has ended."""
        held, self.held = self.held, ""
        if not self.in_call:
            return held, []
        rest, calls = parse(held, self.names, self.strict)
        if calls:
            return rest, calls
        return ("" if self.strict else held), []  # strict: a forced call cut short (reply_parts)
