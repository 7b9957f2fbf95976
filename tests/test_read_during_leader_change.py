"""A quorum read made while the cluster changes leader is answered once a
leader is elected, within the call's deadline.

etcd drops a proposal made while its member has no leader (or forwards it to
a leader that just died), and the HTTP request then waits etcd's own request
timeout, 7 s, before a 500 (../shared/etcd-v2-notes.md, section 10).  A
quorum GET is a proposal: a GET sent again after the election is answered
at once, while the connection of one sent before it only ever carries that
500.  Real etcd, a 3-member cluster, its leader SIGKILLed; the client knows
the two followers and a request timeout (0.5 s) shorter than the election,
so both get a GET while no leader is known.
"""
from __future__ import annotations

from etcdq_v2 import connect
from etcdq_v2.testing.cluster import EtcdCluster

TIMEOUT = 0.5
DEADLINE = 6.0  # within etcd's 7 s: the dropped GETs' 500s come after it


def test_a_quorum_read_during_a_leader_change_is_answered_once_a_leader_is_elected(
        cluster: EtcdCluster, queue_name: str) -> None:
    key = f"/etcdq/{queue_name}/k"
    leader = cluster.leader_index()
    connect(cluster.endpoints).put(key, "v")
    followers = [m.url for i, m in enumerate(cluster.members) if i != leader]
    transport = connect(followers, timeout=TIMEOUT, deadline=DEADLINE)
    try:
        transport.get(key, quorum=True)  # a pooled connection to each follower
        cluster.kill(leader)
        assert transport.get(key, quorum=True).node["value"] == "v"
    finally:
        transport.close()
