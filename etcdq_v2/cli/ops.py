"""``etcdq stats``, ``requeue``, ``purge`` and ``drop``: a queue as a whole."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any, Dict

from ..errors import NotFound
from ..keys import typed_item_id
from ..queue import Counts, Queue
from .exits import EXIT_FAILURE, EXIT_OK, PROG, UsageError
from .items import ID_HELP
from .options import add_failed_ttl, add_queue_argument, number_in, open_queue, verb
from .output import Progress, StatusLine, print_json


def add_verbs(verbs: Any) -> None:
    for add in (_add_stats, _add_requeue, _add_purge, _add_drop):
        add(verbs)


# --------------------------------------------------------------------------
# stats
# --------------------------------------------------------------------------

def _add_stats(verbs: Any) -> None:
    parser = verb(verbs, "stats", cmd_stats, "count pending, running, completed, failed items",
                  epilog="'delayed' is a part of 'pending': items held back by a delay (a "
                         "delayed put, a failed attempt's backoff), not yet claimable. "
                         "'failed' counts dead letters.")
    add_queue_argument(parser)
    parser.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    parser.add_argument("--interval", type=number_in(float, 0, above=True), default=1.0,
                        metavar="S",
                        help="seconds between refreshes with --watch (default 1)")


def cmd_stats(args: argparse.Namespace) -> int:
    """``etcdq stats``, once or ``--watch``ed."""
    with open_queue(args) as queue:
        if not args.watch:
            _print_stats(queue.stats(), args.json)
            return EXIT_OK
        return _watch_stats(queue, args)


def _print_stats(counts: Counts, as_json: bool) -> None:
    if as_json:
        print_json(_with_delayed(counts))
    else:
        print(format_stats(counts))


def _with_delayed(counts: Counts) -> Dict[str, int]:
    return {**counts, "delayed": counts.delayed}


def format_stats(counts: Counts) -> str:
    """``pending 3 (delayed 1)  running 1  completed 0  failed 0``: delayed within pending."""
    return "  ".join(f"{name} {count}" + (f" (delayed {counts.delayed})"
                                          if name == "pending" else "")
                     for name, count in counts.items())


def _watch_stats(queue: Queue, args: argparse.Namespace) -> int:
    """Refresh in place on a terminal; one line per refresh elsewhere (logs, pipes)."""
    line = StatusLine(sys.stdout)
    try:
        while True:
            counts = queue.stats()
            if args.json:
                print_json(_with_delayed(counts))
                sys.stdout.flush()
            else:
                line.update(f"{time.strftime('%H:%M:%S')}  {format_stats(counts)}")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        line.close()
        return EXIT_OK


# --------------------------------------------------------------------------
# requeue, purge
# --------------------------------------------------------------------------

def _add_requeue(verbs: Any) -> None:
    parser = verb(verbs, "requeue", cmd_requeue, "move dead letters back to the queue",
                  usage=f"{PROG} requeue QUEUE (ID... | --all-failed)")
    add_queue_argument(parser)
    parser.add_argument("ids", nargs="*", metavar="ID", help=ID_HELP)
    parser.add_argument("--all-failed", action="store_true", help="every dead letter")


def cmd_requeue(args: argparse.Namespace) -> int:
    """``etcdq requeue``: prints ``OLD -> NEW`` as each item moves."""
    if bool(args.ids) == args.all_failed:
        raise UsageError("give item ids or --all-failed (not both)")
    moved = []
    with open_queue(args) as queue:
        ids = [typed_item_id(item_id) for item_id in args.ids] or \
            [info.id for info in queue.items("failed")]
        for item_id in ids:
            new_id = queue.requeue(item_id)
            moved.append({"id": item_id, "new_id": new_id})
            if not args.json:
                print(f"{item_id} -> {new_id}", flush=True)
    if args.json:
        print_json(moved)
    return EXIT_OK


def _add_purge(verbs: Any) -> None:
    parser = verb(verbs, "purge", cmd_purge, "remove completion records and/or dead letters",
                  usage=f"{PROG} purge QUEUE (--completed | --failed | --all) [--yes]")
    add_queue_argument(parser)
    parser.add_argument("--completed", action="store_true", help="the completion records")
    parser.add_argument("--failed", action="store_true", help="the dead letters")
    parser.add_argument("--all", action="store_true", help="both")
    add_yes(parser)


def cmd_purge(args: argparse.Namespace) -> int:
    """``etcdq purge``, after a confirmation unless ``--yes``; a long one shows its
    progress on a terminal's stderr."""
    completed, failed = args.completed or args.all, args.failed or args.all
    if not (completed or failed):
        raise UsageError("say what to purge: --completed, --failed or --all")
    with open_queue(args) as queue:
        if not args.yes and not _confirm_purge(queue, completed, failed):
            print(f"{PROG}: error: purge not confirmed; nothing removed", file=sys.stderr)
            return EXIT_FAILURE
        with Progress("purged") as progress:
            removed = queue.purge(completed=completed, failed=failed, progress=progress.advance)
    if args.json:
        print_json({"removed": removed})
    else:
        print(f"removed {removed} record(s)")
    return EXIT_OK


