"""Exit statuses of ``etcdq``, and the error a command line can make.

User errors print one line ``etcdq: error: ...`` and exit with a distinct
code (:data:`EXIT_CODES`, shown in ``--help``); never a traceback for an
:class:`EtcdqError`.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from ..errors import (AuthError, ConfigError, EtcdqError, InvalidArgument, InvalidName,
                      InvalidPayload, NotFound, Unavailable)
from ..transport import Refused

PROG = "etcdq"

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
                   "or work: an attempt it ran failed"),
    (EXIT_USAGE, "bad usage: arguments, queue name, item id, payload, endpoint or TLS files, "
                 "a bad line to import"),
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
    (InvalidArgument, EXIT_USAGE),
    (ConfigError, EXIT_USAGE),
)


class UsageError(EtcdqError):
    """A command line that parses but asks for something impossible."""


def exit_code_for(error: BaseException) -> int:
    """The exit status the CLI uses for ``error``."""
    for kind, code in _ERROR_EXITS:
        if isinstance(error, kind):
            return code
    return EXIT_USAGE if isinstance(error, UsageError) else EXIT_FAILURE


def error_line(error: BaseException) -> str:
    """The one line the CLI prints for ``error``: its message, and for endpoints
    where nobody listens, how to start a local etcd."""
    line = f"{PROG}: error: {error}"
    if isinstance(error, Refused):
        line += f"; to start a local etcd: {PROG} server (in another terminal)"
    return line


def worst(codes: List[int], order: Sequence[int]) -> int:
    """The first exit status of ``order`` among ``codes``, else 0."""
    return next((code for code in order if code in codes), EXIT_OK)
