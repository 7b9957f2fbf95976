"""Export and import: a queue as JSON lines, to move it to another etcd cluster.

etcd 3.6 removed the v2 API and refuses to start on a v2 store that holds
keys, so a queue leaves such a cluster as a file: :func:`export_lines`
writes one JSON line per item or record, :func:`import_lines` stores them in
a queue of a cluster that still serves v2.  A line::

    {"id": "00000000000000000042", "state": "pending", "token": "9f0c...",
     "attempts": 1, "created": 1764523200.5, "payload": {"to": "ada"}}

* ``state``: pending, completed or failed.  A running item is exported as
  pending, its attempts unchanged: its claim counts as an attempt, as a
  crashed worker's does.  An item committed (F1) but not yet recorded is
  exported as its record.
* ``payload``, or ``payload_base64`` for a bytes payload (standard base64,
  as the codec stores it).
* A record adds ``node``, ``claim`` (its claim token), ``finished``,
  ``result`` and, if it has one, ``reason``.
* ``rq``, on a dead letter whose requeue began (Q1): the requeue token, which
  is the put token of the item the requeue makes.  Import skips such a dead
  letter when that token is in the queue (the item is; export writes work/
  first): a requeue stopped after Q3 does not leave it to run twice.
* ``token``: the item's put token (a 0.1.0 record, which has none: its claim
  token).  Import skips a line whose token the queue already holds, so a
  file imported twice, or again after an import that stopped half-way,
  stores each item once.
* ``id``: the item's id in the exported queue, for the reader; the import
  names each item and record itself (docs/protocol.md, "import").

A payload is written as it is stored, however deep (an item put by 0.1.0 may
nest deeper than MAX_DEPTH); import checks the depth as put does.

Delays and backoffs are not exported: an imported item is claimable at once.

Memory: export reads each directory as its listing arrives
(:mod:`etcdq_v2.listing`), holding one entry at a time, plus the ids of the
running items and of items committed but not yet recorded.  Import holds the
set of put tokens: those already in the queue and those it stored (about
100 bytes per item).
"""
from __future__ import annotations

import base64
import binascii
import itertools
import json
from typing import (IO, Any, Callable, Dict, Iterable, Iterator, Optional, Set, Tuple, TypeVar,
                    Union)

from .codec import Item, Junk, Record, check_outcome, dumps
from .errors import InvalidArgument, public_errors
from .protocol import COMPLETED, FAILED, Entry, Protocol
from .runtime import SYSTEM

T = TypeVar("T")

#: What export can select (``state=``); running items are written as pending.
STATES = ("pending", "running", COMPLETED, FAILED)
#: The states a line can carry.
LINE_STATES = ("pending", COMPLETED, FAILED)
Line = Union[str, bytes]


def guarded(lines: Iterator[T]) -> Iterator[T]:
    """``lines`` with the library's errors only, also while they are read
    (``public_errors`` as a decorator covers only the creation of a generator)."""
    with public_errors():
        yield from lines


# -- export ---------------------------------------------------------------------

def export_lines(protocol: Protocol, state: Optional[str] = None) -> Iterator[str]:
    """The queue's items and records (or those in ``state``) as JSON lines, "\\n"-ended.

    work/ is read first, then completed/ and failed/, each as its listing
    arrives.  Each listing is a snapshot of its directory: an item that
    finishes while the export runs may appear twice (pending, then in its
    record: an import keeps the first, and the item runs again), never not
    at all, except an item requeued meanwhile (failed/ -> work/ after work/
    was listed): it is missing.  Stop the workers and requeues first for an
    exact copy.
    """
    wanted = STATES if state is None else (state,)
    claimed = protocol.claimed_ids() if {"pending", "running"} & set(wanted) else set()
    committed: Set[str] = set()
    for entry, item in protocol.streamed("work"):
        if item.outcome:  # committed (F1), not yet recorded (F2): the record is in the item
            committed.add(entry.id)
            if item.outcome in wanted:
                yield from _committed_line(entry, item.outcome)
        elif ("running" if entry.id in claimed else "pending") in wanted:
            yield _item_line(entry.id, item)
    for kind in (COMPLETED, FAILED):
        if kind in wanted:
            for entry, record in protocol.streamed(kind):
                if entry.id not in committed:  # else written from its item above
                    yield _record_line(entry.id, kind, record)


