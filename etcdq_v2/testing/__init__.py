"""Real etcd processes: for the tests, ``etcdq server`` and ``etcdq demo``.

As :mod:`kazoo.testing` does for ZooKeeper, this package starts and stops
real servers: one member (:class:`EtcdServer`), a cluster of them
(:class:`EtcdCluster`), a throwaway member in a temporary directory
(:class:`TemporaryEtcd`, :func:`ensure_etcd`) and a member in the foreground
(:func:`run_foreground`, behind ``etcdq server``).  etcdq_v2 talks to etcd's
v2 HTTP API, which etcd 3.4+ serves only with ``--enable-v2``.  Everything
here therefore passes that flag and proves it took effect by reading
``/v2/keys/`` before declaring a member ready.

Design choices a newcomer should know:

* The etcd binary is started directly with :class:`subprocess.Popen` (no
  shell), so the PID we hold is etcd's own and signals reach it, not a shell.
* Each member runs in its own session, so a Ctrl-C aimed at the test run or
  the CLI does not also kill etcd behind our back; we stop it ourselves.
* On Linux a member dies with the process that started it, even a SIGKILLed
  one (``PR_SET_PDEATHSIG``, see :func:`popen_tied`): no orphan etcd keeps
  serving, and holding its ports, after a crashed test run or CLI.
* Members listen on 127.0.0.1 only: these are test and demo servers, never
  something to expose on a network.
* All waiting is bounded polling with a deadline; nothing sleeps "long
  enough" and hopes.
* The cluster flags are built by one function, :func:`cluster_flags`, so the
  docker-compose setup and the tests start etcd the same way.

=============  ================================================================
member         :class:`EtcdServer`, one member
cluster        :class:`EtcdCluster`, several
temporary      :class:`TemporaryEtcd` and :func:`ensure_etcd` (the demo's etcd)
foreground     :func:`run_foreground` (``etcdq server``)
flags          etcd's flags for a member of a cluster (shared with docker-compose)
probe          HTTP probes without python-etcd, free ports, bounded polling
processes      :func:`popen_tied`: children that die with this process
=============  ================================================================

The binary itself is found by :mod:`etcdq_v2.etcd_binary`.  Layers: this
package uses only the standard library and etcdq's errors, so the harness
does not depend on the client code it is there to test; the library never
imports it (the CLI does, for ``server`` and ``demo``).
"""
from ..etcd_binary import ENV_BINARY, etcd_version, find_etcd_binary
from .cluster import EtcdCluster
from .flags import Member, MemberAddress, cluster_flags, initial_cluster_value, member_flags
from .foreground import run_foreground
from .member import EtcdServer
from .probe import free_port
from .processes import popen_tied
from .temporary import TemporaryEtcd, ensure_etcd

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
