"""The one exception hierarchy of etcdq_v2.

Every failure the library reports is an :class:`EtcdqError`; no python-etcd,
urllib3, socket or ssl exception ever reaches the caller::

    EtcdqError
    ├── InvalidName          (also ValueError)  a queue name, prefix or item id
    ├── InvalidArgument      (also ValueError)  an argument outside its allowed set
    ├── InvalidPayload       (also ValueError)  not JSON-serialisable, not bytes
    │   └── PayloadTooLarge                     over max_payload_bytes; nothing written
    ├── ConfigError          (also ValueError)  endpoints, TLS files or certificates, TTLs
    ├── LockLost                                another claim holds the item
    ├── ClaimClosed                             the claim already completed, failed, ...
    ├── QueueClosed                             claim() on a Queue after its close()
    ├── NotFound             (also LookupError) no such item
    ├── AuthError                               etcd refused the credentials or the access
    ├── Unavailable                             etcd did not answer within the deadline
    ├── EtcdRejected                            etcd refused a request for another reason
    ├── TaskFailed                              a task's call was dead-lettered (its reason)
    └── WaitTimeout          (also TimeoutError) a task's call did not finish in time

(``Retry`` and ``Reject``, which a handler raises to steer its worker, are
control flow, not errors: they live in tasks.py.)

Where lower-level errors become these:

* wire.py raises its own small set (``NotSent``, ``Lost``, ``TLSFailed``);
  transport.py translates them, and etcd's error replies, in one place (its
  ``_translated`` context manager);
* the private :class:`EtcdFailure` family (etcd's "key not found", "compare
  failed", "already exists") is what the protocol layer reasons about.  Every
  public entry point runs inside :func:`public_errors`, which turns one that
  was not handled into :class:`EtcdRejected`, so none escapes.
"""
from __future__ import annotations

import contextlib
from typing import Optional


class EtcdqError(Exception):
    """Base class of every error raised by etcdq_v2."""


class InvalidName(EtcdqError, ValueError):
    """A queue name, prefix or item id that cannot be used as a key segment."""


class InvalidArgument(EtcdqError, ValueError):
    """An argument outside its allowed set, such as an unknown item state."""


class InvalidPayload(EtcdqError, ValueError):
    """A payload that cannot be encoded (not JSON-serialisable, not bytes)."""


class PayloadTooLarge(InvalidPayload):
    """The encoded payload is over the queue's size limit; nothing was written."""


class LockLost(EtcdqError):
    """The claim's lock is held by another claim (or the item is gone)."""


class ClaimClosed(EtcdqError):
    """complete, fail, release or refresh on a claim that has already ended.

    ``outcome`` is how it ended, where that was only learnt now: "completed"
    or "failed" when an earlier call of the same claim had committed that
    outcome although its reply was lost.
    """

    def __init__(self, message: str, *, outcome: Optional[str] = None) -> None:
        super().__init__(message)
        self.outcome = outcome


class QueueClosed(EtcdqError):
    """claim() (or claim_first) on a Queue after its close().

    Not transient: a closed Queue runs no heartbeat, so no claim of it could
    be kept alive; open a new Queue.  A Worker whose Queue is closed stops
    and raises it from run().
    """


class NotFound(EtcdqError, LookupError):
    """The item asked for is not in the queue's directory."""


class Unavailable(EtcdqError):
    """etcd could not be reached, or did not answer, within the deadline."""


class AuthError(EtcdqError):
    """etcd refused the credentials or the access (HTTP 401, etcd code 110)."""


class ConfigError(EtcdqError, ValueError):
    """A bad argument to connect() or Queue(): endpoint URL, TLS files, TTL."""


class EtcdRejected(EtcdqError):
    """etcd refused a request for a reason none of the other errors names.

    For example a key of the queue's layout that someone replaced by a
    directory.  ``code`` is etcd's errorCode (0 if it gave none) and
    ``index`` the etcd index of the reply.
    """

    def __init__(self, message: str, *, code: int = 0, index: Optional[int] = None) -> None:
        super().__init__(message)
        self.code = code
        self.index = index


class TaskFailed(EtcdqError):
    """A task's call was dead-lettered: ``reason`` and ``traceback`` are the dead
    letter's (the traceback's end; None when no Python exception caused it)."""

    def __init__(self, item_id: str, reason: Optional[str],
                 traceback: Optional[str] = None) -> None:
        super().__init__(f"item {item_id} was dead-lettered: {reason or 'no reason given'}")
        self.item_id = item_id
        self.reason = reason
        self.traceback = traceback


class WaitTimeout(EtcdqError, TimeoutError):
    """A task's call did not finish within the time given to wait for it."""


class EtcdFailure(EtcdqError):
    """etcd answered with an error code the caller did not expect. Internal.

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
    """etcd error 100. Internal."""

    code = 100


class CompareFailed(EtcdFailure):
    """etcd error 101. Internal."""

    code = 101


class AlreadyExists(EtcdFailure):
    """etcd error 105. Internal."""

    code = 105


class AmbiguousWrite(Unavailable):
    """A POST may or may not have been applied (reply lost). Internal."""


class public_errors(contextlib.ContextDecorator):  # noqa: N801 - used as a function was
    """Every public entry point's guard: no internal error leaves the library.

    An :class:`EtcdFailure` that reaches here was not one the protocol could
    act on; it becomes :class:`EtcdRejected` with etcd's code and index.  A
    class, not @contextmanager: put, claim and complete each run inside it,
    and a generator's context costs a generator and four calls more per call.
    """

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Optional[type], exc: Optional[BaseException],
                 traceback: object) -> None:
        if isinstance(exc, EtcdFailure):
            raise EtcdRejected(f"etcd refused the request: {exc}", code=exc.code,
                               index=exc.index) from None
