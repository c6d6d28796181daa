"""A JSON Schema string's `pattern` as llama-cpp-python's converter (json_schema.py) should read it, and the classes
of the grammar it writes, mended so that the string stays JSON: the pattern checked as a regular expression, its
escapes GBNF does not read written as classes, a quote or backslash it names written as JSON escapes them, lazy
quantifiers as greedy ones; every class cut around the characters a JSON string cannot hold raw (a quote, a
backslash, control characters), and "." (DOT) without them."""
from __future__ import annotations

import re


class SchemaError(ValueError):
    """What this module refuses in a schema, said in the schema's terms (grammar.json passes it on as it is)."""


DOT = r'[^"\\\x7F\x00-\x1F]'  # a pattern's "." inside a JSON string: a character that needs no escape
CLASS = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]')  # a GBNF string (left as is) or class
_FORBIDDEN = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C), (0x7F, 0x7F)]  # raw in a JSON string: not JSON
_CLASS_ESCAPES = {"t": 9, "n": 10, "r": 13}


def _class_ranges(body: str) -> list:
    """A GBNF class's body (without [ ] and ^) as (first, last) code points."""
    chars, i = [], 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            e = body[i + 1]
            if e in "xuU":
                width = {"x": 2, "u": 4, "U": 8}[e]
                chars.append(int(body[i + 2:i + 2 + width], 16))
                i += 2 + width
                continue
            chars.append(_CLASS_ESCAPES.get(e, ord(e)))
            i += 2
            continue
        chars.append(-1 if c == "-" else ord(c))  # -1: a range's dash (read below)
        i += 1
    out, j = [], 0
    while j < len(chars):
        if j + 2 < len(chars) and chars[j + 1] == -1 and chars[j] != -1 and chars[j + 2] != -1:
            out.append((chars[j], chars[j + 2]))
            j += 3
        else:
            c = ord("-") if chars[j] == -1 else chars[j]
            out.append((c, c))
            j += 1
    return out


def json_class(text: str, name: str) -> str:
    """A class of the pattern's grammar without the characters a JSON string cannot hold raw (a quote, a
    backslash, control characters): a negated class excludes them too, a class's ranges are cut around them (the
    port copied [ -~] as it was, and the reply held a raw quote). A GBNF string passes unchanged."""
    if text.startswith('"'):
        return text
    if text.startswith("[^"):
        return text[:-1] + '"\\\\\\x7F\\x00-\\x1F]'
    kept = []
    for lo, hi in _class_ranges(text[1:-1]):
        for flo, fhi in _FORBIDDEN:
            if lo <= fhi and hi >= flo:  # cut the forbidden part out
                if lo < flo:
                    kept.append((lo, flo - 1))
                lo = fhi + 1
            if lo > hi:
                break
        if lo <= hi:
            kept.append((lo, hi))
    if not kept:
        raise SchemaError(f"the schema at {name or 'the root'}: a pattern's class {text} holds only characters a "
                          "JSON string must escape (a quote, a backslash, control characters)")
    code = lambda c: f"\\x{c:02X}" if c < 0x100 else f"\\u{c:04X}" if c < 0x10000 else f"\\U{c:08X}"
    return "[" + "".join(code(a) if a == b else f"{code(a)}-{code(b)}" for a, b in kept) + "]"
# outside a class: the escapes GBNF does not read, as a class of their one character
_ESCAPED_ALONE = {".": "[.]", "$": "[$]", "^": "[\\x5E]", "/": "/", "d": "[0-9]", "w": "[a-zA-Z0-9_]", "s": "[ ]"}
_ESCAPED_IN_CLASS = {".": ".", "$": "$", "^": "\\x5E", "/": "/", "d": "0-9", "w": "a-zA-Z0-9_", "s": " "}


def converter_pattern(pattern: str, name: str) -> str:
    """A string's `pattern` as the converter reads it, or a SchemaError: a valid regular expression (Python's reading;
    an unbalanced parenthesis or [z-a] was a grammar whose reply dead-ended), escapes it does not know written as
    classes (\\d \\w \\s \\. \\$ \\^ made GBNF that did not parse), lazy quantifiers as greedy ones (the same
    strings; "+?" was read as "+" then "?"), a quote or a backslash as JSON writes it in a string (the converter
    wrote them raw: not JSON, or another character); in a [class] they are refused."""
    where = f"the schema at {name or 'the root'}"
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as e:
        raise SchemaError(f"{where}: pattern {pattern!r} is not a valid regular expression ({e})") from None
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            table = _ESCAPED_IN_CLASS if in_class else _ESCAPED_ALONE
            if nxt in ('"', "\\") and in_class:
                raise SchemaError(f"{where}: a quote or a backslash in a pattern's [class] is not supported")
            if nxt in ('"', "\\"):  # the character, as JSON writes it in a string: \" or \\ (a group of its own)
                out.append('(\\\\")' if nxt == '"' else "(\\\\\\\\)")
                i += 2
                continue
            if nxt in table:
                out.append(table[nxt])
            elif nxt in "xu" and not in_class:  # the character itself; one JSON escapes, as JSON writes it
                width = 2 if nxt == "x" else 4
                digits = pattern[i + 2:i + 2 + width]
                code = int(digits, 16)  # re.compile read it: width hex digits
                if code in (0x22, 0x5C):
                    out.append('(\\\\")' if code == 0x22 else "(\\\\\\\\)")
                elif code < 0x20 or code == 0x7F:
                    out.append(f"(\\\\u{code:04x})")
                else:  # as a class of its one character (the converter split a literal's \\x41 before a group)
                    out.append("[" + c + nxt + digits + "]")
                i += 2 + width
                continue
            elif nxt in "[]-xu" or (nxt in "(){}*+?|" and not in_class):  # GBNF's, or the converter reads them
                out.append(c + nxt)
            elif nxt in "(){}*+?|":
                out.append(nxt)
            else:  # \D \W \S \b, a back-reference, a control character (not JSON in a string)...
                raise SchemaError(f"{where}: pattern escape \\{nxt} is not supported")
            i += 2
            continue
        if c == "(" and not in_class and pattern[i + 1:i + 3] == "?:":  # a group that does not capture: a group
            out.append("(")
            i += 3
            continue
        if c == '"':
            if in_class:
                raise SchemaError(f"{where}: a quote or a backslash in a pattern's [class] is not supported")
            out.append('(\\\\")')
            i += 1
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            if pattern[i + 1:i + 2] == "^":
                out.append("^")
                i += 1
            if pattern[i + 1:i + 2] == "]":  # a "]" first in a class is the character
                out.append("\\]")
                i += 1
        elif c == "]" and in_class:
            in_class = False
            out.append(c)
        elif c == "?" and not in_class and i > 0 and pattern[i - 1] in "*+?}" and not (
                i > 1 and pattern[i - 2] == "\\") and (out and out[-1] != "("):
            pass  # a lazy quantifier: the same strings as the greedy one
        else:
            out.append(c)
        i += 1
    return "".join(out)
