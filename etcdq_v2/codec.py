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
import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, Optional

from .errors import InvalidPayload, PayloadTooLarge

DEFAULT_MAX_PAYLOAD = 1 << 20
#: How deep a payload or result may nest lists and objects (``[[1]]`` is 2).
MAX_DEPTH = 100
#: The record kinds, which are also the outcomes a fenced commit writes into an item.
OUTCOMES = ("completed", "failed")


class Junk(ValueError):
    """A value that etcdq_v2 did not write (or cannot read). Internal."""


def new_token() -> str:
    """A random token, unique for practical purposes (96 bits)."""
    return os.urandom(12).hex()


#: One encoder for every value: json.dumps with options builds a new one per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def dumps(doc: Dict[str, Any], *, stored: bool = False) -> str:
    """Compact JSON; raises InvalidPayload for what JSON or UTF-8 can't carry,
    and for a payload (or result) in ``doc`` nested deeper than MAX_DEPTH,
    unless ``stored``: ``doc`` carries a payload read back from etcd (it
    decoded), which is written back as it is, however deep."""
    try:
        text = _ENCODER.encode(doc)
        text.encode("utf-8")
    except RecursionError:
        raise InvalidPayload(f"payload is nested more than {MAX_DEPTH} levels deep") from None
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON-serialisable: {exc}") from None
    # Fewer brackets than levels allowed cannot nest too deep: most values
    # are never walked.  ``doc`` itself is one level more than its fields.
    if not stored:  # ``doc`` itself is one level more than its fields
        check_depth(doc, MAX_DEPTH + 1, text)
    return text


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
    check_depth(result)
    for what, value in (("result", result), ("reason", reason)):
        size = _size(value)
        if size > max_bytes:
            raise PayloadTooLarge(f"{what} too large: {size} bytes, over the limit of "
                                  f"{max_bytes}")


def _size(value: Any) -> int:
    """The bytes ``value`` takes in a record: base64 for bytes, else its JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(payload_fields(value)["b"])
    return len(dumps({"r": value}, stored=True).encode("utf-8")) - len('{"r":}')


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
    created: float = field(default_factory=time.time)
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
        with _fields():
            return cls(payload_of(doc), token, attempts,
                       claim if isinstance(claim, str) else None,
                       float(created) if isinstance(created, (int, float)) else 0.0,
                       outcome if outcome in OUTCOMES else None, bool(doc.get("q")))


def tombstone(new_id: str, token: Optional[str] = None) -> str:
    """What a requeued dead letter becomes (not a Record: every reader skips it).
    ``token``: the dead letter's put token, which import's I2 reads from it, so
    that the dead letter is not imported again once it was requeued."""
    doc: Dict[str, Any] = {"requeued_as": new_id}
    if token:
        doc["t"] = token
    return dumps(doc)


def tombstone_token(raw: Optional[str]) -> Optional[str]:
    """The put token a tombstone keeps; None for anything else (or an older tombstone)."""
    try:
        doc = loads(raw)
    except Junk:
        return None
    token = doc.get("t")
    return token if "requeued_as" in doc and isinstance(token, str) else None


@dataclass(frozen=True)
class Lock:
    """The value of ``locks/<id>``: whose claim it is, or a release delay."""

    node_id: str
    token: str
    delay: bool = False

    def encode(self) -> str:
        doc: Dict[str, Any] = {"n": self.node_id, "c": self.token}
        if self.delay:
            doc["d"] = 1
        return dumps(doc)

    @classmethod
    def decode(cls, raw: Optional[str]) -> "Lock":
        doc = loads(raw)
        node_id, token = doc.get("n"), doc.get("c")
        if not isinstance(node_id, str) or not isinstance(token, str):
            raise Junk("not an etcdq_v2 lock")
        return cls(node_id, token, bool(doc.get("d")))


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
        with _fields():
            return cls(payload_of(doc), claim, node_id, int(doc.get("a", 0)),
                       float(doc.get("ts", 0.0)), float(doc.get("fin", 0.0)),
                       doc.get("r"), reason if isinstance(reason, str) else None,
                       requeue if isinstance(requeue, str) else None,
                       token if isinstance(token, str) else None, bool(doc.get("q")))


@contextlib.contextmanager
def _fields() -> Iterator[None]:
    """A field of the wrong type ("a": "zz", "ts": []) makes the value junk, never
    a bare ValueError or TypeError: every reader skips or reports junk."""
    try:
        yield
    except Junk:
        raise
    except (ValueError, TypeError, OverflowError) as exc:
        raise Junk(f"a field of the wrong type ({exc})") from None
