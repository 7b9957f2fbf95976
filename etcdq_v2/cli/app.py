"""The ``etcdq`` parser and :func:`main`: the verbs come from :data:`VERB_MODULES`."""
from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from typing import List, NoReturn, Optional, Sequence

from .._version import __version__
from ..errors import EtcdqError
from . import completion, dashboard, demo, items, metrics, ops, server, transfer, work
from .exits import (EXIT_CODES, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_USAGE, PROG, error_line,
                    exit_code_for)
from .options import add_global_options

#: The modules that hold the verbs, in the order ``--help`` lists them.  Each has
#: ``add_verbs(verbs)``, which adds its verbs' parsers (see :func:`.options.verb`), each
#: with its handler.  A new verb: a module with ``add_verbs``, and a line here.
VERB_MODULES = (
    items,       # put, ls, show, wait, cancel
    work,        # work
    ops,         # stats, requeue, purge, drop
    metrics,     # metrics
    dashboard,   # dashboard
    transfer,    # export, import
    server,      # server
    demo,        # demo
    completion,  # completion
)


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    add_global_options(parser, top=True)
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for module in VERB_MODULES:
        module.add_verbs(verbs)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``etcdq`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    # A stored value may hold a lone surrogate (another writer's, read back as it
    # decoded): printed as its \uXXXX escape (valid inside a JSON string), never
    # a UnicodeEncodeError after the lines before it.
    reconfigure = getattr(sys.stdout, "reconfigure", None)
    if reconfigure is not None:
        reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parse_args(parser, list(sys.argv[1:] if argv is None else argv))
    _configure_logging(args)
    try:
        return int(args.run(args))
    except EtcdqError as exc:
        print(error_line(exc), file=sys.stderr)
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
    """Parse ``argv``; what follows the first ``--`` goes to the verb's ``after_dashes`` list.

    Split by hand because argparse's handling of ``--`` with a positional
    list differs between Python versions and rejects a second ``--``.  A
    verb without ``after_dashes`` gets argparse's own handling.
    """
    head, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) \
        if "--" in argv else (argv, [])
    args, extra = parser.parse_known_args(head)
    if args.intermixed:
        # argparse fills a positional list only up to the first option after
        # it (Python issue 15112): in ``put QUEUE --delay S A B``, A and B.
        _extend(args, args.intermixed, [a for a in extra if not _looks_optional(a)])
        extra = [a for a in extra if _looks_optional(a)]
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.after_dashes:
        _extend(args, args.after_dashes, rest)  # after "--": "-x" too
    elif rest:
        args = parser.parse_args(argv)
    return args


def _extend(args: argparse.Namespace, dest: str, values: List[str]) -> None:
    setattr(args, dest, list(getattr(args, dest)) + values)


def _looks_optional(argument: str) -> bool:
    """What argparse takes for an option: a leading "-", unless "-" or a negative number."""
    return argument.startswith("-") and argument != "-" \
        and not re.fullmatch(r"-\d+|-\d*\.\d+", argument)


def _configure_logging(args: argparse.Namespace) -> None:
    level = min(max(args.log_level + 10 * (args.quiet - args.verbose), logging.DEBUG),
                logging.CRITICAL)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
