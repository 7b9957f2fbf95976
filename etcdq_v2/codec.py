"""What etcdq_v2 stores in etcd values, and how it reads them back.

etcd v2 values are strings, so every value is a compact JSON object.  The
payload is stored as ``"p": <JSON value>`` or, for ``bytes``, as
``"b": <base64>`` so that binary payloads round-trip exactly.

Short field names keep listings small: a claim downloads no listing, but a
consumer's first view of the queue does (etcd has no keys-only listing).

A payload (or a result) may nest lists and objects :data:`MAX_DEPTH` levels
deep at most.  json.loads recurses once per level, so a value that a producer
encoded at a shallow stack could fail to decode deeper in a claimer's stack
(RecursionError, ~950 levels): every claimer meeting it would die.  Deeper
payloads are refused at put and deeper results at complete (InvalidPayload),
and a stored value too deep to decode is junk.  The limit applies to values a
caller supplies now, never to a stored payload written back (C2, F1, F2, Q1,
Q3, ...): one that decoded is an item of ours, however deep (etcdq 0.1.0 and
other writers had no limit), and refusing it would stall its queue.
"""
from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

from .errors import InvalidPayload, PayloadTooLarge
from .runtime import SYSTEM

DEFAULT_MAX_PAYLOAD = 1 << 20
#: How deep a payload or result may nest lists and objects (``[[1]]`` is 2).
MAX_DEPTH = 100
#: The record kinds, which are also the outcomes a fenced commit writes into an item.
OUTCOMES = ("completed", "failed")
#: A failed attempt's text (its reason and its handler's traceback) is user
#: text, stored in two places with two bounds, in characters (see
#: :func:`failure_text`).  A dead letter (``failed/<id>``, and the item at F1)
#: keeps the start of the reason and the end of the traceback, where the
#: exception and the innermost frames are; both fit beside a payload at its
#: cap (MAX_DEPTH aside, a record is read whole by get, ls, export and stats).
REASON_LIMIT = 16384
TRACEBACK_LIMIT = 4000
#: A delay lock (R1 from fail()) carries the same text, shorter: locks/ is
#: listed by every consumer's view (a watching one receives each lock's
#: value), so each item waiting for its retry costs every listing at most
#: ~1.7 kB, not the size of its error.
LOCK_REASON_LIMIT = 512
LOCK_TRACEBACK_LIMIT = 1024


class Junk(ValueError):
    """A value that etcdq_v2 did not write (or cannot read). Internal."""


def new_token() -> str:
    """A random token, unique for practical purposes (96 bits), from the real
    runtime; a protocol takes its own runtime's (Runtime.token)."""
    return SYSTEM.token()


#: One encoder for every value: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
#: For values read back from etcd: what Python's decoder took (NaN, Infinity, a
#: number too large for a float, a lone surrogate) is written back, never refused,
#: or every claim of an item stored so would fail at C2.
_STORED = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=True)
_STORED_ASCII = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def dumps(doc: Dict[str, Any], *, stored: bool = False) -> str:
    """Compact JSON; raises InvalidPayload for what JSON or UTF-8 can't carry,
    and for a payload (or result) in ``doc`` nested deeper than MAX_DEPTH,
    unless ``stored``: ``doc`` carries a payload read back from etcd (it
    decoded), which is written back as it decoded, however deep, with
    NaN or Infinity as Python writes them and a lone surrogate escaped."""
    if stored:
        return _stored_text(doc)
    text = _strict_text(doc)
    # ``doc`` itself is one level more than its fields.
    check_depth(doc, MAX_DEPTH + 1, text)
    return text


def _strict_text(value: Any) -> str:
    """``value`` as JSON a caller may store: InvalidPayload for NaN, Infinity,
    a lone surrogate or what JSON can't carry; no depth check."""
    try:
        text = _ENCODER.encode(value)
        text.encode("utf-8")
    except RecursionError:
        raise InvalidPayload(f"payload is nested more than {MAX_DEPTH} levels deep") from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
    return text


def _stored_text(doc: Dict[str, Any]) -> str:
    """``doc`` as JSON, holding values that were decoded from etcd."""
    try:
        text = _STORED.encode(doc)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate that was stored escaped: escape it again
            text = _STORED_ASCII.encode(doc)
    except RecursionError:  # Python's decoder and encoder share this thread's stack
        raise InvalidPayload(f"payload is nested more than {MAX_DEPTH} levels deep") from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
    return text


