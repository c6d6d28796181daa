"""The grammars that make a reply's tool calls well formed (tools.py reads the calls out of the reply): a forced call's
opening and the rest of it (tool_choice "required" or a named function), "auto"'s lazy grammar that holds from the
model's first "<tool_call>" or JSON call on, and a call or a JSON format beside tools. The arguments follow each
tool's `parameters` schema through llama.cpp's json-schema-to-grammar (specllm.json_schema)."""
from __future__ import annotations

import copy
import json
import re
from typing import List, Optional, Tuple

from .tools import CLOSE, OPEN, json_body, names_of


def forced_opening(tool_choice, tools: Optional[list]) -> str:
    """What the reply is made to begin with so that it calls a tool: tool_choice "required" opens a block and its
    name, a named function ({"type": "function", "function": {"name": ...}}) opens the block up to its arguments.
    The model writes the rest, constrained by call_grammar: a call of one of the tools with arguments that follow
    its schema.
    One tool and "required": that tool, named. "" for "auto" or "none". Raises ValueError (with what to fix) for
    a choice that cannot be honoured."""
    if tool_choice in (None, "auto", "none"):
        return ""
    fn = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    named = isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(name, str)
    if tool_choice != "required" and not named:
        raise ValueError(f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'function': "
                         f"{{'name': ...}}}}, got {tool_choice!r}")
    if not tools:
        raise ValueError("tool_choice asks for a tool call but the request has no tools")
    if not names_of(tools):  # hosted tools only ({"type": "web_search"}), or a function without its object: the
        # reply was made to open a call no grammar could close, and max_tokens of it were thrown away
        raise ValueError("tool_choice asks for a tool call but the request has no function tools ({'type': "
                         "'function', 'function': {'name': ...}}) for it to call")
    if tool_choice == "required" and len(names_of(tools)) == 1:
        name = next(iter(names_of(tools)))
    elif tool_choice == "required":  # the model names the tool (and a name not among them is not a call)
        return OPEN + '\n{"name": "'
    if name not in names_of(tools):
        raise ValueError(f"tool_choice names the function {name!r}, which is not among the request's tools "
                         f"({', '.join(sorted(n for n in names_of(tools) if isinstance(n, str)))})")
    return OPEN + "\n" + json.dumps({"name": name}, ensure_ascii=False)[:-1] + ', "arguments": '


def call_grammar(tool_choice, tools: Optional[list], parallel: bool = True) -> Tuple[Optional[str], dict]:
    """(GBNF, the options that make it lazy) for the calls a reply makes. A forced call (after
    forced_opening(tool_choice, tools)): the rest of it, the arguments following the called tool's `parameters`
    schema ("required" with several tools: the name is one of theirs, then its arguments), then "}" and the block's
    end; not lazy. "auto": a lazy grammar, as llama-server's: the reply is free until it writes "<tool_call>", and
    from there it is one or more blocks calling the request's tools with arguments that follow their schemas (one
    unless parallel); or until it opens with a bare or ```json-fenced JSON object whose "name" is one of the tools
    (Qwen2.5-Coder's habit; llama-server's Hermes format triggers on it too), or writes one on a line after some
    text, which then goes on as that call
    (whitespace as the model writes it) and ends the reply. (None, {}) for "none" or no tools. A schema the
    converter cannot express lets that tool's arguments be any JSON object (the call is still JSON)."""
    if not tools or tool_choice == "none":
        return None, {}
    opening = forced_opening(tool_choice, tools)
    from .. import json_schema  # llama.cpp's json-schema-to-grammar, as specllm.grammar.json
    gbnf_literal = json_schema.gbnf_literal

    conv = json_schema.Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    fns = {}
    for t in tools:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]:
            fns.setdefault(fn["name"], fn)
    if not fns:  # no function to call (hosted tools only): nothing to constrain
        return None, {}

    def arguments(i: int, fn: dict) -> str:
        try:  # deepcopy in the try too: a schema nested some 300 levels deep is a RecursionError there
            schema = copy.deepcopy(fn.get("parameters"))  # resolve_refs rewrites $refs in place: not the request's
            schema = conv.resolve_refs(schema if isinstance(schema, dict) and not json_schema.allows_anything(schema)
                                       else {"type": "object"}, f"tool-{i}")
            return conv.visit(schema, f"arguments-{i}")
        except Exception:  # what the converter cannot express (it raises what it meets)
            return conv.visit({"type": "object"}, f"arguments-{i}-any")

    def named_call(args: List[str], between: str) -> str:  # after '"name": "': a tool's name, then its arguments
        return "( " + " | ".join(gbnf_literal(json_body(name) + '"') + between + a for name, a in zip(fns, args)) + " )"

    if not opening:  # "auto": blocks from the trigger on, or a whole-reply JSON call
        args = [arguments(i, fn) for i, fn in enumerate(fns.values())]
        conv._add_rule("tool-call", gbnf_literal(OPEN) + ' "\\n"? ' + gbnf_literal('{"name": "') + " " +
                       named_call(args, ' ", \\"arguments\\": " ') + ' "}"')
        # every block but the last is closed (parse reads an open block only at the end)
        close = ' "\\n"? ' + gbnf_literal(CLOSE)
        blocks = f"( tool-call{close} [ \\t\\n]* )* " if parallel else ""
        conv._add_rule("call-object", 'space "{" space "\\"name\\"" space ":" space "\\"" ' +
                       named_call(args, ' space "," space "\\"arguments\\"" space ":" space ') + ' space "}"')
        conv._add_rule("json-call", '( "```json" | "```" ) "\\n" call-object "\\n"{1,2} "```" | call-object')
        conv._add_rule("root", f"( {blocks}tool-call ({close} )? | json-call ) [ \\t\\n]{{0,4}}")
        names = "|".join(_regex_escape(json_body(n)) for n in fns)
        # searched from the start (not ^...$: llama.cpp would match all of a long reply's text at every token), its
        # whitespace the grammar's own, so that whatever it finds the grammar reads (else it would stay waiting)
        sp = r"(?: |\n{1,2}[ \t]{0,20})?"
        opens = rf'^\s*((?:```(?:json)?\n)?{sp}\{{{sp}"name"{sp}:{sp}"(?:{names})")'
        after = rf'\n[ \t]*((?:```(?:json)?\n)?{sp}\{{{sp}"name"{sp}:{sp}"(?:{names})")'  # on a line after text
        return _json_space(conv.format_grammar()), {"grammar_triggers": [OPEN],
                                                    "grammar_trigger_patterns": [opens, after]}
    if opening.endswith('"arguments": '):  # a named function (or the only tool): its arguments
        name = json.loads(opening[len(OPEN):] + "0}")["name"]
        call = arguments(0, fns[name])
    else:  # the model names one of the tools
        call = named_call([arguments(i, fn) for i, fn in enumerate(fns.values())], ' ", \\"arguments\\": " ')
    conv._add_rule("root", call + ' "}" ( "\\n"? ' + gbnf_literal(CLOSE) + " )?")
    return conv.format_grammar(), {}


