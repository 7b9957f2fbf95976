"""``etcdq export`` and ``import``: a queue as JSON lines, to move it to another cluster."""
from __future__ import annotations

import argparse
import contextlib
import sys
from typing import IO, Any, Dict, Iterator

from ..queue import DEFAULT_COMPLETED_TTL
from ..transfer import STATES
from .exits import EXIT_OK, UsageError
from .options import add_failed_ttl, add_queue_argument, number_or_none, open_queue, verb
from .output import Progress, print_json


def add_verbs(verbs: Any) -> None:
    for add in (_add_export, _add_import):
        add(verbs)


# --------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------

def _add_export(verbs: Any) -> None:
    parser = verb(verbs, "export", cmd_export,
                  "write a queue's items and records to stdout as JSON lines",
                  epilog="One line per item or record, for 'etcdq import': pending items "
                         "with their attempts (running ones as pending), completion records "
                         "with their results, dead letters with their reasons; bytes "
                         "payloads in base64. Read as etcd sends it: memory does not grow "
                         "with the queue. Stop the workers first for an exact copy: an item "
                         "that finishes during the export may be written twice, and then "
                         "runs again after the import. Exit status 3: etcd could not be "
                         "reached, or a listing broke off: the output is incomplete, run it "
                         "again. E.g. etcdq export jobs > jobs.jsonl")
    add_queue_argument(parser)
    parser.add_argument("--state", choices=STATES,
                        help="only the items in this state (default: all)")


def cmd_export(args: argparse.Namespace) -> int:
    """``etcdq export``: UTF-8 lines on stdout, whatever the locale; a long export shows
    its progress on a terminal's stderr."""
    out = sys.stdout.buffer
    with open_queue(args) as queue, Progress("exported") as progress:
        for line in queue.export_items(args.state):
            out.write(line.encode("utf-8"))
            progress.advance()
    out.flush()
    return EXIT_OK


# --------------------------------------------------------------------------
# import
# --------------------------------------------------------------------------

def _add_import(verbs: Any) -> None:
    parser = verb(verbs, "import", cmd_import,
                  "store the items and records of 'etcdq export' lines in a queue",
                  epilog="A line whose item the queue already holds (the same put token) "
                         "is skipped, so importing a file twice, or again after an import "
                         "that stopped half-way, stores each item once. One import at a "
                         "time per queue: another waits for it. Imported items are claimable "
                         "at once (delays are not exported). Exit status: 0 every line "
                         "stored or skipped; 2 a bad line (the lines before it are stored: "
                         "fix it and run again); 3 etcd could not be reached (run again).")
    add_queue_argument(parser)
    parser.add_argument("file", nargs="?", default="-", metavar="FILE",
                        help="the lines to import ('-' or none: stdin)")
    parser.add_argument("--completed-ttl", type=number_or_none(float), metavar="S",
                        default=DEFAULT_COMPLETED_TTL,
                        help="keep imported completion records S seconds ('none': until "
                             f"purged; default {DEFAULT_COMPLETED_TTL})")
    add_failed_ttl(parser)


def cmd_import(args: argparse.Namespace) -> int:
    """``etcdq import``: prints what was stored and skipped."""
    options = {"completed_ttl": args.completed_ttl, "failed_ttl": args.failed_ttl}
    with _lines(args.file) as lines, open_queue(args, **options) as queue, \
            Progress("imported") as progress:
        counts = queue.import_items(lines, progress=progress.advance)
    if args.json:
        print_json(counts)
    else:
        print(_summary(counts))
    return EXIT_OK


@contextlib.contextmanager
def _lines(path: str) -> Iterator[IO[bytes]]:
    """The file's lines as bytes (stdin for '-'): the library decodes and checks each."""
    if path == "-":
        yield sys.stdin.buffer
        return
    try:
        handle = open(path, "rb")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        yield handle


def _summary(counts: Dict[str, int]) -> str:
    stored = sum(count for state, count in counts.items() if state != "skipped")
    parts = ", ".join(f"{state} {count}" for state, count in counts.items()
                      if state != "skipped")
    return f"stored {stored} ({parts}); skipped {counts['skipped']} already in the queue"
