"""JSON text as etcd's Go encoder writes it, for the model's replies.

Go's ``encoding/json`` escapes ``<``, ``>`` and ``&`` (as ``\\u003c``...),
U+2028 and U+2029, and control characters other than ``\\n``, ``\\r`` and
``\\t`` as ``\\u00XX`` (lower-case hex; Go before 1.22 has no ``\\b`` or
``\\f``); it writes other characters as they are, and writes ``\\ufffd``
for a byte that is not UTF-8.  The model's strings carry such bytes as
surrogate escapes (``errors="surrogateescape"``).  Objects keep the order
of their fields, as Go's structs do.
"""
from __future__ import annotations

import json
import re
from typing import Any, Dict, List, Match

_SPECIAL = re.compile('[\x00-\x1f"\\\\<>&\u2028\u2029\udc80-\udcff]')
_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
#: What Python's encoder writes unlike Go's (\b and \f may be an escaped backslash's
#: false alarm, which only costs the slow path).
_UNLIKE_GO = re.compile('[<>&\u2028\u2029\ud800-\udfff]|\\\\[bf]')
_FAST = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def _escape(match: Match[str]) -> str:
    char = match.group()
    if char in _SHORT:
        return _SHORT[char]
    if "\udc80" <= char <= "\udcff":
        return "\\ufffd"
    return f"\\u{ord(char):04x}"


def string(text: str) -> str:
    """``text`` as a Go JSON string literal."""
    return '"' + _SPECIAL.sub(_escape, text) + '"'


def encode(value: Any) -> str:
    """A JSON value (dict, list, str, bool, int, None) in Go's spelling, without spaces.

    Python's C encoder writes the same text but for a few characters: it
    does the work unless those appear.
    """
    text = _FAST.encode(value)
    return _slow(value) if _unlike_go(text) else text


def _unlike_go(text: str) -> bool:
    """Whether ``text`` has what _UNLIKE_GO matches: a scan per character is much
    cheaper than the regular expression's alternation, and an ASCII text has none
    of its other characters."""
    if "<" in text or ">" in text or "&" in text or "\\b" in text or "\\f" in text:
        return True
    return not text.isascii() and _UNLIKE_GO.search(text) is not None


def _slow(value: Any) -> str:
    if isinstance(value, str):
        return string(value)
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return _object(value)
    if isinstance(value, list):
        return "[" + ",".join(_slow(item) for item in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__} as Go JSON")


def _object(fields: Dict[str, Any]) -> str:
    parts: List[str] = [f"{string(name)}:{_slow(value)}" for name, value in fields.items()]
    return "{" + ",".join(parts) + "}"