def strict_json(value: Any) -> Any:
    """``value`` with every float JSON cannot carry (NaN, Infinity, one read from
    ``1e400``) as None: what the CLI's ``--json`` and the dashboard print for other
    programs, which strict parsers (jq, a browser's JSON.parse) must read.  A
    stored value keeps its NaN; only this picture of it says null.  Values
    without such a float come back as they are (the common case: one walk)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: strict_json(child) for key, child in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(child) for child in value]
    return value


def check_depth(value: Any, limit: int = MAX_DEPTH, text: Optional[str] = None) -> None:
    """InvalidPayload if ``value`` (a payload or result a caller gave us) nests
    lists and objects deeper than ``limit``; ``text`` is its JSON, if known."""
    # Fewer brackets than levels allowed cannot nest too deep: most values
    # are never walked.
    if text is None and not isinstance(value, (dict, list, tuple)):
        return
    if text is not None and text.count("[") + text.count("{") <= limit:
        return
    if _depth(value) > limit:
        raise InvalidPayload(f"payload is nested more than {MAX_DEPTH} levels deep "
                             "(lists and objects), which a consumer might fail to decode")


def check_outcome(result: Any, reason: Optional[str], max_bytes: int) -> None:
    """InvalidPayload for a result nested too deep; PayloadTooLarge for a result (as
    JSON, or bytes) or a reason over ``max_bytes`` in UTF-8, the payloads' limit: a
    record carries both beside its payload, and etcd takes minutes over a value of
    tens of megabytes, then refuses it, while the item stays claimed and runs again."""
    if result is None and reason is None:  # most outcomes: nothing to check
        return
    check_depth(result)
    for what, value in (("result", result), ("reason", reason)):
        size = _size(value, text=what == "reason")
        if size > max_bytes:
            raise PayloadTooLarge(f"{what} too large: {size} bytes, over the limit of "
                                  f"{max_bytes}")


def _size(value: Any, *, text: bool = False) -> int:
    """The bytes ``value`` takes in a record: base64 for bytes, else its JSON;
    ``text``: a reason, as failure_text will make it encode (a lone surrogate is
    no error there). A result is the caller's value: InvalidPayload for one that
    JSON or UTF-8 can't carry (a str with a lone surrogate too)."""
    if value is None:  # most results and reasons: no encoding needed to know
        return len("null")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(payload_fields(value)["b"])
    if text and isinstance(value, str):  # a reason: failure_text makes any text encode
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    # Strict: a result is the caller's value (no NaN), though it is stored beside a
    # payload read from etcd (outcome_value encodes the record as stored).
    return len(_strict_text(value).encode("utf-8"))


