"""The invariants a simulated run is judged by: what the actors were told
(:class:`.actors.History`) against what the model stored and committed.

Each has a name, which ``FAIL seed=S invariant=NAME`` prints and
docs/guarantees.md lists beside the guarantee it checks:

=========================  =====================================================
acknowledged-put-kept      every id put() or put_many() returned is, at the end,
                           in work/, completed/ or failed/, with its payload
stored-once                no two stored items (work/, completed/, failed/) carry
                           one put's payload (each put has its own); a dead letter
                           marked beside the item its requeue made is one copy
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
no-claim-after-close       no claim() called after its queue's close() returned
                           handed out a claim
closed-claims-lost         every open claim of a closed queue says it is lost,
                           from the moment close() returns (also one a claim()
                           under way then hands out)
refresh-of-own-lock        no refresh of a lock that applied found another claim's
                           lock there (read from the committed log: the request's
                           sender and the reply's prevNode)
own-claims-live            every item a view trusts as its process's live claim's
                           (ViewState.own) is an open claim's not lost (or whose
                           commit runs), but for a heartbeat interval + 2 s
heartbeat-on-time          the refresh of every open claim of a running process is
                           on the network within 0.5 s of its due time (lock_ttl/3
                           after its last confirmation's send, or 1 s after a
                           refresh that failed), each claim's on its own
one-version                every index a view or a claim holds for an item is of
                           the write that wrote the value it holds (the log)
view-taken-freed           no item stays taken in a view for longer than
                           TAKEN_BOUND after its lock went (the store has none),
                           nor by a lock held at an index whose removal its
                           process's stream delivered more than FREED_BOUND ago
view-knows-work            no item stays in work/ unknown to a ready view for
                           longer than KNOWN_BOUND, nor (with no outcome) for
                           longer than LISTED_BOUND after the reply to the last
                           request of the round whose listing of work/ held it
                           (that node: not one of its id created since)
lone-put-order             no item is handed out at a window of one (a consumer
                           that looks alone, in a run with any number of them;
                           no lost race since: docs/protocol.md, "Where a claim
                           looks") while an older one had been free in the
                           store, and held free by its view, for ORDER_SLACK
misses-bounded             a claim loop whose view is quiet loses no more races
                           (C1 refused) since a listing of work/ it read than its
                           miss limit (one per 100 listed items, at least one)
                           before it sends another listing of work/
no-starving-while-idle     once the faults' aftermath is over (Live.calm), no item
                           free in the store (in work/, no lock, no delay lock)
                           stays so for longer than STARVE_BOUND while a consumer
                           was idle in claim() (handed nothing) all that time
claims-available           no claim() called once the faults' aftermath is over
                           (every member answers) raised Unavailable
wait-agrees                every outcome wait() returned is the item's record at
                           the end (when etcd gave its id again after the wait:
                           just before it did)
read-back-finds-applied    no put() or put_many() raised "not found in the queue"
                           after a lost reply when each payload it sent had been
                           stored by a POST that applied (the log) before its
                           read-back began (its sim-thread's quorum read of
                           work/00000000000000000000, which gives P1's T)
no-thread-died             no sim-thread of the library died of an exception
no-deadlock                the run's sim-threads never all waited with no deadline,
                           virtual time never stood still for STILL_HAND_ONS
                           hand-overs (a livelock), and a claim(timeout=None)
                           returned once its queue closed
=========================  =====================================================

The checks made as the run goes (:class:`Live`) read a view's state only
through :func:`view_state`, and a claim's only through :func:`claim_state`.
"""
from __future__ import annotations

import contextlib
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

from ...claim import Claim
from ...codec import Item, Junk, Lock, Record
from ...queue import Queue
from ...steps import put_token
from ...viewstate import MISS_COST
from .actors import Commit, History, settling
from .api import Request, answer_local
from .cluster import Cluster

NAMES = ("acknowledged-put-kept", "stored-once", "one-outcome", "no-commit-after-reclaim",
         "no-hand-out-after-outcome", "one-live-claim", "delay-kept", "cancel-wins", "liveness",
         "no-claim-after-close", "closed-claims-lost", "refresh-of-own-lock", "heartbeat-on-time", "own-claims-live",
         "one-version",
         "view-taken-freed", "view-knows-work", "lone-put-order", "orphans-offered", "misses-bounded", "no-starving-while-idle", "claims-available", "wait-agrees",
         "read-back-finds-applied",
         "no-thread-died", "no-deadlock")


#: misses-bounded: the races a quiet claim loop may lose past its view's miss
#: limit before it sends a listing of work/ (none: the miss that reaches the
#: limit lists at once, in the claiming thread).
MISSES_OVER = 0
#: The sim-thread of a view's follower (its rounds' listings).
FOLLOWER = "etcdq-view"


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
    locks: Dict[str, Tuple[int, str]] = field(default_factory=dict)
    #: work/ id -> createdIndex: which node of the id it is (an item is written
    #: by creates and CASes, which keep it: only one that left and was created
    #: again has another).
    work_created: Dict[str, int] = field(default_factory=dict)

    def finished(self) -> Dict[str, str]:
        return {**{i: "completed" for i in self.completed}, **{i: "failed" for i in self.failed}}


def stored(cluster: Cluster, root: str, now: float) -> Stored:
    """Read the store directly (no network, no fault) of the member that applied most."""
    member = max(cluster.members, key=lambda m: m.applied)
    reply = answer_local(member.store, Request("GET", root, recursive=True, sorted=True),
                         member.clock(now))
    doc = json.loads(reply.body) if reply.status == 200 else {}
    dirs: Dict[str, Dict[str, Tuple[int, str]]] = {"work": {}, "completed": {}, "failed": {},
                                                   "locks": {}}
    created: Dict[str, int] = {}
    for directory in (doc.get("node") or {}).get("nodes", []):
        name = directory["key"].rsplit("/", 1)[1]
        if name in dirs:
            for node in directory.get("nodes", []):
                if not node.get("dir"):
                    item = node["key"].rsplit("/", 1)[1]
                    dirs[name][item] = (node["modifiedIndex"], node.get("value", ""))
                    if name == "work":
                        created[item] = node["createdIndex"]
    return Stored(dirs["work"], dirs["completed"], dirs["failed"], dirs["locks"], created)


def lineage(cluster: Cluster, era: int) -> List[Tuple[int, int]]:
    """The log positions whose writes history ``era`` holds, as [from, to)
    spans: each restore of the whole cluster from a backup (Cluster.rewind)
    keeps what its backup covered and goes on from where it struck."""
    spans = [(0, len(cluster.log))]
    for covered, struck in cluster.rewinds[:era]:
        spans = [(lo, min(hi, covered)) for lo, hi in spans if lo < covered]
        spans.append((struck, len(cluster.log)))
    if era < len(cluster.rewinds):  # its history ends where the next restore struck
        end = cluster.rewinds[era][1]
        spans = [(lo, min(hi, end)) for lo, hi in spans if lo < end]
    return spans