def _confirm_purge(queue: Queue, completed: bool, failed: bool) -> bool:
    counts = queue.stats()
    what = " and ".join(f"{counts[kind]} {kind}" for kind, chosen
                        in (("completed", completed), ("failed", failed)) if chosen)
    return confirmed(f"Remove {what} record(s) of queue {queue.name}?")


def add_yes(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask")


def confirmed(question: str) -> bool:
    """Ask ``question`` on stderr; True for a "y" or "yes" read from stdin."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print(file=sys.stderr)  # no terminal echoed the answer and its newline
    return answer.strip().lower() in ("y", "yes")


# --------------------------------------------------------------------------
# drop
# --------------------------------------------------------------------------

def _add_drop(verbs: Any) -> None:
    parser = verb(verbs, "drop", cmd_drop, "empty a queue: cancel every pending item",
                  usage=f"{PROG} drop QUEUE --pending [--yes]",
                  epilog="Each pending item is cancelled as 'etcdq cancel' does: it becomes "
                         "a dead letter with the reason 'cancelled' ('etcdq requeue "
                         "--all-failed' brings them back; 'etcdq purge --failed' removes "
                         "them). Items running meanwhile are left to finish. Asks first; "
                         "without a terminal to ask on, give --yes. Exit status 1: not "
                         "confirmed, nothing cancelled.")
    add_queue_argument(parser)
    parser.add_argument("--pending", action="store_true", required=True,
                        help="cancel the pending items (the only kind drop removes)")
    add_yes(parser)
    add_failed_ttl(parser)


def cmd_drop(args: argparse.Namespace) -> int:
    """``etcdq drop --pending``: prints how many items were cancelled."""
    with open_queue(args, failed_ttl=args.failed_ttl) as queue:
        if not args.yes and not _confirm_drop(queue):
            return EXIT_FAILURE
        with Progress("cancelled") as progress:
            cancelled = sum(_cancel(queue, info.id, progress) for info in queue.items("pending"))
    if args.json:
        print_json({"cancelled": cancelled})
    else:
        print(f"cancelled {cancelled} pending item(s) of queue {queue.name}")
    return EXIT_OK


def _confirm_drop(queue: Queue) -> bool:
    if not sys.stdin.isatty():
        print(f"{PROG}: error: drop not confirmed (no terminal to ask on): give --yes; "
              "nothing cancelled", file=sys.stderr)
        return False
    if confirmed(f"Cancel the {queue.stats()['pending']} pending item(s) of queue "
                 f"{queue.name}?"):
        return True
    print(f"{PROG}: error: drop not confirmed; nothing cancelled", file=sys.stderr)
    return False


def _cancel(queue: Queue, item_id: str, progress: Progress) -> bool:
    """Cancel one listed item: False if it started running (or finished, or went) since."""
    try:
        cancelled = queue.cancel(item_id)
    except NotFound:  # finished and purged, or dropped by another drop, since the listing
        cancelled = False
    progress.advance()
    return cancelled
