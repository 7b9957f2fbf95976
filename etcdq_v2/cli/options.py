"""The global options, and the options and arguments several verbs share.

Global options may come before or after the verb (``etcdq stats q --json``),
and take their defaults from ``ETCDQ_*`` environment variables.  They also
describe the connection: :func:`open_queue` opens a Queue on it, and
:func:`worker_environment` hands it to a child ``etcdq``.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import math
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..queue import Queue
from ..transport import Transport, connect
from .exits import UsageError

DEFAULT_ENDPOINTS = "http://127.0.0.1:2379"
DEFAULT_PREFIX = "/etcdq"


def number_in(kind: Callable[[str], Any], low: float, high: Optional[float] = None, *,
              above: bool = False) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` from ``low`` (excluded if ``above``)
    to ``high``; anything else is a usage error that says what is expected."""
    rule = f"{'above' if above else 'at least'} {low:g}" + \
        (f" and at most {high:g}" if high is not None else "")
    noun = "a whole number" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or (value <= low if above else value < low) \
                or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {noun} {rule}, not {text!r}")
        return value
    parse.__name__ = kind.__name__
    return parse


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
                  "etcd v2 auth password (prefer the environment or --password-file: "
                  "arguments show in ps)", "PASSWORD"),
    _GlobalOption(("--password-file",), "password_file", "ETCDQ_PASSWORD_FILE", None,
                  "file whose first line is the etcd v2 auth password", "FILE"),
    _GlobalOption(("--request-timeout",), "request_timeout", "ETCDQ_TIMEOUT", 5.0,
                  "seconds per etcd request; a call gives up after 3 times this",
                  "S", kind=number_in(float, 0, above=True)),
    _GlobalOption(("--json",), "json", None, False,
                  "machine-readable output (put, stats, ls, show, wait, cancel, requeue, "
                  "purge, work, import)",
                  action="store_true"),
    _GlobalOption(("-v", "--verbose"), "verbose", None, 0, "more log output (repeatable)",
                  action="count"),
    _GlobalOption(("-q", "--quiet"), "quiet", None, 0, "less log output (repeatable)",
                  action="count"),
)

_GLOBAL_DESTS = frozenset(option.dest for option in _GLOBAL_OPTIONS)


def add_global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """Add the global options to the top parser, or to a verb's parser.

    On a verb they default to SUPPRESS, so they override the top parser's
    value only when given after the verb; its ``--help`` lists them too,
    with their environment variables.
    """
    group = parser.add_argument_group("global options" if top else
                                      "global options (before or after the verb)")
    for option in _GLOBAL_OPTIONS:
        default = option.default
        if option.env and top:
            default = os.environ.get(option.env, default)
        kwargs: Dict[str, Any] = {
            "dest": option.dest,
            "default": default if top else argparse.SUPPRESS,
            "help": _global_help(option),
        }
        if option.action:
            kwargs["action"] = option.action
        else:
            kwargs.update(metavar=option.metavar, type=option.kind)
        group.add_argument(*option.flags, **kwargs)


class _VerbHelpFormatter(argparse.HelpFormatter):
    """A verb's ``--help``: the usage line leaves out the global options, listed below it."""

    def add_usage(self, usage: Optional[str], actions: Iterable[argparse.Action],
                  groups: Iterable[Any], prefix: Optional[str] = None) -> None:
        own = [action for action in actions if action.dest not in _GLOBAL_DESTS]
        super().add_usage(usage, own, groups, prefix)


def _global_help(option: _GlobalOption) -> str:
    parts = [option.help]
    if option.env:
        parts.append(f"env {option.env}")
    if option.default not in (None, False, 0):
        parts.append(f"default {option.default}")
    return parts[0] + (f" ({'; '.join(parts[1:])})" if len(parts) > 1 else "")


def worker_environment(args: argparse.Namespace) -> Dict[str, str]:
    """The ETCDQ_* variables that give a child ``etcdq`` the same connection settings."""
    env = {}
    for option in _GLOBAL_OPTIONS:
        value = getattr(args, option.dest, None)
        if option.env and value is not None:
            env[option.env] = str(value)
    return env


def connect_from(args: argparse.Namespace) -> Transport:
    """A Transport on the connection the global options describe (the caller closes it)."""
    password = secret_option(args.password, getattr(args, "password_file", None), "password")
    return connect(args.endpoints, ca_cert=args.ca_cert, cert=args.cert, key=args.key,
                   username=args.username, password=password,
                   timeout=args.request_timeout)


def secret_option(value: Optional[str], path: Optional[str], what: str) -> Optional[str]:
    """A secret given as itself or in a file (its first line, so ``ps`` never shows it);
    UsageError when both are given or the file cannot be read."""
    if path is None:
        return value
    if value is not None:
        raise UsageError(f"give the {what} or its file, not both")
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.readline().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the {what} from {path}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None


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
    transport = connect_from(args)
    try:
        with contextlib.ExitStack() as stack:
            yield [stack.enter_context(Queue(transport, name, prefix=args.prefix, **options))
                   for name in names]
    finally:
        transport.close()


# --------------------------------------------------------------------------
# What several verbs share
# --------------------------------------------------------------------------

def verb(verbs: Any, name: str, run: Callable[[argparse.Namespace], int], summary: str, *,
         after_dashes: Optional[str] = None, intermixed: Optional[str] = None,
         log_level: int = logging.WARNING, **kwargs: Any) -> argparse.ArgumentParser:
    """A verb's parser, with ``run`` as its handler and the global options.

    ``after_dashes``: the positional list (its dest) that takes every argument
    after ``--`` (work's command); ``intermixed``: the positional list that
    also takes the arguments found between or after options (put's payloads).
    ``log_level``: the default of ``-v``/``-q``; a long-running verb's log
    is its output (INFO), the others speak only of problems.  The rest goes
    to ``add_parser`` (``usage=``, ``epilog=``).
    """
    kwargs.setdefault("formatter_class", _VerbHelpFormatter)
    parser: argparse.ArgumentParser = verbs.add_parser(name, help=summary, description=summary,
                                                       **kwargs)
    parser.set_defaults(run=run, after_dashes=after_dashes, intermixed=intermixed,
                        log_level=log_level)
    add_global_options(parser, top=False)
    return parser


def add_queue_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue", metavar="QUEUE",
                        help="queue name: 1-128 of A-Z a-z 0-9 . _ -")


def add_failed_ttl(parser: argparse.ArgumentParser) -> None:
    """For the verbs that write dead letters (work, cancel)."""
    parser.add_argument("--failed-ttl", type=number_or_none(float), metavar="S",
                        help="keep dead letters S seconds (default 'none': until purged)")


def number_or_none(kind: Callable[[str], Any]) -> Callable[[str], Any]:
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