def lost_payloads(cluster: Cluster, root: str) -> Set[str]:
    """The payloads, and the ids, of the items put (work/<id> created) in a
    history the last one does not hold: etcd lost them at a restore from an
    older backup."""
    kept = lineage(cluster, len(cluster.rewinds))
    lost: Set[str] = set()
    prefix = f"{root}/work/"
    for position, entry in enumerate(cluster.log):
        request = entry.request
        if request is None or not (request.key + "/").startswith(prefix) \
                or any(lo <= position < hi for lo, hi in kept):
            continue
        # A POST to work/ creates an item, whatever its member answered (a
        # request timed out there may apply); a PUT of work/<id> if it did,
        # on the first member that applied it (its own may never answer).
        created = entry.status == 201
        if request.method != "POST" and not (request.prev_exist is False and created):
            continue
        payload = _payload(request.value, False)
        if isinstance(payload, str):
            lost.add(payload)
        named = _created(entry, prefix)
        if named is not None:
            lost.add(named)
    return lost


def _created(entry: Any, prefix: str) -> Optional[str]:
    """The id of the item a log entry created in work/ (``prefix``): a POST's
    is its index, a PUT with prevExist=false's its key; None: it created none."""
    request = entry.request
    if request is None or entry.status != 201 or not (request.key + "/").startswith(prefix):
        return None
    if request.method == "POST":
        return f"{entry.index:020d}"
    return request.key[len(prefix):] if request.prev_exist is False else None


def payload_of(cluster: Cluster, root: str, item: str) -> Optional[str]:
    """The payload of the item of id ``item`` in the current history: that of
    the last creation of work/``item`` in its lineage; None: none there."""
    kept = lineage(cluster, len(cluster.rewinds))
    prefix = f"{root}/work/"
    for position in range(len(cluster.log) - 1, -1, -1):
        entry = cluster.log[position]
        if entry.request is not None and _created(entry, prefix) == item \
                and any(lo <= position < hi for lo, hi in kept):
            payload = _payload(entry.request.value, False)
            return payload if isinstance(payload, str) else None
    return None


def _given_again(cluster: Cluster, root: str, item: str, since: int) -> Optional[int]:
    """The log position, from ``since`` on, where the last history created
    work/``item`` (etcd gave the id again after a restore from an older
    backup); None: it did not."""
    kept = lineage(cluster, len(cluster.rewinds))
    prefix = f"{root}/work/"
    for position in range(since, len(cluster.log)):
        if _created(cluster.log[position], prefix) == item \
                and any(lo <= position < hi for lo, hi in kept):
            return position
    return None


def _record_before(cluster: Cluster, root: str, state: str, item: str,
                   until: int) -> Optional[str]:
    """The record of ``item`` in ``state``/ the last history held before log
    position ``until``: its last write there (a PUT's value; None after a
    delete, or none)."""
    kept = lineage(cluster, len(cluster.rewinds))
    key = f"{root}/{state}/{item}"
    for position in range(min(until, len(cluster.log)) - 1, -1, -1):
        request, status = cluster.log[position].request, cluster.log[position].status
        if request is None or request.key != key or status not in (200, 201) \
                or not any(lo <= position < hi for lo, hi in kept):
            continue
        return request.value if request.method == "PUT" else None
    return None


def _work_writes(cluster: Cluster, root: str,
                 spans: Optional[List[Tuple[int, int]]] = None
                 ) -> Iterator[Tuple[str, str, int]]:
    """(item id, value written, index) of each PUT of work/<id> that applied, in
    the committed log's order (read from the log and its replies); ``spans``:
    only those at these log positions (a history's lineage)."""
    prefix = f"{root}/work/"
    for position, entry in enumerate(cluster.log):
        request, pending = entry.request, entry.pending
        if request is None or pending is None or pending.reply is None:
            continue
        if request.method != "PUT" or not request.key.startswith(prefix):
            continue
        if spans is not None and not any(lo <= position < hi for lo, hi in spans):
            continue
        if pending.reply.status in (200, 201):
            yield (request.key[len(prefix):], request.value,
                   int(pending.reply.headers["x-etcd-index"]))


def fenced_commits(cluster: Cluster, root: str, era: Optional[int] = None) -> Dict[str, int]:
    """Item id -> the index of the first write of work/<id> with its outcome
    ("o") that applied: F1 (``era``: in that history's lineage)."""
    found: Dict[str, int] = {}
    spans = lineage(cluster, era) if era is not None else None
    for item, value, index in _work_writes(cluster, root, spans):
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


def _history_at(cluster: Cluster, position: int) -> int:
    """The history (History.eras) the log entry at ``position`` applied in."""
    return sum(1 for _, struck in cluster.rewinds if struck <= position)


def applied_in(cluster: Cluster, root: str, item: str, token: str,
               index: int) -> Optional[int]:
    """The history the write of work/``item`` carrying claim ``token`` at etcd
    index ``index`` applied in (a C2, or the re-fence); None: no such write."""
    key = f"{root}/work/{item}"
    for position in range(len(cluster.log) - 1, -1, -1):
        entry = cluster.log[position]
        request, pending = entry.request, entry.pending
        if request is None or pending is None or pending.reply is None \
                or request.key != key or request.method != "PUT" \
                or pending.reply.status not in (200, 201) \
                or int(pending.reply.headers["x-etcd-index"]) != index:
            continue
        try:
            value = json.loads(request.value)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict) and value.get("c") == token:
            return _history_at(cluster, position)
    return None


def _record_kept(cluster: Cluster, root: str, state: str, item: str,
                 returned: int) -> Optional[bool]:
    """Whether the write a wait() that returned at log position ``returned``
    learnt ``item``'s outcome ``state`` from is in the last history's lineage
    (etcd kept it): the last write before then of its record, or of
    work/<item> with its outcome (F1, which a wait reads too); None: none."""
    kept = lineage(cluster, len(cluster.rewinds))
    record, work = f"{root}/{state}/{item}", f"{root}/work/{item}"
    for position in range(min(returned, len(cluster.log)) - 1, -1, -1):
        entry = cluster.log[position]
        request, pending = entry.request, entry.pending
        if request is None or pending is None or pending.reply is None \
                or request.method != "PUT" or pending.reply.status not in (200, 201):
            continue
        if request.key == record or (request.key == work and '"o":' in (request.value or "")):
            return any(lo <= position < hi for lo, hi in kept)
    return None


def decide_histories(cluster: Cluster, root: str, history: History) -> None:
    """After a restore from an older backup: note each act's history as the one
    its deciding write applied in, read from the committed log, not the one
    it returned in (a reply held across the restore returns in the new
    history what applied in the lost one): a hand-out's C2 (its token at its
    index), a final commit's F1 (the first write of its token with "o"), a
    give-back's last write of its token, a cancel's K3 (the last write of the
    item with "o" and "cancelled" before it returned).  An act whose write is
    not in the log keeps the history it returned in."""
    writes: Dict[str, List[Tuple[int, Dict[str, Any], int]]] = {}
    prefix = f"{root}/work/"
    for position, entry in enumerate(cluster.log):
        request, pending = entry.request, entry.pending
        if request is None or pending is None or pending.reply is None \
                or request.method != "PUT" or not request.key.startswith(prefix) \
                or pending.reply.status not in (200, 201):
            continue
        try:
            value = json.loads(request.value)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict):
            writes.setdefault(request.key[len(prefix):], []).append(
                (position, value, int(pending.reply.headers["x-etcd-index"])))
    for out in history.hand_outs:
        found = [position for position, value, index in writes.get(out.item, [])
                 if value.get("c") == out.token and index == out.index]
        if found:
            out.era = _history_at(cluster, found[0])
    for commit in history.commits:
        mine = [(position, value) for position, value, _ in writes.get(commit.item, [])
                if value.get("c") == commit.token]
        if commit.outcome in ("completed", "dead-lettered"):
            mine = [(position, value) for position, value in mine if "o" in value][:1]
        if mine:
            commit.era = _history_at(cluster, mine[-1][0])
    for seq, item, cancelled in history.cancels:
        returned = history.positions.get(seq, len(cluster.log))
        found = [position for position, value, _ in writes.get(item, [])
                 if position < returned and "o" in value and value.get("why") == "cancelled"]
        if cancelled and found:
            history.cancel_eras[seq] = _history_at(cluster, found[-1])