def call_or_format(call_rules: tuple, fmt: str) -> tuple:
    """(GBNF, lazy options) of a reply that calls a tool or answers in a JSON format (response_format, Responses'
    text.format, Anthropic's output_config.format, Ollama's format: structured output beside tools, which the OpenAI
    Agents SDK sends on every turn of an agent with an output type; it was a 400): "auto"'s call forms (a tagged
    block, or a bare or fenced JSON call) or the format's JSON, from the reply's start; not lazy. A forced call
    (call_rules not lazy) stays as it is: the reply is that call."""
    gbnf, lazy = call_rules
    if not lazy:
        return call_rules
    return (_named_apart(gbnf, "call-") + "\n" + _named_apart(fmt, "format-") +
            "\nroot ::= call-root | format-root\n", {})


def _named_apart(gbnf: str, prefix: str) -> str:
    """GBNF text with each of its rules' names (where defined and where used) prefixed, so that two grammars can be
    joined: names outside "strings", [classes], <tokens>, {counts} and # comments."""
    defined = set(re.findall(r"^([A-Za-z0-9_-]+)\s*::=", gbnf, re.M))
    out, i = [], 0
    while i < len(gbnf):
        c = gbnf[i]
        if c in "\"[<{":  # a string, a class, a token, a repetition's counts ({1,15}: not rules named 1 and 15)
            end = {'"': '"', "[": "]", "<": ">", "{": "}"}[c]
            j = i + 1
            while j < len(gbnf) and gbnf[j] != end:
                j += 2 if gbnf[j] == "\\" else 1
            out.append(gbnf[i:j + 1])
            i = j + 1
        elif c == "#":
            j = gbnf.find("\n", i)
            j = len(gbnf) if j < 0 else j
            out.append(gbnf[i:j])
            i = j
        elif re.match(r"[A-Za-z0-9_-]", c):
            m = re.compile(r"[A-Za-z0-9_-]+").match(gbnf, i)
            word = m.group(0)
            out.append(prefix + word if word in defined else word)
            i = m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _regex_escape(text: str) -> str:
    """text as a literal in an ECMAScript regular expression (llama.cpp's trigger patterns)."""
    return re.sub(r"([.^$|()*+?\[\]{}\\/-])", r"\\\1", text)


def _json_space(gbnf: str) -> str:
    """The converter's grammar with its JSON whitespace widened to pretty-printing (newlines and indentation, as
    llama.cpp's newer converter allows, also before a closing brace), so that a call the model lays out over lines
    is not squeezed onto one."""
    widened = r'space ::= | " " | "\n"{1,2} [ \t]{0,20}'
    gbnf = re.sub(r"^space ::= .*$", lambda m: widened, gbnf, count=1, flags=re.M)
    # and before a closing brace or bracket: the converter puts none after an enum's or a constant's value
    return gbnf.replace('"}" space', 'space "}" space').replace('"]" space', 'space "]" space')
