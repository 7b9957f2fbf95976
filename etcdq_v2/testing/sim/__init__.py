"""A deterministic in-memory etcd v2 for the simulator: the keys API as etcdq_v2 uses it.

No threads, sockets, clocks or randomness: time is an argument of every
call, and the one source of disorder (the order of an unsorted listing) is
a ``shuffle`` the caller may inject (``random.Random(seed).shuffle``).  The
same calls give the same replies, byte for byte.  tests/test_model_*.py
check it against real etcd 3.4 and 3.5; docs/simulation.md says what it
models and what it leaves out.

=========  ==============================================================
gojson     JSON text as etcd's Go encoder writes it
store      one member's store: tree, index, history, watchers, TTLs
api        the HTTP layer: a request in, a reply (status, headers, body) out
cluster    members, the raft log, lag, the leader's sweeps, faults' hooks
=========  ==============================================================
"""
from .api import Reply, Request, Route
from .cluster import Cluster, Member, Pending
from .store import Code, Store, V2Error, Version, Watcher

__all__ = ["Cluster", "Code", "Member", "Pending", "Reply", "Request", "Route", "Store",
           "V2Error", "Version", "Watcher"]