def _payload(value: str, record: bool) -> Optional[Any]:
    try:
        return Record.decode(value).payload if record else Item.decode(value).payload
    except (Junk, ValueError):
        return None


def check(history: History, store: Stored, commits: Dict[str, int],
          live: Optional[str], skew: float = 0.0,
          writes: Optional[Dict[Tuple[str, str], int]] = None,
          eras: Optional[List[Dict[str, int]]] = None,
          lost: Optional[Set[str]] = None) -> List[Violation]:
    """Every violation of the run (``live``: why liveness failed, None if it held;
    ``skew``: how far ahead of the clients' a member's clock may be).  After a
    restore from an older backup (History.eras): ``eras``, each history's
    fenced commits (``commits`` is the first's), and ``lost``, the payloads
    of the puts etcd lost at one."""
    found: List[Violation] = []
    found += _delay_kept(history, skew)
    found += _cancel_wins(history)
    found += _kept(history, store, lost or set())
    found += _once(store)
    found += _one_outcome(history, store)
    found += _no_commit_after_reclaim(history, writes or {})
    found += _no_hand_out_after_outcome(history, eras or [commits])
    if live is not None:
        found.append(Violation("liveness", live))
    return found


def _kept(history: History, store: Stored, lost: Set[str]) -> Iterator[Violation]:
    last = history.eras[-1][0] if history.eras else -math.inf
    for item, (when, payload) in history.puts.items():
        if item in lost and (when < last or payload in lost):
            continue  # etcd lost it: restored from a backup older than its put
        held = [_payload(directory[item][1], record)
                for directory, record in ((store.work, False), (store.completed, True),
                                          (store.failed, True)) if item in directory]
        if not held:
            yield Violation("acknowledged-put-kept",
                            f"item {item} ({payload!r}, put at {when:.3f}) is stored nowhere")
        elif payload not in held and None not in held and item not in history.unknown_payloads:
            # Its id holds another put's payload: an item of that name from an
            # earlier history (a restore gives its indexes, and so names, again).
            yield Violation("acknowledged-put-kept",
                            f"item {item} ({payload!r}, put at {when:.3f}) is stored as "
                            f"another put's: {', '.join(map(repr, held))}")


def _once(store: Stored) -> Iterator[Violation]:
    seen: Dict[Any, str] = {}
    requeuing = _requeuing(store)
    for directory, record in ((store.work, False), (store.completed, True),
                              (store.failed, True)):
        for item, (_, value) in directory.items():
            payload = _payload(value, record)
            if payload is None or (directory is store.failed and item in requeuing):
                continue
            key = json.dumps(payload, sort_keys=True)
            if key in seen and seen[key] != item:
                yield Violation("stored-once", f"payload {payload!r} is stored as {seen[key]} "
                                               f"and as {item}")
            seen.setdefault(key, item)


def _requeuing(store: Stored) -> Set[str]:
    """The dead letters marked by a requeue whose new item is stored: a requeue
    stopped before Q4 (a crash, or a restore from a backup taken after its Q3).
    The new item is named by the marking write's index and carries its token;
    the next requeue finds that token and makes no second item, so the payload
    is counted once, as the new item's (docs/protocol.md's crash table)."""
    marked = set()
    for item, (index, value) in store.failed.items():
        try:
            token = Record.decode(value).requeue_token
        except (Junk, ValueError):
            continue
        new_id = f"{index:020d}"
        held = [put_token(decode, directory[new_id][1])
                for directory, decode in ((store.work, Item.decode),
                                          (store.completed, Record.decode),
                                          (store.failed, Record.decode)) if new_id in directory]
        if token and token in held:
            marked.add(item)
    return marked


def _one_outcome(history: History, store: Stored) -> Iterator[Violation]:
    for item in set(store.completed) & set(store.failed):
        yield Violation("one-outcome", f"item {item} is in completed/ and in failed/")
    final: Dict[Tuple[int, str], int] = {}  # (history, item): judged within a history
    for commit in history.commits:
        if commit.outcome in ("completed", "dead-lettered"):
            key = (history.commit_era(commit), commit.item)
            final[key] = final.get(key, 0) + 1
    for (_, item), count in sorted(final.items()):
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
            if out.item != commit.item or out.index <= commit.index or out.seq > commit.seq \
                    or history.hand_out_era(out) != history.commit_era(commit):
                continue
            if final or out.index < given_back:
                yield Violation("no-commit-after-reclaim",
                                f"{commit.kind}() of item {commit.item} by the claim of C2 index "
                                f"{commit.index} returned OK at {commit.time:.3f}, after the "
                                f"claim of index {out.index} was handed out to {out.consumer} "
                                f"at {out.time:.3f}")
                break


def _no_hand_out_after_outcome(history: History,
                               eras: List[Dict[str, int]]) -> Iterator[Violation]:
    """Judged within a history: a hand-out against the F1s its history holds
    (``eras``: each one's, the writes a backup kept among them), and against
    the final commits that returned OK in it."""
    final: Dict[Tuple[int, str], Commit] = {}
    for commit in history.commits:
        if commit.outcome in ("completed", "dead-lettered"):
            final.setdefault((history.commit_era(commit), commit.item), commit)
    for out in history.hand_outs:
        era = history.hand_out_era(out)
        fenced = eras[min(era, len(eras) - 1)].get(out.item)
        if fenced is not None and out.index > fenced:
            yield Violation("no-hand-out-after-outcome",
                            f"item {out.item} was handed out to {out.consumer} at {out.time:.3f} "
                            f"with C2 index {out.index}, after its commit F1 at {fenced}")
        done = final.get((era, out.item))
        if done is not None and out.seq > done.seq:
            yield Violation("no-hand-out-after-outcome",
                            f"item {out.item} was handed out to {out.consumer} at {out.time:.3f}, "
                            f"after its {done.kind}() returned OK at {done.time:.3f}")


def _delay_kept(history: History, skew: float) -> Iterator[Violation]:
    for out in history.hand_outs:
        if out.item in history.delayed:
            called, delay = history.delayed[out.item]
            if not _same_item(history, history.hand_out_era(out), out.item, called):
                continue
            if out.time < called + delay - skew:
                yield Violation("delay-kept", f"item {out.item}, put at {called:.3f} with a "
                                f"delay of {delay:g} s, was handed out at {out.time:.3f}")


