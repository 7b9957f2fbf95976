"""Known defects, put back one at a time, to show that the simulator finds them.

Each mutant is a context manager that patches one rule of the library out
while it is active (``python -m etcdq_v2.testing.sim --mutant NAME``;
tests/test_sim.py).  ``MUTANTS`` maps each name to its patch and to the
invariant expected to catch it; docs/simulation.md has the table of seeds it
takes.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ...errors import AmbiguousWrite, CompareFailed, KeyMissing
from ...protocol import Entry, Protocol, Version
from ...transport import Transport


def _f1_unfenced(self: Protocol, state: Any, kind: str, marked: str) -> Optional[Entry]:
    """F1 without its prevIndex fence: a stale claim's commit overwrites the item."""
    key = self.layout.key("work", state.id)
    try:
        reply = self.etcd.put(key, marked)
        return Entry(state.id, reply.written_index, marked)
    except (CompareFailed, KeyMissing):
        return self._our_commit(state, kind)


def _plain_refresh(self: Transport, locks: Any, *, ttl: int, timeout: float) -> List[Any]:
    """The heartbeat's refresh without its prevValue: it refreshes whoever's lock is there."""
    calls = [(key, {"ttl": ttl, "refresh": True, "prevExist": True}) for key, _ in locks]
    return self._all("PUT", calls, timeout=timeout, redo=False)


def _resend_post(original: Callable[..., Tuple[str, Version]]) -> Callable[..., Tuple[str, Version]]:
    """P1 that sends a POST again when its reply was lost, instead of searching for its token."""
    def post_item(self: Protocol, raw: str, token: str) -> Tuple[str, Version]:
        try:
            node = self.etcd.post(self.layout.work, raw).node
        except AmbiguousWrite:
            node = self.etcd.post(self.layout.work, raw).node
        return node["key"].rsplit("/", 1)[-1], Version(node["modifiedIndex"], raw)
    return post_item


#: name -> (class, attribute, replacement(original), invariant expected, what it puts back)
MUTANTS: Dict[str, Tuple[type, str, Callable[[Any], Any], str, str]] = {
    "f1-unfenced": (Protocol, "_commit", lambda _: _f1_unfenced, "no-commit-after-reclaim",
                    "F1 (the commit of an outcome on work/<id>) without its prevIndex fence"),
    "heartbeat-plain-refresh": (Transport, "refresh_all", lambda _: _plain_refresh,
                                "one-live-claim",
                                "the heartbeat's refresh as a plain refresh, not a CAS on the "
                                "lock's value"),
    "resend-lost-post": (Protocol, "post_item", _resend_post, "stored-once",
                         "a put whose POST reply was lost sends it again"),
}


@contextlib.contextmanager
def mutant(name: Optional[str]) -> Iterator[None]:
    """While active, the library has the defect ``name`` (None: none)."""
    if name is None:
        yield
        return
    owner, attribute, replace, _, _ = MUTANTS[name]
    original = owner.__dict__[attribute]
    setattr(owner, attribute, replace(original))
    try:
        yield
    finally:
        setattr(owner, attribute, original)