def _committed_line(entry: Entry, kind: str) -> Iterator[str]:
    try:
        yield _record_line(entry.id, kind, Record.decode(entry.value))
    except Junk:  # an outcome without a record: not ours, as get() says
        return


def _item_line(item_id: str, item: Item) -> str:
    doc: Dict[str, Any] = {"id": item_id, "state": "pending", "token": item.token,
                           "attempts": item.attempts, "created": round(item.created, 3)}
    doc.update(_payload_fields(item.payload))
    return dumps(doc, stored=True) + "\n"  # as stored: a 0.1.0 item may be deeper


def _record_line(item_id: str, kind: str, record: Record) -> str:
    doc: Dict[str, Any] = {"id": item_id, "state": kind, "token": record.token or record.claim,
                           "attempts": record.attempts, "created": round(record.created, 3)}
    doc.update(_payload_fields(record.payload))
    doc.update(node=record.node_id, claim=record.claim, finished=round(record.finished, 3),
               result=record.result)
    if record.reason is not None:
        doc["reason"] = record.reason
    if record.requeue_token:  # a requeue began (Q1): its new item may be in the file too
        doc["rq"] = record.requeue_token
    return dumps(doc, stored=True) + "\n"  # as stored, however deep (see _item_line)


def _payload_fields(payload: Any) -> Dict[str, Any]:
    if isinstance(payload, bytes):
        return {"payload_base64": base64.b64encode(payload).decode("ascii")}
    return {"payload": payload}


# -- import ---------------------------------------------------------------------

def import_lines(protocol: Protocol, lines: Iterable[Line],
                 progress: Optional[Callable[[], Any]] = None) -> Dict[str, int]:
    """Store each line's item or record unless its token is in the queue (I1-I5).

    Returns how many were stored per state, and how many were ``skipped``
    (already there).  A bad line raises InvalidArgument naming it; nothing
    is written for it, the lines before it are stored, and a re-run skips
    them.  ``progress`` is called after each line.
    """
    counts = {"pending": 0, COMPLETED: 0, FAILED: 0, "skipped": 0}
    if hasattr(lines, "readline"):  # a file: never a whole overlong line in memory
        lines = limited_lines(lines, line_limit(protocol.max_payload))  # type: ignore[arg-type]
    wall = protocol.runtime.wall
    parsed = (entry for entry in (parse_line(number, line, protocol.max_payload, wall)
                                  for number, line in enumerate(lines, 1)) if entry is not None)
    # The first line is parsed before I1 writes anything: a file that is not an
    # export (or is empty) leaves no trace, not even the queue's directory.
    first = next(parsed, None)
    if first is None:
        return counts
    state = protocol.begin_import()  # I1, I2
    try:
        for kind, raw, token, line_state, requeued_as in itertools.chain([first], parsed):
            if token in state.tokens or requeued_as in state.tokens:
                counts["skipped"] += 1
            else:
                protocol.import_value(state, kind, raw, token)  # I3 (I4)
                counts[line_state] += 1
            if progress is not None:
                progress()
    finally:
        protocol.end_import(state)  # I5
    return counts


def line_limit(max_payload: int) -> int:
    """The longest line export writes for this payload limit: a record's payload, result
    and reason (each at most the limit), and its other fields."""
    return 3 * max_payload + 64 * 1024


def limited_lines(stream: "IO[Any]", limit: int) -> Iterator[Line]:
    """The lines of ``stream``, each read up to ``limit`` + 1 characters: a longer one
    raises InvalidArgument naming it, before the rest of it is read."""
    for number in itertools.count(1):
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) > limit:
            raise InvalidArgument(f"line {number}: longer than {limit} bytes, more than "
                                  "export writes for this queue's payload limit; nothing was "
                                  "stored for it (the lines before it were; a re-run skips "
                                  "them)")
        yield line