def _same_item(history: History, era: int, item: str, put: float) -> bool:
    """Whether the item handed out in history ``era`` is the one put at time ``put``:
    after a restore from an older backup, etcd names new items by indexes it
    had given before; one put in an earlier history is the same item if each
    backup since kept it (its name, an index, is at most the backup's)."""
    put_era = sum(1 for when, _, _, _ in history.eras if put >= when)
    if put_era >= era:
        return put_era == era
    return item.isdigit() and all(int(item) <= index
                                  for _, _, _, index in history.eras[put_era:era])


def _cancel_wins(history: History) -> Iterator[Violation]:
    for seq, item, cancelled in history.cancels:
        if not cancelled:
            continue
        for out in history.hand_outs:
            if out.item == item and out.seq > seq \
                    and history.hand_out_era(out) == history.cancel_era(seq):
                yield Violation("cancel-wins", f"item {item} was handed out to {out.consumer} "
                                f"at {out.time:.3f}, after cancel() returned True")
        for commit in history.commits:
            if commit.item == item and commit.outcome == "completed" \
                    and history.commit_era(commit) == history.cancel_era(seq):
                yield Violation("cancel-wins", f"item {item} was completed OK at "
                                f"{commit.time:.3f}, and cancel() returned True")


# -- the library's state, read in one place each ---------------------------------------
@dataclass
class ViewState:
    """What a consumer's view holds (see :func:`view_state`)."""

    #: Items in work/ it knows: id -> (index, value or None), one version each.
    items: Dict[str, Tuple[int, Optional[str]]]
    #: Items it offers to no claim on a sign that their lock (or their
    #: finisher's) is there; not this process's claim attempts under way.
    taken: Set[str]
    watching: bool
    #: Items whose lock it holds: id -> the index it knows the lock at.
    locks: Dict[str, int] = field(default_factory=dict)
    #: Items it takes for its own process's live claims' (their signs unchecked).
    own: Set[str] = field(default_factory=set)


def view_state(queue: Queue) -> Optional[ViewState]:
    """The state of ``queue``'s view (None: it has none, or not ready, or closed).

    The one reader of the view's state in the simulator (``QueueView.state``,
    a :class:`~etcdq_v2.viewstate.ViewState`): the state may move into
    another shape, and this function follows it.  No lock is taken: one
    sim-thread runs at a time, and the view changes its state under its lock
    without blocking in between."""
    view = queue._view
    if view is None:
        return None
    state = view.state
    if state.closed or not state.ready:
        return None
    now = view._runtime.monotonic()
    held = {item for item, due in state.orphans.items() if due > now}
    taken = (set(state.locks) | state.recorded | held) - set(state.trying)
    return ViewState(dict(state.items), taken & set(state.items), state.watching,
                     dict(state.locks), set(state.own))


@dataclass
class ClaimState:
    """What an open claim holds (see :func:`claim_state`)."""

    index: int
    item: Item
    confirmed: float  # boot_clock() of the last confirmation's send (-inf: another's)
    lost: bool
    refresh_failed: bool  # the heartbeat's last refresh got no answer
    committing: bool  # complete()/fail()/release() runs (they confirm the lock themselves)
    closed: bool  # its queue was closed
    interval: float  # its heartbeat's: a refresh is due this long after the last one's send


def claim_state(claim: Claim) -> ClaimState:
    """The one reader of a Claim's internals in the simulator."""
    state = claim._state
    return ClaimState(state.index, state.item, state.confirmed, claim.lost,
                      claim._refresh_error is not None, settling(claim),
                      claim._heartbeat._closed, claim._heartbeat.interval)


# -- checked as the run goes -------------------------------------------------------------
@dataclass
class Bounds:
    lock_ttl: float
    #: An item taken in a view after its lock went (the store has none).
    taken: float
    #: An item in work/ that a ready view does not hold.
    known: float
    #: How long an older item may have been free when a claim at a window of one gets another.
    order: float
    #: How long an item may stay free in the store while a consumer is idle in claim().
    starve: float = math.inf
    #: How late a refresh may leave after its due time.
    grace: float = 0.5
    #: How many newer items a consumer at a window of one may be handed while its
    #: view holds an orphan free.
    passes: float = math.inf
    #: An item taken in a view by a lock whose removal its stream delivered
    #: (the view frees it on the event; a sign older than the stream is
    #: confirmed CONFIRM after), counted from the delivery.
    freed: float = math.inf
    #: An item its follower's listing of work/ read may stay out of a ready view
    #: this long after the read (the round lists locks/ before it applies both).
    listed: float = math.inf
    #: An item taken in a view by a lock at an index above etcd's (a sign of
    #: an older history: a restore from a backup sent the index back), with no
    #: lock in the store, counted from the restore.
    older: float = math.inf


