"""What the view and the claims hold of an item: one version, and one listed node.

No I/O here: the consumer's view (viewstate.py), which does none, holds these,
and protocol.py makes them from etcd's replies.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Version:
    """One version of ``work/<id>``: the index etcd wrote it at and the value it
    wrote then (``raw``; None: not known here, so a claim reads the item first).

    Made only from one node of one reply (:attr:`Entry.version`), or from one
    write's own value and the index of that write's reply: never the index of
    one version with the value of another.  C2 is a CAS on ``index`` of a
    value built from ``raw``; a pair of two versions would write an older
    value over a newer one (a commit, another claim) and undo it
    (docs/protocol.md, "One version").
    """

    index: int
    raw: Optional[str] = None


@dataclass
class Entry:
    """One child of a queue directory, as listed: id, modifiedIndex, raw value."""

    id: str
    index: int
    value: Optional[str]
    #: For a key with a TTL: etcd's ``expiration`` (RFC 3339, its wall clock) and
    #: ``ttl`` (seconds left, rounded up; etcd leaves it out at 0).
    expiration: Optional[str] = None
    ttl: int = 0

    def ttl_left(self) -> Optional[int]:
        """The TTL to write back so the key keeps its expiry; None: it has none."""
        return max(self.ttl, 1) if self.expiration else None

    @property
    def version(self) -> Version:
        """This node's index and value: one version, read together."""
        return Version(self.index, self.value)
