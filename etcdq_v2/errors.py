"""The one exception hierarchy of etcdq_v2.

Every failure the library reports is an :class:`EtcdqError`; no python-etcd or
urllib3 exception ever reaches the caller.  The transport turns etcd's error
codes into the private :class:`EtcdFailure` family, which the protocol layer
interprets and never lets escape.
"""
from __future__ import annotations

from typing import Optional


class EtcdqError(Exception):
    """Base class of every error raised by etcdq_v2."""


class InvalidName(EtcdqError, ValueError):
    """A queue name, prefix or item id that cannot be used as a key segment."""


class InvalidPayload(EtcdqError, ValueError):
    """A payload that cannot be encoded (not JSON-serialisable, not bytes)."""


class PayloadTooLarge(InvalidPayload):
    """The encoded payload is over the queue's size limit; nothing was written."""


class LockLost(EtcdqError):
    """The claim's lock is held by another claim (or the item is gone)."""


class NotFound(EtcdqError, LookupError):
    """The item asked for is not in the queue's directory."""


class Unavailable(EtcdqError):
    """etcd could not be reached, or did not answer, within the deadline."""


class AuthError(EtcdqError):
    """etcd refused the credentials or the access (HTTP 401, etcd code 110)."""


class ConfigError(EtcdqError, ValueError):
    """A bad argument to connect() or Queue(): endpoint URL, TLS files, TTL."""


class EtcdFailure(EtcdqError):
    """etcd answered with an error code the caller did not expect.

    Subclasses name the codes the protocol reasons about.  ``index`` is the
    etcd index the error reply carried.
    """

    code = 0

    def __init__(self, message: str, *, code: int = 0, index: Optional[int] = None) -> None:
        super().__init__(message)
        self.code = code or self.code
        self.index = index
        # Set by the transport when the request was sent more than once, so
        # this error may be the echo of our own first attempt.
        self.retried = False


class KeyMissing(EtcdFailure):
    code = 100


class CompareFailed(EtcdFailure):
    code = 101


class AlreadyExists(EtcdFailure):
    code = 105


class AmbiguousWrite(Unavailable):
    """A POST may or may not have been applied (reply lost). Internal."""