@dataclass
class Live:
    """The invariants judged on the library's state as the run goes (every
    ``check``): one-version, view-taken-freed, view-knows-work,
    lone-put-order and orphans-offered (every hand-out at a window of one),
    no-starving-while-idle and heartbeat-on-time."""

    history: History
    cluster: Cluster
    root: str
    bounds: Bounds
    #: (process, request path) -> when a request of it was last on the network (Network.touched).
    touched: Dict[Tuple[str, str], float] = field(default_factory=dict)
    #: (item, index) -> the value a write of work/<item> at that index wrote.
    writes: Dict[Tuple[str, int], str] = field(default_factory=dict)
    _read: int = 0
    _unanswered: List[int] = field(default_factory=list)
    _taken: Dict[Tuple[str, str], float] = field(default_factory=dict)
    _unknown: Dict[Tuple[str, str], float] = field(default_factory=dict)
    _free: Dict[str, float] = field(default_factory=dict)
    #: (process, item) -> since when its view has held the item, not taken.
    _held: Dict[Tuple[str, str], float] = field(default_factory=dict)
    _judged: int = 0  # hand-outs judged by lone-put-order
    _orphans_judged: int = 0  # hand-outs judged by orphans-offered
    #: (process, orphan) -> (since when its view held it free, newer items handed out since).
    _passes: Dict[Tuple[str, str], Tuple[float, int]] = field(default_factory=dict)
    _failed: Dict[int, float] = field(default_factory=dict)  # id(claim) -> refresh failure seen
    #: The longest each bounded state lasted (figures: how close to the bound).
    longest: Dict[str, float] = field(default_factory=dict)
    #: From when no-starving-while-idle judges: the end of the faults' aftermath
    #: (inf while the faults last: it depends on what struck).
    calm: Callable[[], float] = lambda: math.inf
    #: item -> since when the store has held it free (no lock, no delay lock).
    _free_since: Dict[str, float] = field(default_factory=dict)
    #: Whether a process is cut from every member now (Network.partitioned): its
    #: view can learn nothing, so view-taken-freed and view-knows-work count
    #: from the partition's end.
    cut_off: Callable[[str], bool] = lambda name: False
    #: (process, item) -> (index, when) of each removal of the item's lock its
    #: streams delivered (Network.removals).
    removals: Dict[Tuple[str, str], List[Tuple[int, float]]] = field(default_factory=dict)
    _told: Set[Tuple[str, str]] = field(default_factory=set)  # freed: said once
    #: process -> when its view was last looked at (a quiet view's pause is not counted).
    _looked: Dict[str, float] = field(default_factory=dict)
    #: view-knows-work: process -> (when its view's follower read its last
    #: listing of work/, or the reply of its last request since (inf while one
    #: is out), the ids it listed -> their createdIndex), until the follower
    #: lists work/ again.
    _listed: Dict[str, Tuple[float, Dict[str, int]]] = field(default_factory=dict)
    #: The simulation's virtual time now.
    clock: Callable[[], float] = lambda: 0.0
    #: misses-bounded: claim loop -> (its miss limit by the last listing of work/
    #: it read, races lost since), while no listing of work/ was sent since.
    _misses: Dict[str, Tuple[int, int]] = field(default_factory=dict)
    #: (process, lock key) -> C1s sent with no reply read since (a retry's
    #: "already exists" may be its own lock's: not counted).
    _c1_sent: Dict[Tuple[str, str], int] = field(default_factory=dict)
    #: own-claims-live: (process, item) -> since when its view's own held it with no live claim.
    _stale: Dict[Tuple[str, str], float] = field(default_factory=dict)
    _stale_told: Set[Tuple[str, str]] = field(default_factory=set)
    #: (item, index) -> the values earlier histories wrote there (a restore from
    #: an older backup gives indexes again): one-version holds for any of them.
    _earlier: Dict[Tuple[str, int], Set[str]] = field(default_factory=dict)
    #: When the last restore from an older backup struck (-inf: none): a
    #: removal a stream delivered before it is of another history.
    _rewound_at: float = -math.inf
    #: view-taken-freed, signs of an older history: (process, item) -> since when.
    _older: Dict[Tuple[str, str], float] = field(default_factory=dict)
    #: process -> the lock signs (item -> index) its view held when the last
    #: restore from an older backup struck.
    _signs_before: Dict[str, Dict[str, int]] = field(default_factory=dict)

    def rewound(self, now: float, index: int) -> None:
        """The cluster was restored from an older backup (etcd's index went back
        to ``index``, every watch ended): the bounded states restart now, as
        from a new history; what the views knew of the older one they must
        unlearn within the same bounds."""
        self.history.rewound(now, index)
        self._rewound_at = now
        self._signs_before = {}
        for name, queue in sorted(self.history.queues.items()):
            view = view_state(queue)
            if view is not None:
                self._signs_before[name] = dict(view.locks)
        for since in (self._taken, self._unknown, self._held):
            for key in since:
                since[key] = max(since[key], now)
        self._free = {item: max(when, now) for item, when in self._free.items()}
        self._free_since = {item: max(when, now) for item, when in self._free_since.items()}
        self._listed.clear()
        self._passes.clear()
        self._misses.clear()

    def check(self, now: float, *, store: bool) -> None:
        """The checks on the library's state; ``store``: also those that compare
        it with the store (each costs a read of it)."""
        self._read_writes()
        held = stored(self.cluster, self.root, now) if store else None
        for name, queue in sorted(self.history.queues.items()):
            view = view_state(queue)
            if view is None:
                continue
            for item, (index, raw) in view.items.items():
                self._one_version(f"the view of {name}", item, index, raw)
            if held is not None and not self._killed(name, now):
                self._view(name, view, held, now)
            if not self._killed(name, now):
                self._own(name, queue, view, now)
        self._claims(now)
        if held is not None:
            self._starving(held, now)
        if held is not None:
            self._order(held, now)
            self._orphans(held, now)

    def exchanged(self, client: str, thread: str, request: Tuple[str, str, Optional[str]],
                  status: int, body: bytes) -> None:
        """On each request a process sends (``status`` 0) and each reply it
        reads whole (Network.exchanged): the listings of work/ its view's
        follower read (view-knows-work, by :meth:`_listed`) and the races its
        claims lost (misses-bounded, by :meth:`_missed`)."""
        method, path, form = request
        target, _, query = path.partition("?")
        prefix = f"/v2/keys{self.root}/"
        if method == "GET" and target == f"{prefix}work" and "sorted=true" in query \
                and "wait=true" not in query:
            listed: Optional[Dict[str, int]] = None
            if status == 200:
                try:
                    listed = {node["key"].rsplit("/", 1)[1]: node["createdIndex"] for node in
                              (json.loads(body).get("node") or {}).get("nodes") or []}
                except (ValueError, KeyError, AttributeError):
                    return
            if thread == FOLLOWER:
                if status == 0:
                    self._listed.pop(client, None)  # its round lists again
                elif listed is not None:
                    self._listed[client] = (self.clock(), listed)
            if client.startswith("c"):
                if status == 0:
                    self._misses.pop(client, None)
                elif listed is not None:
                    self._misses[client] = (
                        max(1, (len(listed) + MISS_COST // 2) // MISS_COST), 0)
            return
        if client.startswith("c") and method == "PUT" \
                and target.startswith(f"{prefix}locks/") and "prevExist=false" in (form or ""):
            self._missed(client, target, status)
        if thread == FOLLOWER and client in self._listed:
            # The round's requests after its listing of work/ (locks/, lock
            # reads, its stream): it applies its listings after their replies.
            self._listed[client] = (math.inf if status == 0 else self.clock(),
                                    self._listed[client][1])

    def _missed(self, client: str, target: str, status: int) -> None:
        """misses-bounded: after a listing of work/ that a claim loop (a process
        ``c<n>``: one claiming thread) read, its quiet view loses at most its
        miss limit of races (a C1 refused: the lock is there; one per
        MISS_COST = 100 listed items, at least one) before the process sends
        another listing of work/ (docs/protocol.md, "Where a claim looks": a
        quiet view lists again once its misses cost about a listing).  Counted
        afresh at each listing of work/ it reads; not while its view watches or
        is not ready, nor once a listing was sent; not a C1 sent again (its
        "already exists" may be its own lock's)."""
        key = (client, target)
        if status == 0:
            self._c1_sent[key] = self._c1_sent.get(key, 0) + 1
            return
        sent = self._c1_sent.pop(key, 0)
        if status != 412 or sent != 1 or client not in self._misses:
            return
        queue = self.history.queues.get(client)
        view = view_state(queue) if queue is not None else None
        if view is None or view.watching:
            self._misses.pop(client, None)
            return
        limit, lost = self._misses[client]
        self._misses[client] = (limit, lost + 1)
        self.longest["misses-bounded"] = max(self.longest.get("misses-bounded", 0.0),
                                             lost + 1 - limit)
        if lost + 1 > limit + MISSES_OVER:
            self._seen("misses-bounded", f"{client} lost {lost + 1} races for locks since "
                       f"its last listing of work/ (miss limit {limit}), and sent no listing "
                       f"of work/ meanwhile (the last: {target.rsplit('/', 1)[1]})")
            self._misses.pop(client, None)  # said once a listing

    def _killed(self, name: str, now: float) -> bool:
        """Whether ``name``'s process died by ``now``: its view serves no claim,
        so what it knows is judged no more (its stream may still deliver)."""
        return any(start <= now and end == math.inf
                   for start, end in self.history.paused.get(name, []))

    def _paused(self, name: str, now: float) -> bool:
        """Whether ``name``'s process is paused now: a quiet view (which hears
        nothing) learns nothing meanwhile, as in a partition: its claims' and
        listings' requests do not leave."""
        return any(start <= now <= end for start, end in self.history.paused.get(name, []))

    def _seen(self, name: str, detail: str) -> None:
        self.history.seen.append((name, detail))

    def _read_writes(self) -> None:
        """Note the writes of work/ the log committed since the last check (one
        whose member has not answered yet, when it has)."""
        prefix = f"{self.root}/work/"
        log = self.cluster.log
        waiting, self._unanswered = self._unanswered + list(range(self._read, len(log))), []
        self._read = len(log)
        for position in waiting:
            request, pending = log[position].request, log[position].pending
            if request is None or pending is None or request.method != "PUT" \
                    or not request.key.startswith(prefix) or request.refresh:
                continue
            if pending.reply is None:
                self._unanswered.append(position)
            elif pending.reply.status in (200, 201):
                index = int(pending.reply.headers["x-etcd-index"])
                key = (request.key[len(prefix):], index)
                if key in self.writes and self.history.eras:
                    self._earlier.setdefault(key, set()).add(self.writes[key])
                self.writes[key] = request.value

    def _one_version(self, holder: str, item: str, index: int, raw: Optional[str],
                     held: Optional[Item] = None) -> None:
        """The value held at ``index`` (``raw``, or the decoded ``held``) is the
        one written there."""
        written = self.writes.get((item, index))
        if written is None or (raw is None and held is None):
            return
        same = any(self._same(value, raw, held)
                   for value in [written, *self._earlier.get((item, index), ())])
        if not same:
            self._seen("one-version", f"{holder} holds item {item} at index {index} with "
                       f"the value {raw!r}, but the write at that index wrote {written!r}")

    @staticmethod
    def _same(written: str, raw: Optional[str], held: Optional[Item]) -> bool:
        if held is None:
            return written == raw
        try:
            return Item.decode(written) == held
        except Junk:
            return False

    def _view(self, name: str, view: ViewState, store: Stored, now: float) -> None:
        last, self._looked[name] = self._looked.get(name, now), now
        if self.cut_off(name):
            for since in (self._taken, self._unknown, self._held):
                for key in [key for key in since if key[0] == name]:
                    del since[key]
            return
        if not view.watching and self._paused(name, now):
            # A quiet view learns nothing while its process is paused: the
            # pause is not counted, what it was wrong before it still is.
            for since in (self._taken, self._unknown, self._held):
                for key in [key for key in since if key[0] == name]:
                    since[key] += now - last
            return
        for item in store.work:
            gone = item in view.taken and item not in store.locks
            self._bounded("view-taken-freed", self._taken, (name, item), gone, now,
                          self.bounds.taken, f"item {item} is taken in the view of {name}, "
                          "though it has no lock")
            self._bounded("view-knows-work", self._unknown, (name, item),
                          item not in view.items, now, self.bounds.known,
                          f"item {item} is in work/ but not in the view of {name}")
            if item in view.items and item not in view.taken:
                self._held.setdefault((name, item), now)
            else:
                self._held.pop((name, item), None)
        self._freed(name, view, now)
        if self.history.eras:
            self._older_signs(name, view, store, now)
        self._known_listed(name, view, store, now)
        for key in [key for key in self._held if key[0] == name and key[1] not in store.work]:
            del self._held[key]
        for key in [key for key in self._taken if key[0] == name and key[1] not in store.work]:
            del self._taken[key]
        for key in [key for key in self._unknown if key[0] == name and key[1] not in store.work]:
            del self._unknown[key]

    def _freed(self, name: str, view: ViewState, now: float) -> None:
        """view-taken-freed, from the view's own rule: no item stays taken by a
        lock (at the index the view knows it) whose removal, at that index or
        above, a stream of the process delivered more than ``freed`` ago
        (counted from the end of a pause of the process meanwhile)."""
        for item in sorted(view.taken):
            index = view.locks.get(item)
            if index is None or (name, item) in self._told:
                continue
            told = [when for removed, when in self.removals.get((name, item), [])
                    if removed >= index and when >= self._rewound_at]
            if not told:
                continue
            start = min(told)
            for paused, resumed in self.history.paused.get(name, []):
                if paused <= now and resumed >= start:
                    start = max(start, resumed)
            self.longest["view-taken-freed (told)"] = max(
                self.longest.get("view-taken-freed (told)", 0.0), now - start)
            if now - start > self.bounds.freed:
                self._seen("view-taken-freed", f"item {item} is taken in the view of {name} "
                           f"by its lock at index {index}, though its stream delivered the "
                           f"lock's removal at {min(told):.3f} (now {now:.3f}, bound "
                           f"{self.bounds.freed:g} s)")
                self._told.add((name, item))

    def _older_signs(self, name: str, view: ViewState, store: Stored, now: float) -> None:
        """view-taken-freed, across a restore from an older backup: no item in
        work/ with no lock stays taken in a view, by the sign (a lock at an
        index) it held when the restore struck, for longer than ``older``.
        The sign is of the history etcd lost, its lock's removal never comes:
        the restore ended every watch, and the view's next listing of locks/,
        which has no such lock, frees the item."""
        before = self._signs_before.get(name, {})
        for item in sorted(store.work):
            sign = view.locks.get(item)
            stale = sign is not None and before.get(item) == sign and item in view.taken \
                and item not in store.locks
            self._bounded("view-taken-freed", self._older, (name, item), stale, now,
                          self.bounds.older, f"item {item} is taken in the view of {name} by "
                          f"a lock at index {sign}, a sign it held when the cluster was "
                          f"restored from an older backup at {self._rewound_at:.3f}, and the "
                          "store has no lock of it", "view-taken-freed (older history)")
        for key in [key for key in self._older if key[0] == name and key[1] not in store.work]:
            del self._older[key]

    def _known_listed(self, name: str, view: ViewState, store: Stored, now: float) -> None:
        """view-knows-work, from the view's own listing: an item its follower's
        last listing of work/ read, still in work/ as the node it read with
        no outcome (a claim that found it finished drops it), is in the
        ready view within ``listed`` of that read, or of the reply to the follower's last request
        after it (locks/, lock reads, its stream: the round applies its
        listings once they are in; none while one is out), counted from the end
        of a pause of the process meanwhile; unless the follower listed work/
        again since: the round failed (docs/protocol.md: a listing is dropped
        only for a newer one, which holds it too).  The node is told by its
        createdIndex (a CAS keeps it): one created under the
        id since the item left (a late D2, a requeue) no listing held; the
        view learns it as any new item (KNOWN_BOUND)."""
        if name not in self._listed:
            return
        read, ids = self._listed[name]
        start = read
        if start == math.inf:
            return
        for paused, resumed in self.history.paused.get(name, []):
            if paused <= now and resumed >= start:
                start = max(start, resumed)
        missing = sorted(item for item, created in ids.items()
                         if store.work_created.get(item) == created
                         and '"o":' not in store.work[item][1] and item not in view.items)
        self.longest["view-knows-work (listed)"] = max(
            self.longest.get("view-knows-work (listed)", 0.0),
            now - start if missing else 0.0)
        if missing and now - start > self.bounds.listed:
            self._seen("view-knows-work", f"item {missing[0]} is in work/ but not in the view "
                       f"of {name}, though its follower's listing of work/ held it and the "
                       f"round's last reply came at {read:.3f} (now {now:.3f}, bound {self.bounds.listed:g} s)")
            del self._listed[name]  # said once a listing

    def _bounded(self, invariant: str, since: Dict[Tuple[str, str], float],
                 key: Tuple[str, str], holds: bool, now: float, bound: float,
                 what: str, figure: Optional[str] = None) -> None:
        """A state that may last up to ``bound``: a violation once it lasted longer
        (``figure``: the name its longest is noted by, if not ``invariant``)."""
        if not holds:
            since.pop(key, None)
            return
        start = since.setdefault(key, now)
        figure = figure or invariant
        self.longest[figure] = max(self.longest.get(figure, 0.0), now - start)
        if now - start > bound:
            self._seen(invariant, f"{what} from {start:.3f} to {now:.3f} (bound {bound:g} s)")
            since[key] = math.inf  # said once

    def _own(self, name: str, queue: Queue, view: ViewState, now: float) -> None:
        """own-claims-live: every item a view takes for its process's live
        claim's (ViewState.own) is the item of an open claim of that view that
        is not lost or whose complete()/fail()/release() runs (its end tells
        the view), but for a heartbeat interval and two seconds after it was
        lost or ended (counted from the end of a pause of the process)."""
        live = {claim.id for claims in self.history.open.values() for claim in claims
                if claim._view is queue._view and claim.outcome is None
                and (settling(claim) or not claim.lost)}
        bound = queue._heartbeat.interval + 2.0
        for item in view.own - live:
            since = self._stale.setdefault((name, item), now)
            if self.history.was_paused(name, since, now):
                self._stale[(name, item)] = since = now
            if now - since > bound and (name, item) not in self._stale_told:
                self._stale_told.add((name, item))
                self._seen("own-claims-live", f"the view of {name} took item {item} for its "
                           f"own live claim's from {since:.3f} to {now:.3f}, with no open "
                           f"claim of it that is not lost")
        for key in [key for key in self._stale if key[0] == name and key[1] not in view.own]:
            del self._stale[key]

    def _claims(self, now: float) -> None:
        owners = {(out.item, out.token): out.consumer for out in self.history.hand_outs}
        for item, claims in self.history.open.items():
            for claim in claims:
                if claim.outcome is not None:
                    continue
                state = claim_state(claim)
                self._one_version(f"the claim of {claim.id}", item, state.index, None,
                                  state.item)
                self._on_time(claim, state, owners.get((item, claim._state.lock.token), ""),
                              now)

    def _on_time(self, claim: Claim, state: ClaimState, owner: str, now: float) -> None:
        """heartbeat-on-time: the refresh of an open claim's lock is on the network
        within ``grace`` of its due time: interval after its last confirmation's
        send, or a second after a refresh that failed (noted when first seen)."""
        key = id(claim)
        if not state.refresh_failed:
            self._failed.pop(key, None)
            due = state.confirmed + state.interval
        else:
            due = self._failed.setdefault(key, now) + min(1.0, state.interval)
        if (state.lost or state.committing or state.closed or now <= due + self.bounds.grace
                or self.history.was_paused(owner, due - state.interval, now)):
            return
        path = f"/v2/keys{self.root}/locks/{claim.id}"
        if self.touched.get((owner, path), -math.inf) >= due - self.bounds.grace:
            return  # a request of it went out since it was due, or waits for its reply
        self._seen("heartbeat-on-time", f"the lock of item {claim.id} ({owner}), due for "
                   f"its refresh at {due:.3f}, had no request on the network by {now:.3f}")
        self._failed[key] = math.inf  # said once

    def _starving(self, store: Stored, now: float) -> None:
        """no-starving-while-idle: no item free in the store for longer than
        ``starve`` (counted from ``calm`` at the earliest) while a consumer that
        was neither paused nor killed was idle in claim() all that time."""
        free = [item for item in sorted(store.work) if item not in store.locks]
        self._free_since = {item: self._free_since.get(item, now) for item in free}
        calm = self.calm()
        if now < calm:
            return
        cut = now - self.bounds.starve
        idle = sorted(name for name, since in self.history.idle.items()
                      if since <= cut and not self.history.was_paused(name, since, now))
        for item, since in self._free_since.items():
            start = max(since, calm)
            self.longest["no-starving-while-idle"] = max(
                self.longest.get("no-starving-while-idle", 0.0), now - start)
            if idle and start <= cut:
                self._seen("no-starving-while-idle", f"item {item} has been free in the store "
                           f"from {start:.3f} to {now:.3f} (bound {self.bounds.starve:g} s) "
                           f"while {idle[0]} was idle in claim() since "
                           f"{self.history.idle[idle[0]]:.3f}")
                self._free_since[item] = math.inf  # said once

    def _order(self, store: Stored, now: float) -> None:
        """lone-put-order, for the hand-outs since the last check: none at a window
        of one while an older item had been free in the store, and held free by
        the consumer's view, for ``order`` seconds, and still is (what the view
        does not know is view-knows-work's and view-taken-freed's to judge)."""
        free = {item for item, (_, value) in store.work.items()
                if item not in store.locks and '"o":' not in value}
        for out in self.history.hand_outs[self._judged:]:
            cut = out.time - self.bounds.order
            older = [item for item, since in self._free.items()
                     if item < out.item and item in free and since <= cut
                     and self._held.get((out.consumer, item), math.inf) <= cut]
            if older and out.fifo:
                self._seen("lone-put-order", f"item {out.item} was handed out at "
                           f"{out.time:.3f} while the older {older[0]}, free since "
                           f"{self._free[older[0]]:.3f}, was held free by its view")
            self._free.pop(out.item, None)
        self._judged = len(self.history.hand_outs)
        self._free = {item: self._free.get(item, now) for item in sorted(free)}

    def _orphans(self, store: Stored, now: float) -> None:
        """orphans-offered, for the hand-outs since the last check: no consumer is
        handed more than ``passes`` items newer than an orphan (an item in work/
        with its outcome, F1, and no lock in the store: its F3 never came) at a
        window of one while its view has held the orphan free (its orphan delay
        over) and the orphan is one still."""
        orphans = sorted(item for item, (_, value) in store.work.items()
                         if item not in store.locks and '"o":' in value)
        for out in self.history.hand_outs[self._orphans_judged:]:
            if not out.fifo:
                continue
            for item in orphans:
                key = (out.consumer, item)
                since = self._held.get(key, math.inf)
                if since >= out.time or out.item <= item:
                    continue
                was, passes = self._passes.get(key, (since, 0))
                passes = passes + 1 if was == since else 1
                self._passes[key] = (since, passes)
                self.longest["orphans-offered"] = max(
                    self.longest.get("orphans-offered", 0.0), passes)
                if passes == self.bounds.passes + 1:
                    self._seen("orphans-offered", f"item {out.item} was handed out to "
                               f"{out.consumer} at {out.time:.3f} at a window of one: {passes} "
                               f"items newer than the orphan {item} (its outcome in work/, no "
                               f"lock), which its view has held free since {since:.3f} "
                               f"(bound {self.bounds.passes:g})")
        self._orphans_judged = len(self.history.hand_outs)
        for key in [key for key in self._passes if key[1] not in orphans]:
            del self._passes[key]


# -- checked at the end ------------------------------------------------------------------
def refreshes_of_others(cluster: Cluster, root: str, senders: Dict[int, str],
                        history: History) -> Iterator[Violation]:
    """refresh-of-own-lock: every refresh of locks/<id> that applied found there a
    lock its sender's process took: of a claim it was handed, or of its claim
    attempt under way (C1 by it, with that token; a refresh is due from C1's send)."""
    prefix = f"{root}/locks/"
    claims: Dict[str, Set[Tuple[str, str]]] = {}  # process -> (item, token) handed to it
    for out in history.hand_outs:
        claims.setdefault(out.consumer, set()).add((out.item, out.token))
    for entry in cluster.log:
        request, pending = entry.request, entry.pending
        if request is None or pending is None or pending.reply is None:
            continue
        if request.prev_exist is False and request.key.startswith(prefix) \
                and pending.reply.status == 201:
            # A claim attempt's C1: its process's own lock, handed out or not yet
            # (the heartbeat refreshes an attempt from C1's send on).
            try:
                token = Lock.decode(request.value).token
            except Junk:
                continue
            claims.setdefault(senders.get(id(pending), ""), set()).add(
                (request.key[len(prefix):], token))
            continue
        if not request.refresh:
            continue
        if not request.key.startswith(prefix) or pending.reply.status != 200:
            continue
        sender = senders.get(id(pending), "")
        item = request.key[len(prefix):]
        try:
            lock = Lock.decode(json.loads(pending.reply.body)["prevNode"]["value"])
        except (Junk, KeyError, ValueError):
            continue
        if (item, lock.token) not in claims.get(sender, set()):
            yield Violation("refresh-of-own-lock", f"a refresh of {request.key} by {sender} "
                            f"applied at index {pending.reply.headers.get('x-etcd-index')} "
                            f"on the lock of another claim ({lock.node_id})")
            return


def read_backs(cluster: Cluster, root: str, threads: Dict[int, Tuple[str, str]],
               history: History) -> Iterator[Violation]:
    """read-back-finds-applied: no put that raised "not found in the queue"
    after a lost reply had, by the log, every payload it sent stored by a
    POST that applied before its read-back began (its last quorum read of
    work/00000000000000000000, by its sim-thread: the read that gives the
    search's top index *T*; P1).  A put() sends one payload; a put_many()
    is judged when each of its payloads applied before that read (its doubts
    are among them)."""
    zero = f"{root}/work/{'0' * 20}"
    for doubt in history.doubts:
        if not doubt.not_found or any(doubt.first < struck <= doubt.last
                                      for _, struck in cluster.rewinds):
            continue  # judged within a history: a restore struck during its read-back
        top: Optional[int] = None
        applied: Dict[str, int] = {}  # payload -> log position of its POST
        for position in range(doubt.first, doubt.last):
            request, pending = cluster.log[position].request, cluster.log[position].pending
            if request is None or pending is None or pending.reply is None \
                    or threads.get(id(pending)) != (doubt.process, doubt.thread):
                continue
            if request.method == "GET" and request.quorum and request.key == zero:
                top = position
            elif request.method == "POST" and pending.reply.status == 201:
                payload = _payload(request.value, False)
                if isinstance(payload, str):
                    applied.setdefault(payload, position)
        if top is not None and all(applied.get(payload, top) < top
                                   for payload in doubt.payloads):
            yield Violation("read-back-finds-applied",
                            f"a put of {doubt.payloads} by {doubt.process} raised that its "
                            f"read-back found it nowhere, though its POST applied at log "
                            f"position {applied[doubt.payloads[-1]]}, before its read-back's "
                            f"read of T at {top}")
            return


def claims_available(history: History, since: float) -> Iterator[Violation]:
    """claims-available: no claim() called at or after ``since`` (the faults'
    aftermath over: every member answers) in a process neither paused nor killed
    meanwhile (a killed one sends nothing, so its claims must fail) raised Unavailable."""
    for called, raised, name, error in history.unavailable:
        if called >= since and not history.was_paused(name, called, raised):
            yield Violation("claims-available", f"a claim() of {name} called at {called:.3f} "
                            f"raised at {raised:.3f}, with every member answering: {error}")
            return


def _wait_payload(item: str, named: str, kept: str, returned: Any,
                  put: Optional[str]) -> Iterator[Violation]:
    """wait-agrees, whose outcome: the record a wait returned is that of the item
    put under the id it names (its payload), and the one the store keeps there
    (a requeue's tombstone carries no payload)."""
    if put is not None and returned != put:
        yield Violation("wait-agrees", f"wait({item}) returned the record of {named} with "
                        f"payload {returned!r}, not that of the item put as {named} "
                        f"({put!r}): another item's record")
        return
    with contextlib.suppress(Junk):
        if Record.decode(kept).payload != returned:
            yield Violation("wait-agrees", f"wait({item}) returned the record of {named} "
                            f"with payload {returned!r}; the store keeps another there")


def waits_agree(history: History, store: Stored,
                cluster: Optional[Cluster] = None, root: str = "") -> Iterator[Violation]:
    """wait-agrees: a completed outcome wait() returned is in completed/ at the
    end; a failed one in failed/ (a dead letter, or its requeue's tombstone):
    those the last history holds (the end's store is its).  After a restore
    from an older backup (``cluster``'s rewinds), a wait is of the history
    the outcome's write applied in (its record's, or F1's: the last before
    the wait returned, read from the log), not of the one it returned in."""
    last = history.eras[-1][2] if history.eras else 0
    for number, (item, named, state) in enumerate(history.waits):
        kept = _record_kept(cluster, root, state, named, history.wait_positions[number]) \
            if cluster is not None and cluster.rewinds \
            and number < len(history.wait_positions) else None
        if kept is False or (kept is None and number < last):
            continue  # etcd lost the outcome at a restore from an older backup
        record = _record_of_its_item(history, store, cluster, root, number)
        if record is None:
            yield Violation("wait-agrees", f"wait({item}) returned {named} {state}, which "
                            f"is not in {_directory(state)}/")
        elif record and number < len(history.wait_payloads):
            yield from _wait_payload(item, named, record, *history.wait_payloads[number])


def _directory(state: str) -> str:
    return "completed" if state == "completed" else "failed"


def _record_of_its_item(history: History, store: Stored, cluster: Optional[Cluster],
                        root: str, number: int) -> Optional[str]:
    """The record the store keeps for the item wait ``number`` returned the
    outcome of: the one at the end, or, when etcd gave its id again after the
    wait returned (a restore from an older backup), the one held just before
    that (the end's is the new item's); "": it left before (nothing to
    judge); None: none at the end."""
    _, named, state = history.waits[number]
    if cluster is not None and cluster.rewinds and number < len(history.wait_positions):
        again = _given_again(cluster, root, named, history.wait_positions[number])
        if again is not None:
            return _record_before(cluster, root, _directory(state), named, again) or ""
    where = store.completed if state == "completed" else store.failed
    return where[named][1] if named in where else None