def _depth(value: Any) -> int:
    """How deep ``value`` nests lists, tuples and dicts (no recursion: any depth)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            deepest = max(deepest, level)
            stack.extend((child, level + 1)
                         for child in (node.values() if isinstance(node, dict) else node)
                         if isinstance(child, (dict, list, tuple)))
    return deepest


def loads(raw: Optional[str]) -> Dict[str, Any]:
    """Decode one of our JSON objects, or raise Junk (also for one nested too
    deep for this thread's stack: RecursionError must never reach a claimer)."""
    try:
        doc = json.loads(raw or "")
    except (ValueError, RecursionError):
        raise Junk("not JSON, or nested too deep") from None
    if not isinstance(doc, dict):
        raise Junk("not a JSON object")
    return doc


def payload_fields(payload: Any) -> Dict[str, Any]:
    """The fields that carry ``payload``: ``p`` for JSON values, ``b`` for bytes."""
    if isinstance(payload, (bytes, bytearray, memoryview)):
        return {"b": base64.b64encode(bytes(payload)).decode("ascii")}
    return {"p": payload}


def payload_of(doc: Dict[str, Any]) -> Any:
    """The payload stored in ``doc`` by :func:`payload_fields`."""
    if "b" in doc:
        try:
            return base64.b64decode(doc["b"], validate=True)
        except (TypeError, ValueError, binascii.Error):
            raise Junk("bad base64 payload") from None
    if "p" not in doc:
        raise Junk("no payload")
    return doc["p"]


@dataclass
class Item:
    """An item in ``work/``.

    ``token`` is unique to the put (it finds a POST whose reply was lost),
    ``attempts`` counts claims so far and ``claim`` is the token of the latest
    claim: both are written by the claim's compare-and-swap on the item.
    ``outcome`` ("completed" or "failed") is set by the fenced commit F1,
    which rewrites the item as its :class:`Record` plus ``"o"``: from then on
    the item is finished, whatever happens to the steps after it.
    """

    payload: Any
    token: str
    attempts: int = 0
    claim: Optional[str] = None
    created: float = field(default_factory=SYSTEM.wall)
    outcome: Optional[str] = None
    #: Put back by requeue, or put with a delay (``q``): its first claim checks for
    #: records too (C3), since a requeue resumed late, or a late copy of a delayed
    #: put's PUT, could create it again after it finished.
    requeued: bool = False

    def encode(self, max_bytes: Optional[int] = None, *, stored: bool = False) -> str:
        """The item's value; ``stored``: its payload was read from etcd (no depth limit)."""
        doc: Dict[str, Any] = {"t": self.token, "a": self.attempts, "ts": round(self.created, 3)}
        if self.claim:
            doc["c"] = self.claim
        if self.requeued:
            doc["q"] = 1
        doc.update(payload_fields(self.payload))
        text = dumps(doc, stored=stored)
        size = len(text.encode("utf-8"))
        if max_bytes is not None and size > max_bytes:
            raise PayloadTooLarge(f"payload too large: the encoded item is {size} bytes, "
                                  f"over the limit of {max_bytes}")
        return text

    @classmethod
    def decode(cls, raw: Optional[str]) -> "Item":
        doc = loads(raw)
        token, attempts = doc.get("t"), doc.get("a", 0)
        if not isinstance(token, str) or not isinstance(attempts, int):
            raise Junk("not an etcdq_v2 item")
        claim, created, outcome = doc.get("c"), doc.get("ts"), doc.get("o")
        with _FIELDS:
            return cls(payload_of(doc), token, attempts,
                       claim if isinstance(claim, str) else None,
                       float(created) if isinstance(created, (int, float)) else 0.0,
                       outcome if outcome in OUTCOMES else None, bool(doc.get("q")))


@dataclass(frozen=True)
class TextBounds:
    """How many characters of a failure's reason and traceback a value keeps."""

    reason: int
    traceback: int


#: In a dead letter (F1's record) and in a delay lock (R1).
IN_RECORD = TextBounds(REASON_LIMIT, TRACEBACK_LIMIT)
IN_LOCK = TextBounds(LOCK_REASON_LIMIT, LOCK_TRACEBACK_LIMIT)


def failure_text(reason: Optional[str], traceback: Optional[str],
                 bounds: TextBounds) -> Tuple[Optional[str], Optional[str]]:
    """A failed attempt's reason and traceback as a value stores them: made to
    encode, and cut to ``bounds`` (the reason's start, the traceback's end).

    Both come from user code, and the write that carries them (R1, F1) must
    apply whatever they say, or the attempt is not retried after its backoff
    (nor dead-lettered): a str that UTF-8 cannot carry, as os.fsdecode makes
    of a file name that is not UTF-8 (a lone surrogate), has it escaped
    (``\\udcff``) instead of refused.  Idempotent: a stored text is kept as it is.
    """
    if reason is None and traceback is None:  # every complete(): four calls saved
        return None, None
    return (_bounded(_encodable(reason), bounds.reason, keep_end=False),
            _bounded(_encodable(traceback), bounds.traceback, keep_end=True))


def _encodable(text: Optional[str]) -> Optional[str]:
    """``text`` as a str UTF-8 can encode: lone surrogates backslash-escaped."""
    if text is None:
        return None
    text = str(text)
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _bounded(text: Optional[str], limit: int, *, keep_end: bool) -> Optional[str]:
    """``text`` cut to ``limit`` characters at most, the cut one saying how much
    was cut (its end kept, or its start)."""
    if text is None or len(text) <= limit:
        return text
    longest = len(f"[{len(text)} characters cut]\n")  # the note, for any cut up to the whole
    keep = max(limit - longest, 0)
    note = f"[{len(text) - keep} characters cut]"
    return f"{note}\n{text[-keep:] if keep else ''}" if keep_end else f"{text[:keep]}\n{note}"


def _optional_text(doc: Dict[str, Any], name: str) -> Optional[str]:
    value = doc.get(name)
    return value if isinstance(value, str) else None


def tombstone(new_id: str, token: Optional[str] = None) -> str:
    """What a requeued dead letter becomes (not a Record: every reader skips it).
    ``token``: the dead letter's put token, which import's I2 reads from it, so
    that the dead letter is not imported again once it was requeued."""
    doc: Dict[str, Any] = {"requeued_as": new_id}
    if token:
        doc["t"] = token
    return dumps(doc, stored=True)  # ``token`` is as stored: another writer's may not be strict


def tombstone_token(raw: Optional[str]) -> Optional[str]:
    """The put token a tombstone keeps; None for anything else (or an older tombstone)."""
    return _tombstone_field(raw, "t")


def requeued_as(raw: Optional[str]) -> Optional[str]:
    """The new item's id a requeue's tombstone names; None for anything else."""
    return _tombstone_field(raw, "requeued_as")


def _tombstone_field(raw: Optional[str], name: str) -> Optional[str]:
    """A text field of a tombstone (a value with ``requeued_as``); None if none."""
    try:
        doc = loads(raw)
    except Junk:
        return None
    return _optional_text(doc, name) if "requeued_as" in doc else None


@dataclass(frozen=True)
class Lock:
    """The value of ``locks/<id>``: whose claim it is, or a release delay.

    A delay lock that a failed attempt left (fail()'s backoff) carries that
    attempt's ``reason`` and ``traceback`` while the item waits for its retry.
    """

    node_id: str
    token: str
    delay: bool = False
    reason: Optional[str] = None
    traceback: Optional[str] = None

    def encode(self) -> str:
        doc: Dict[str, Any] = {"n": self.node_id, "c": self.token}
        if self.delay:
            doc["d"] = 1
        if self.reason is not None:
            doc["why"] = self.reason
        if self.traceback is not None:
            doc["tb"] = self.traceback
        return dumps(doc)

    @classmethod
    def decode(cls, raw: Optional[str]) -> "Lock":
        doc = loads(raw)
        node_id, token = doc.get("n"), doc.get("c")
        if not isinstance(node_id, str) or not isinstance(token, str):
            raise Junk("not an etcdq_v2 lock")
        return cls(node_id, token, bool(doc.get("d")), _optional_text(doc, "why"),
                   _optional_text(doc, "tb"))


@dataclass
class Record:
    """A completion record (``completed/<id>``) or a dead letter (``failed/<id>``)."""

    payload: Any
    claim: str
    node_id: str
    attempts: int
    created: float
    finished: float
    result: Any = None
    reason: Optional[str] = None
    requeue_token: Optional[str] = None
    token: Optional[str] = None  # the item's put token: finds a put whose reply was lost
    #: The item carried ``q`` (requeued, or put with a delay): the record is kept at
    #: least a week, so that a late re-creation of the item finds it (C3).
    requeued: bool = False
    #: The failed handler's traceback (bounded: TRACEBACK_LIMIT), beside ``reason``
    #: (REASON_LIMIT); see :func:`failure_text`.
    traceback: Optional[str] = None

    def encode(self, outcome: Optional[str] = None, *, stored: bool = False) -> str:
        """The record's value; with ``outcome``, the value of its item once committed.
        ``stored``: its payload and result were read from etcd, or checked
        (:func:`check_depth`) by the caller: no depth limit here."""
        doc: Dict[str, Any] = {
            "c": self.claim, "n": self.node_id, "a": self.attempts,
            "ts": round(self.created, 3), "fin": round(self.finished, 3)}
        if outcome is not None:
            doc["o"] = outcome
        if self.token:
            doc["t"] = self.token
        doc.update(payload_fields(self.payload))
        if self.reason is not None:
            doc["why"] = self.reason
        if self.traceback is not None:
            doc["tb"] = self.traceback
        if self.requeue_token:
            doc["rq"] = self.requeue_token
        if self.requeued:
            doc["q"] = 1
        doc["r"] = self.result
        return dumps(doc, stored=stored)

    @classmethod
    def decode(cls, raw: Optional[str]) -> "Record":
        doc = loads(raw)
        claim, node_id = doc.get("c"), doc.get("n")
        if not isinstance(claim, str) or not isinstance(node_id, str):
            raise Junk("not an etcdq_v2 record")
        reason, requeue, token = doc.get("why"), doc.get("rq"), doc.get("t")
        with _FIELDS:
            return cls(payload_of(doc), claim, node_id, int(doc.get("a", 0)),
                       float(doc.get("ts", 0.0)), float(doc.get("fin", 0.0)),
                       doc.get("r"), reason if isinstance(reason, str) else None,
                       requeue if isinstance(requeue, str) else None,
                       token if isinstance(token, str) else None, bool(doc.get("q")),
                       _optional_text(doc, "tb"))


class _Fields:
    """A field of the wrong type ("a": "zz", "ts": []) makes the value junk, never
    a bare ValueError or TypeError: every reader skips or reports junk.  A
    class, not a generator: entered at every decode, and a generator's
    context costs three more Python calls."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException],
                 tb: object) -> None:
        if exc_type is None or issubclass(exc_type, Junk):
            return
        if issubclass(exc_type, (ValueError, TypeError, OverflowError)):
            raise Junk(f"a field of the wrong type ({exc})") from None


_FIELDS = _Fields()
