"""The names ``etcdq_v2.server`` held before it was split: kept for tests, bench/ and users.

Start and stop real etcd processes: the code is in :mod:`etcdq_v2.testing`
(members, clusters, the demo's throwaway etcd, ``etcdq server``'s
foreground member) and :mod:`etcdq_v2.etcd_binary` (finding etcd).
"""
from .testing import *  # noqa: F403 (the names of etcdq_v2.testing.__all__, which it also has)
from .testing import __all__  # noqa: F401
