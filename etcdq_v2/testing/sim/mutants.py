"""Known defects, put back one at a time, to show that the simulator finds them.

Each mutant is a context manager that patches one rule of the library out
while it is active (``python -m etcdq_v2.testing.sim --mutant NAME``;
tests/test_sim.py).  ``MUTANTS`` maps each name to its patch and to the
invariant expected to catch it; docs/simulation.md has the table of seeds it
takes.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from ...driver import run
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
        return run(self._our_commit(state, kind), self.etcd)


def _plain_refresh(original: Callable[..., Any]) -> Callable[..., Any]:
    """The heartbeat's refresh without its prevValue: it refreshes whoever's lock is there."""
    def put(self: Transport, key: str, value: Optional[str] = None, **kwargs: Any) -> Any:
        if "/locks/" in key and kwargs.get("refresh"):
            kwargs.pop("prev_value", None)
        return original(self, key, value, **kwargs)
    return put


def _resend_post(original: Callable[..., Tuple[str, Version]]) -> Callable[..., Tuple[str, Version]]:
    """P1 that sends a POST again when its reply was lost, instead of searching for its token."""
    def post_item(self: Protocol, raw: str, token: str) -> Tuple[str, Version]:
        try:
            node = self.etcd.post(self.layout.work, raw).node
        except AmbiguousWrite:
            node = self.etcd.post(self.layout.work, raw).node
        return node["key"].rsplit("/", 1)[-1], Version(node["modifiedIndex"], raw)
    return post_item


def _no_time_rule(original: Callable[..., float]) -> Callable[..., float]:
    """Claim.lost without its time rule: a claim whose lock was not confirmed
    for lock_ttl still says it holds it (only a failed request tells it)."""
    def lock_left(self: Protocol, confirmed: float) -> float:
        return float("inf") if confirmed > float("-inf") else float("-inf")
    return lock_left


def _claim_unfenced(original: Callable[..., Any]) -> Callable[..., Any]:
    """Writes of work/<id> other than F1 (C2, the re-fence, R0) without prevIndex:
    a claim writes over whatever version is there."""
    def put(self: Transport, key: str, value: Optional[str] = None, **kwargs: Any) -> Any:
        if "/work/" in key and value is not None and '"o":' not in value:
            kwargs.pop("prev_index", None)
        return original(self, key, value, **kwargs)
    return put


def _short_delay(original: Callable[..., Any]) -> Callable[..., Any]:
    """D1 with a delay lock of 1 s, whatever the delay: a delayed item is claimable early."""
    def put_delayed(self: Protocol, raw: str, token: str, ttl: int) -> Any:
        return original(self, raw, token, 1)
    return put_delayed


#: name -> (class, attribute, replacement(original), invariant expected, what it puts back)
MUTANTS: Dict[str, Tuple[type, str, Callable[[Any], Any], str, str]] = {
    "f1-unfenced": (Protocol, "_commit", lambda _: _f1_unfenced, "no-commit-after-reclaim",
                    "F1 (the commit of an outcome on work/<id>) without its prevIndex fence"),
    "heartbeat-plain-refresh": (Transport, "put", _plain_refresh,
                                "one-live-claim",
                                "the heartbeat's refresh as a plain refresh, not a CAS on the "
                                "lock's value"),
    "lost-without-time-rule": (Protocol, "lock_left", _no_time_rule, "one-live-claim",
                               "Claim.lost only from a failed request, not from lock_ttl "
                               "passing without a confirmation"),
    "claim-unfenced": (Transport, "put", _claim_unfenced, "no-hand-out-after-outcome",
                       "C2, the re-fence and R0 without their prevIndex fence"),
    "delay-lock-short": (Protocol, "put_delayed", _short_delay, "delay-kept",
                         "a delayed put's lock of 1 s, whatever its delay"),
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
