"""The invariants a simulated run is judged by: what the actors were told
(:class:`.actors.History`) against what the model stored and committed.

Each has a name, which ``FAIL seed=S invariant=NAME`` prints and
docs/guarantees.md lists beside the guarantee it checks:

=========================  =====================================================
acknowledged-put-kept      every id put() or put_many() returned is, at the end,
                           in work/, completed/ or failed/
stored-once                no two stored items (work/, completed/, failed/) carry
                           one put's payload (each put has its own)
one-outcome                no item is in both completed/ and failed/, and at most
                           one complete() or final fail() per item returned OK
no-commit-after-reclaim    no complete() or final fail() returned OK from a claim
                           whose item was handed out to a newer claim (a larger
                           C2 index) before it returned; no release() or fail()
                           to retry did from one whose item a newer claim took
                           before its give-back's write applied
no-hand-out-after-outcome  no claim was handed out whose C2 index is above the
                           index of its item's fenced commit (F1, the write of
                           work/<id> with its outcome), nor after a final
                           complete()/fail() of the item returned OK
one-live-claim             of the open claims of one item, at most one says it is
                           not lost (Claim.lost) for longer than the clocks' skew
                           allows, checked at each hand-out and every 0.25 s
                           (History.check_live_claims)
delay-kept                 no delayed item was handed out before its delay passed,
                           counted from its put() call, less the clocks' skew
cancel-wins                no item that cancel() returned True for was handed out
                           after it, nor completed OK
liveness                   once faults stop, every stored item has its record
                           in completed/ or failed/ within LIVENESS_BOUND
no-thread-died             no sim-thread of the library died of an exception
no-deadlock                the run's sim-threads never all waited with no deadline
=========================  =====================================================
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ...codec import Item, Junk, Record
from .actors import Commit, History
from .api import Request, answer_local
from .cluster import Cluster

NAMES = ("acknowledged-put-kept", "stored-once", "one-outcome", "no-commit-after-reclaim",
         "no-hand-out-after-outcome", "one-live-claim", "delay-kept", "cancel-wins", "liveness", "no-thread-died", "no-deadlock")


@dataclass
class Violation:
    name: str
    detail: str


@dataclass
class Stored:
    """What the model's most advanced member stores under a queue: per directory,
    id -> (modifiedIndex, value)."""

    work: Dict[str, Tuple[int, str]]
    completed: Dict[str, Tuple[int, str]]
    failed: Dict[str, Tuple[int, str]]

    def finished(self) -> Dict[str, str]:
        return {**{i: "completed" for i in self.completed}, **{i: "failed" for i in self.failed}}


def stored(cluster: Cluster, root: str, now: float) -> Stored:
    """Read the store directly (no network, no fault) of the member that applied most."""
    member = max(cluster.members, key=lambda m: m.applied)
    reply = answer_local(member.store, Request("GET", root, recursive=True, sorted=True),
                         member.clock(now))
    doc = json.loads(reply.body) if reply.status == 200 else {}
    dirs: Dict[str, Dict[str, Tuple[int, str]]] = {"work": {}, "completed": {}, "failed": {}}
    for directory in (doc.get("node") or {}).get("nodes", []):
        name = directory["key"].rsplit("/", 1)[1]
        if name in dirs:
            for node in directory.get("nodes", []):
                if not node.get("dir"):
                    dirs[name][node["key"].rsplit("/", 1)[1]] = (node["modifiedIndex"],
                                                                node.get("value", ""))
    return Stored(dirs["work"], dirs["completed"], dirs["failed"])


def _work_writes(cluster: Cluster, root: str) -> Iterator[Tuple[str, str, int]]:
    """(item id, value written, index) of each PUT of work/<id> that applied, in
    the committed log's order (read from the log and its replies)."""
    prefix = f"{root}/work/"
    for entry in cluster.log:
        request, pending = entry.request, entry.pending
        if request is None or pending is None or pending.reply is None:
            continue
        if request.method != "PUT" or not request.key.startswith(prefix):
            continue
        if pending.reply.status in (200, 201):
            yield (request.key[len(prefix):], request.value,
                   int(pending.reply.headers["x-etcd-index"]))


def fenced_commits(cluster: Cluster, root: str) -> Dict[str, int]:
    """Item id -> the index of the first write of work/<id> with its outcome
    ("o") that applied: F1."""
    found: Dict[str, int] = {}
    for item, value, index in _work_writes(cluster, root):
        if '"o":' in value:
            found[item] = min(index, found.get(item, index))
    return found


def claim_writes(cluster: Cluster, root: str) -> Dict[Tuple[str, str], int]:
    """(item id, claim token) -> the index of the last write of work/<id> carrying
    that claim's token that applied (its C2, re-fence, R0 or a retry's give-back)."""
    found: Dict[Tuple[str, str], int] = {}
    for item, value, index in _work_writes(cluster, root):
        try:
            token = json.loads(value).get("c")
        except (ValueError, AttributeError):
            continue
        if isinstance(token, str):
            found[(item, token)] = index
    return found


