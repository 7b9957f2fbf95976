"""``etcdq put``, ``ls``, ``show``, ``wait`` and ``cancel``: items one by one."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..errors import InvalidPayload, NotFound
from ..keys import typed_item_id
from ..protocol import MAX_IN_FLIGHT, MAX_TTL
from ..queue import Queue
from .exits import (EXIT_FAILURE, EXIT_NOT_FOUND, EXIT_OK, EXIT_TIMEOUT, PROG, UsageError,
                    worst)
from .options import add_failed_ttl, add_queue_argument, number_in, open_queue, verb
from .output import Progress, format_value, info_fields, print_json, print_table

STATES = ("pending", "running", "completed", "failed")
#: The help of every ID argument.
ID_HELP = "an item id, as put and ls print it (leading zeros may be left out)"


def add_verbs(verbs: Any) -> None:
    for add in (_add_put, _add_ls, _add_show, _add_wait, _add_cancel):
        add(verbs)


# --------------------------------------------------------------------------
# put
# --------------------------------------------------------------------------

def _add_put(verbs: Any) -> None:
    parser = verb(verbs, "put", cmd_put, "add items; prints their ids",
                  intermixed="payloads", after_dashes="payloads",
                  epilog="Payloads are put in this order: the PAYLOAD arguments, then "
                         "each --file, each --json-file, then --raw's. E.g. etcdq put jobs "
                         "--file photo.png; etcdq put jobs --json-file job.json; "
                         "producer | etcdq put jobs --raw")
    add_queue_argument(parser)
    parser.add_argument("payloads", nargs="*", metavar="PAYLOAD",
                        help="parsed as JSON, else taken as a string; '-' reads one "
                             "payload per line from stdin (UTF-8)")
    parser.add_argument("--file", action="append", default=[], metavar="PATH",
                        help="a file's bytes as one payload (repeatable)")
    parser.add_argument("--json-file", action="append", default=[], metavar="PATH",
                        help="a file's JSON document as one payload (repeatable)")
    parser.add_argument("--raw", action="store_true",
                        help="read stdin whole as one bytes payload (any bytes)")
    parser.add_argument("--delay", type=_delay, metavar="S",
                        help="claimable only after S seconds (etcd's clock; rounded up to "
                             "whole seconds)")
    parser.add_argument("--in-flight", type=number_in(int, 1, MAX_IN_FLIGHT), default=1,
                        metavar="N",
                        help="puts awaiting etcd at once (default 1: strictly in order); "
                             f"more, up to {MAX_IN_FLIGHT}, go faster and keep the order to "
                             "within N places")


def _delay(text: str) -> float:
    """``--delay``: seconds, a finite number >= 0 (argparse reports anything else)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_TTL:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 to {MAX_TTL}, not {text!r}")
    return seconds


def parse_payload(text: str) -> Any:
    """JSON if ``text`` is JSON (but not NaN/Infinity, which JSON lacks), else the string."""
    try:
        return _strict_json(text)
    except ValueError:
        return text


def _strict_json(text: str) -> Any:
    """json.loads, but NaN and Infinity (not JSON) raise ValueError."""
    return json.loads(text, parse_constant=_no_constant)