def parse_line(number: int, line: Line, max_payload: int,
               wall: Callable[[], float] = SYSTEM.wall
               ) -> Optional[Tuple[str, str, str, str, Optional[str]]]:
    """``(directory, value, token, state, rq)`` of one line, None for a blank line;
    InvalidArgument naming the line if it is not one that export writes.  ``rq``:
    a dead letter's requeue token, the put token of the item its requeue made.
    ``wall``: the clock that dates a line without a creation time."""
    try:
        return _parsed(line, max_payload, wall)
    except ValueError as exc:  # also InvalidPayload, UnicodeDecodeError, JSONDecodeError
        problem = str(exc)
    except RecursionError:  # json.loads on a line nested thousands of levels deep
        problem = "nested too deeply"
    except OverflowError:  # a number too large for a float (a time, say)
        problem = "a number out of range"
    raise InvalidArgument(f"line {number}: {problem}; nothing was stored for it (the lines "
                          "before it were; a re-run skips them)")


def _parsed(line: Line, max_payload: int, wall: Callable[[], float]
            ) -> Optional[Tuple[str, str, str, str, Optional[str]]]:
    text = line.decode("utf-8") if isinstance(line, bytes) else line
    if not text.strip():
        return None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    state = doc.get("state")
    if state not in LINE_STATES:
        raise ValueError(f"{_field(doc, 'state')}: expected one of {', '.join(LINE_STATES)}")
    token = _text(doc, "token")
    attempts, created = doc.get("attempts", 0), _seconds(doc, "created", wall())
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
        raise ValueError(f"{_field(doc, 'attempts')}: expected a whole number >= 0")
    payload = _payload(doc)
    if state == "pending":
        # put's limit, on the item as put stores it: I3's "q" (6 bytes more) does not count,
        # or an item just under the limit in the source could not be imported.
        Item(payload, token, attempts, created=created).encode(max_payload)
        item = Protocol.imported_item(payload, token, attempts, created)
        return "work", item.encode(), token, state, None
    check_outcome(doc.get("result"), _reason(doc), max_payload)  # as finish checks them
    record = Record(payload, _text(doc, "claim"), _text(doc, "node"), attempts, created,
                    _seconds(doc, "finished"), doc.get("result"), _reason(doc), token=token)
    return state, record.encode(), token, state, _requeue_token(doc)


def _payload(doc: Dict[str, Any]) -> Any:
    if ("payload" in doc) == ("payload_base64" in doc):
        raise ValueError("expected exactly one of payload and payload_base64")
    if "payload" in doc:
        return doc["payload"]
    try:
        return base64.b64decode(_text(doc, "payload_base64", empty=True), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"payload_base64 is not base64 ({exc})") from None


def _text(doc: Dict[str, Any], name: str, *, empty: bool = False) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or not (value or empty):
        raise ValueError(f"{_field(doc, name)}: expected a{'' if empty else ' non-empty'} string")
    return value


def _seconds(doc: Dict[str, Any], name: str, default: Optional[float] = None) -> float:
    value = doc.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{_field(doc, name)}: expected a time in seconds since the epoch")
    return float(value)


def _requeue_token(doc: Dict[str, Any]) -> Optional[str]:
    if doc.get("rq") is None:
        return None
    if doc.get("state") != FAILED:
        raise ValueError("rq: only a dead letter (state failed) has a requeue token")
    return _text(doc, "rq")


def _reason(doc: Dict[str, Any]) -> Optional[str]:
    reason = doc.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise ValueError(f"{_field(doc, 'reason')}: expected a string")
    return reason


def _field(doc: Dict[str, Any], name: str) -> str:
    """A field of a bad line as the line spells it (JSON: null, not Python's None)."""
    if name not in doc:
        return f"{name} missing"
    return f"{name} {json.dumps(doc[name], ensure_ascii=False)[:80]}"
