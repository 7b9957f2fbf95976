"""The names ``etcdq_v2.server`` held before it was split: kept for tests, bench/ and users.

Start and stop real etcd processes: the code is in :mod:`etcdq_v2.testing`
(members, clusters, the demo's throwaway etcd, ``etcdq server``'s
foreground member) and :mod:`etcdq_v2.etcd_binary` (finding etcd).
"""
from .testing import (ENV_BINARY, EtcdCluster, EtcdServer, Member, MemberAddress, TemporaryEtcd,
                      cluster_flags, ensure_etcd, etcd_version, find_etcd_binary, free_port,
                      initial_cluster_value, member_flags, popen_tied, run_foreground)

__all__ = [
    "ENV_BINARY",
    "EtcdCluster",
    "EtcdServer",
    "Member",
    "MemberAddress",
    "TemporaryEtcd",
    "cluster_flags",
    "ensure_etcd",
    "etcd_version",
    "find_etcd_binary",
    "free_port",
    "initial_cluster_value",
    "member_flags",
    "popen_tied",
    "run_foreground",
]