def _no_constant(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _stdin_payloads() -> Iterator[Any]:
    for number, line in enumerate(sys.stdin.buffer, 1):
        try:
            text = line.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise InvalidPayload(f"stdin line {number} is not UTF-8: {exc} (for bytes: --raw, "
                                 "or --file PATH)") from None
        if text:
            yield parse_payload(text)


def _payloads(args: argparse.Namespace) -> List[Any]:
    """Every payload the command line gives, in the order ``put --help`` says."""
    if args.raw and "-" in args.payloads:
        raise UsageError("stdin can be read once: give '-' (a payload per line) or --raw "
                         "(one payload), not both")
    payloads: List[Any] = []
    for argument in args.payloads:
        if argument == "-":
            payloads.extend(_stdin_payloads())
        else:
            payloads.append(parse_payload(argument))
    payloads.extend(_read(path) for path in args.file)
    payloads.extend(_json_document(path) for path in args.json_file)
    if args.raw:
        payloads.append(sys.stdin.buffer.read())
    return payloads


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def _json_document(path: str) -> Any:
    """The JSON document in the file (UTF-8, no NaN or Infinity), else InvalidPayload."""
    try:
        return _strict_json(_read(path).decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError, JSONDecodeError too
        raise InvalidPayload(f"{path} is not a JSON document: {exc}") from None


def cmd_put(args: argparse.Namespace) -> int:
    """``etcdq put``: every payload is checked before the first is written.

    A long put (``put -`` of a large file) shows its progress on a terminal's stderr.
    """
    with open_queue(args) as queue:
        payloads = _payloads(args)
        if not payloads:
            raise UsageError("nothing to put: give payloads, '-' to read them from stdin, "
                             "--file, --json-file or --raw")
        with Progress("put") as progress:
            ids = queue.put_many(payloads, delay=args.delay, progress=progress.advance,
                                 in_flight=args.in_flight)
    if args.json:
        print_json(ids)
    else:
        print("\n".join(ids))
    return EXIT_OK


# --------------------------------------------------------------------------
# ls, show
# --------------------------------------------------------------------------

def _add_ls(verbs: Any) -> None:
    parser = verb(verbs, "ls", cmd_ls, "list items, oldest first")
    add_queue_argument(parser)
    parser.add_argument("--state", choices=STATES, default="pending",
                        help="the items in this state (default pending)")
    parser.add_argument("--limit", type=number_in(int, 1), metavar="N", help="at most N items")


def cmd_ls(args: argparse.Namespace) -> int:
    """``etcdq ls``."""
    with open_queue(args) as queue:
        items = queue.items(args.state, limit=args.limit)
    if args.json:
        print_json([dataclasses.asdict(info) for info in items])
    elif items:
        print_table(items, args.state)
    return EXIT_OK


def _add_show(verbs: Any) -> None:
    parser = verb(verbs, "show", cmd_show, "show one item, wherever it is")
    add_queue_argument(parser)
    parser.add_argument("id", metavar="ID", help=ID_HELP)


def cmd_show(args: argparse.Namespace) -> int:
    """``etcdq show``."""
    with open_queue(args) as queue:
        info = queue.get(typed_item_id(args.id))
    if args.json:
        print_json(dataclasses.asdict(info))
        return EXIT_OK
    fields = info_fields(info)
    width = max(len(name) for name, _ in fields) + 1
    for name, text in fields:
        print(f"{name + ':':<{width}} {text}")
    return EXIT_OK


# --------------------------------------------------------------------------
# wait, cancel
# --------------------------------------------------------------------------

def _add_wait(verbs: Any) -> None:
    parser = verb(verbs, "wait", cmd_wait, "wait until items are completed or failed",
                  epilog="Prints one line per item as it finishes: its id, state and "
                         "result (or failure reason). Exit status: 0 all completed, 1 any "
                         "failed (a cancelled item is failed), 124 the timeout passed "
                         "first, 5 an unknown id (5 wins over 124, 124 over 1).")
    add_queue_argument(parser)
    parser.add_argument("ids", nargs="+", metavar="ID", help=ID_HELP)
    parser.add_argument("--timeout", type=number_in(float, 0), metavar="S",
                        help="give up after S seconds, for all the ids together "
                             "(default: wait as long as it takes)")


def cmd_wait(args: argparse.Namespace) -> int:
    """``etcdq wait``: each id in turn, within one --timeout for them all."""
    ids = [typed_item_id(item_id) for item_id in args.ids]
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    results = []
    with open_queue(args) as queue:
        for item_id in ids:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            results.append(_waited(queue, item_id, remaining, args.json))
    if args.json:
        print_json([doc for _, doc in results])
    return worst([code for code, _ in results], (EXIT_NOT_FOUND, EXIT_TIMEOUT, EXIT_FAILURE))


def _waited(queue: Queue, item_id: str, timeout: Optional[float],
            as_json: bool) -> Tuple[int, Dict[str, Any]]:
    """Wait for one item (a look only, once the timeout passed): its exit status and
    what ``--json`` prints of it."""
    try:
        info = queue.wait(item_id, timeout)
    except NotFound as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_NOT_FOUND, {"id": item_id, "state": None, "error": "not found"}
    if info is None:
        if not as_json:
            print(f"{item_id}  timed out", flush=True)
        return EXIT_TIMEOUT, {"id": item_id, "state": None, "error": "timed out"}
    if not as_json:
        detail = info.result if info.state == "completed" else info.reason
        followed = f"  (requeued as {info.id})" if info.requeued_from else ""
        print(f"{item_id}  {info.state}  {format_value(detail)}{followed}", flush=True)
    return (EXIT_OK if info.state == "completed" else EXIT_FAILURE), dataclasses.asdict(info)


def _add_cancel(verbs: Any) -> None:
    parser = verb(verbs, "cancel", cmd_cancel,
                  "dead-letter pending items with the reason 'cancelled'",
                  epilog="An item already running or finished is left alone. Exit status: "
                         "0 every id was cancelled, 1 any was running or finished, 5 any "
                         "is unknown (5 wins over 1); 3 when etcd could not be reached, or "
                         "the item's lock not held long enough to cancel it (the ids after "
                         "it are not tried). 'etcdq requeue' brings one back.")
    add_queue_argument(parser)
    parser.add_argument("ids", nargs="+", metavar="ID", help=ID_HELP)
    add_failed_ttl(parser)


def cmd_cancel(args: argparse.Namespace) -> int:
    """``etcdq cancel``: prints each id with what became of it."""
    ids = [typed_item_id(item_id) for item_id in args.ids]
    with open_queue(args, failed_ttl=args.failed_ttl) as queue:
        results = [_cancelled(queue, item_id, args.json) for item_id in ids]
    if args.json:
        print_json([doc for _, doc in results])
    return worst([code for code, _ in results], (EXIT_NOT_FOUND, EXIT_FAILURE))


def _cancelled(queue: Queue, item_id: str, as_json: bool) -> Tuple[int, Dict[str, Any]]:
    try:
        cancelled = queue.cancel(item_id)
    except NotFound as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_NOT_FOUND, {"id": item_id, "cancelled": False, "error": "not found"}
    if not as_json:
        print(f"{item_id}  {'cancelled' if cancelled else 'not cancelled: running or finished'}",
              flush=True)
    return (EXIT_OK if cancelled else EXIT_FAILURE), {"id": item_id, "cancelled": cancelled}