def _payload(value: str, record: bool) -> Optional[Any]:
    try:
        return Record.decode(value).payload if record else Item.decode(value).payload
    except (Junk, ValueError):
        return None


def check(history: History, store: Stored, commits: Dict[str, int],
          live: Optional[str], skew: float = 0.0,
          writes: Optional[Dict[Tuple[str, str], int]] = None) -> List[Violation]:
    """Every violation of the run (``live``: why liveness failed, None if it held;
    ``skew``: how far ahead of the clients' a member's clock may be)."""
    found: List[Violation] = []
    found += _delay_kept(history, skew)
    found += _cancel_wins(history)
    found += _kept(history, store)
    found += _once(store)
    found += _one_outcome(history, store)
    found += _no_commit_after_reclaim(history, writes or {})
    found += _no_hand_out_after_outcome(history, commits)
    if live is not None:
        found.append(Violation("liveness", live))
    return found


def _kept(history: History, store: Stored) -> Iterator[Violation]:
    for item, (when, payload) in history.puts.items():
        if item not in store.work and item not in store.completed and item not in store.failed:
            yield Violation("acknowledged-put-kept",
                            f"item {item} ({payload!r}, put at {when:.3f}) is stored nowhere")


def _once(store: Stored) -> Iterator[Violation]:
    seen: Dict[Any, str] = {}
    for directory, record in ((store.work, False), (store.completed, True),
                              (store.failed, True)):
        for item, (_, value) in directory.items():
            payload = _payload(value, record)
            if payload is None:
                continue
            key = json.dumps(payload, sort_keys=True)
            if key in seen and seen[key] != item:
                yield Violation("stored-once", f"payload {payload!r} is stored as {seen[key]} "
                                               f"and as {item}")
            seen.setdefault(key, item)


def _one_outcome(history: History, store: Stored) -> Iterator[Violation]:
    for item in set(store.completed) & set(store.failed):
        yield Violation("one-outcome", f"item {item} is in completed/ and in failed/")
    final: Dict[str, int] = {}
    for commit in history.commits:
        if commit.outcome in ("completed", "dead-lettered"):
            final[commit.item] = final.get(commit.item, 0) + 1
    for item, count in sorted(final.items()):
        if count > 1:
            yield Violation("one-outcome", f"{count} final commits of item {item} returned OK")


def _no_commit_after_reclaim(history: History,
                             writes: Dict[Tuple[str, str], int]) -> Iterator[Violation]:
    """A final commit: no newer claim handed out before it returned.  A give-back
    (release, a fail to retry): none whose C2 applied before the give-back's
    last write of the item (``writes``): one after it took the item back fairly."""
    for commit in history.commits:
        final = commit.outcome in ("completed", "dead-lettered")
        given_back = writes.get((commit.item, commit.token), commit.index)
        for out in history.hand_outs:
            if out.item != commit.item or out.index <= commit.index or out.seq > commit.seq:
                continue
            if final or out.index < given_back:
                yield Violation("no-commit-after-reclaim",
                                f"{commit.kind}() of item {commit.item} by the claim of C2 index "
                                f"{commit.index} returned OK at {commit.time:.3f}, after the "
                                f"claim of index {out.index} was handed out to {out.consumer} "
                                f"at {out.time:.3f}")
                break


def _no_hand_out_after_outcome(history: History, commits: Dict[str, int]) -> Iterator[Violation]:
    final: Dict[str, Commit] = {}
    for commit in history.commits:
        if commit.outcome in ("completed", "dead-lettered"):
            final.setdefault(commit.item, commit)
    for out in history.hand_outs:
        fenced = commits.get(out.item)
        if fenced is not None and out.index > fenced:
            yield Violation("no-hand-out-after-outcome",
                            f"item {out.item} was handed out to {out.consumer} at {out.time:.3f} "
                            f"with C2 index {out.index}, after its commit F1 at {fenced}")
        done = final.get(out.item)
        if done is not None and out.seq > done.seq:
            yield Violation("no-hand-out-after-outcome",
                            f"item {out.item} was handed out to {out.consumer} at {out.time:.3f}, "
                            f"after its {done.kind}() returned OK at {done.time:.3f}")


def _delay_kept(history: History, skew: float) -> Iterator[Violation]:
    for out in history.hand_outs:
        if out.item in history.delayed:
            called, delay = history.delayed[out.item]
            if out.time < called + delay - skew:
                yield Violation("delay-kept", f"item {out.item}, put at {called:.3f} with a "
                                f"delay of {delay:g} s, was handed out at {out.time:.3f}")


def _cancel_wins(history: History) -> Iterator[Violation]:
    for seq, item, cancelled in history.cancels:
        if not cancelled:
            continue
        for out in history.hand_outs:
            if out.item == item and out.seq > seq:
                yield Violation("cancel-wins", f"item {item} was handed out to {out.consumer} "
                                f"at {out.time:.3f}, after cancel() returned True")
        for commit in history.commits:
            if commit.item == item and commit.outcome == "completed":
                yield Violation("cancel-wins", f"item {item} was completed OK at "
                                f"{commit.time:.3f}, and cancel() returned True")
