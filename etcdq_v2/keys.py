"""The queue's key layout in etcd, and the checks that keep keys inside it.

Every key etcdq_v2 touches is built here, from segments that passed
:func:`check_name`: python-etcd and etcd itself would otherwise turn ``?``,
``#``, ``%2F`` or ``..`` in a name into a different key (see
docs/protocol.md, "Key layout").

Layout under ``{prefix}/{name}/``::

    work/<id>        the items, POSTed as in-order keys (id = 20-digit index)
    locks/<id>       a claim's TTL lock (or a release delay)
    completed/<id>   the completion record of a finished item
    failed/<id>      the dead letter of an item that failed too often
"""
from __future__ import annotations

import re

from .errors import InvalidName

_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,128}")
_ITEM_ID = re.compile(r"[0-9]{20}")
_TYPED_ID = re.compile(r"0*([0-9]{1,20})")

DIRS = ("work", "locks", "completed", "failed")


def check_name(name: object, what: str = "queue name") -> str:
    """Return ``name`` if it is a safe key segment, else raise InvalidName."""
    if not isinstance(name, str) or not _SEGMENT.fullmatch(name) or name in (".", ".."):
        raise InvalidName(
            f"invalid {what} {name!r}: use 1 to 128 of A-Z a-z 0-9 . _ - "
            "(not '.' or '..')")
    return name


def check_prefix(prefix: object) -> str:
    """Return the prefix as ``/seg/seg`` (no trailing slash), else raise InvalidName."""
    if not isinstance(prefix, str) or not prefix.startswith("/"):
        raise InvalidName(f"invalid prefix {prefix!r}: it must start with '/'")
    segments = [s for s in prefix.split("/") if s]
    if not segments:
        raise InvalidName("invalid prefix '/': the queue needs a directory of its own")
    for segment in segments:
        check_name(segment, "prefix segment")
    return "/" + "/".join(segments)


def is_queue_name(text: str) -> bool:
    """True for a name :func:`check_name` accepts (a directory another tool made may not be)."""
    return bool(_SEGMENT.fullmatch(text)) and text not in (".", "..")


def is_item_id(text: str) -> bool:
    """True for the names etcd gives in-order keys (20 zero-padded digits)."""
    return bool(_ITEM_ID.fullmatch(text))


def check_item_id(item_id: object) -> str:
    """Return ``item_id`` if it has the shape of an item id, else raise InvalidName."""
    if not isinstance(item_id, str) or not is_item_id(item_id):
        raise InvalidName(f"invalid item id {item_id!r}: expected 20 digits")
    return item_id


def typed_item_id(text: str) -> str:
    """An item id as a person types it, leading zeros optional ("9" is
    ``00000000000000000009``): the 20-digit id, else InvalidName."""
    match = _TYPED_ID.fullmatch(text.strip())
    if not match:
        raise InvalidName(f"invalid item id {text!r}: expected up to 20 digits "
                          "(leading zeros may be left out)")
    return match.group(1).zfill(20)


class Layout:
    """The keys of one queue.  Pure: no I/O."""

    def __init__(self, prefix: str, name: str) -> None:
        self.prefix = check_prefix(prefix)
        self.name = check_name(name)
        self.root = f"{self.prefix}/{self.name}"
        self.work = f"{self.root}/work"
        self.locks = f"{self.root}/locks"
        self.completed = f"{self.root}/completed"
        self.failed = f"{self.root}/failed"
        #: How every message names the queue: "queue jobs".
        self.label = f"queue {self.name}"

    def dir(self, kind: str) -> str:
        """The directory of ``kind`` (one of :data:`DIRS`)."""
        if kind not in DIRS:
            raise ValueError(f"unknown directory {kind!r}")
        return f"{self.root}/{kind}"

    def key(self, kind: str, item_id: str) -> str:
        """The key of item ``item_id`` in directory ``kind``."""
        return f"{self.dir(kind)}/{check_item_id(item_id)}"

    def split(self, key: str) -> "tuple[str, str] | None":
        """``(kind, item_id)`` for a key of this queue, None for anything else.

        Keys that are not ours (sub-directories, names another tool chose) come
        back as None so that callers skip them.
        """
        head, _, tail = key.rpartition("/")
        kind = head[len(self.root) + 1:] if head.startswith(self.root + "/") else ""
        if kind in DIRS and is_item_id(tail):
            return kind, tail
        return None
