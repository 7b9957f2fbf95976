"""A cluster of members on loopback: :class:`EtcdCluster`, for fault tests."""
from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import Callable, List, Optional, Sequence, Type
from urllib.parse import urlsplit

from ..errors import ConfigError, Unavailable
from ..etcd_binary import find_etcd_binary
from .flags import MemberAddress, initial_cluster_value
from .member import EtcdServer, PathLike
from .probe import LOOPBACK, free_ports, get_json, poll


class EtcdCluster:
    """``size`` members on loopback, named m1..mN, data dirs under ``base_dir``.

    For fault tests: kill, pause or restart one member and watch the others.
    ``snapshot_count``: etcd's ``--snapshot-count`` (100,000 by default), the
    writes after which a member takes a raft snapshot and compacts its log
    (keeping 5,000 entries, fixed in etcd 3.5): a member that falls further
    behind than that is caught up by a snapshot, not by the log entries.
    """

    def __init__(self, base_dir: PathLike, size: int = 3, *, binary: Optional[str] = None,
                 cluster_token: str = "etcdq-test",
                 snapshot_count: Optional[int] = None) -> None:
        if size < 1:
            raise ConfigError(f"cluster size must be at least 1, not {size}")
        if snapshot_count is not None and snapshot_count < 1:
            raise ConfigError(f"snapshot_count must be at least 1, not {snapshot_count}")
        extra = () if snapshot_count is None else ("--snapshot-count", str(snapshot_count))
        base = Path(base_dir)
        binary = binary or find_etcd_binary()
        ports = free_ports(2 * size)  # distinct: a port picked twice fails the cluster's start
        addresses = [MemberAddress(f"m{i}", f"http://{LOOPBACK}:{ports[2 * i - 2]}",
                                   f"http://{LOOPBACK}:{ports[2 * i - 1]}")
                     for i in range(1, size + 1)]
        initial = initial_cluster_value(addresses)
        self.members: List[EtcdServer] = [
            EtcdServer(base / a.name, name=a.name, client_port=_port_of(a.url),
                       peer_port=_port_of(a.peer_url), initial_cluster=initial,
                       cluster_token=cluster_token, binary=binary, extra_args=extra)
            for a in addresses]

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.members!r}>"

    @property
    def endpoints(self) -> str:
        """All client URLs, comma-separated, as etcdq's ``connect()`` takes them."""
        return ",".join(m.url for m in self.members)

    def start(self, timeout: float = 60.0) -> "EtcdCluster":
        """Start every member at once, then wait for each to serve v2.

        Concurrently, because no member becomes ready before a majority of the
        cluster is up.  A member that fails to start stops the whole cluster.
        """
        try:
            for member in self.members:
                member.start(wait=False)
            _run_concurrently([functools.partial(m.wait_ready, timeout) for m in self.members])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every member that is running, one after the other.

        Not concurrently: a stopping leader hands leadership to a follower,
        and if that follower is stopping too the hand-over waits ~7 s.
        """
        for member in self.members:
            member.stop()

    def leader_index(self, timeout: float = 10.0) -> int:
        """Index in ``members`` of the leader, once every live member agrees on it.

        Polls each running, unpaused member's ``/v2/members/leader`` (the
        leader its raft node follows) until all name the same live member.
        Agreement matters: right after a leader dies, a follower that has not
        yet heard from the new leader still forwards writes to the dead one,
        and they time out after ~7 s.  ``/v2/stats/self`` is not used: etcd
        3.4/3.5 set its ``state`` to ``StateLeader`` on every raft state
        change, so a follower that just started an election claims to lead.
        """
        found = poll(time.monotonic() + timeout, self._agreed_leader)
        if found is None:
            raise Unavailable(f"no agreed leader among {self.endpoints} after {timeout:g} s")
        return found

    def _agreed_leader(self) -> Optional[int]:
        live = [m for m in self.members if m.is_running() and not m.is_paused]
        views = {_leader_peer_url(m.url) for m in live}
        if len(views) != 1 or None in views:
            return None
        leader = views.pop()
        return next((i for i, m in enumerate(self.members)
                     if m in live and m.peer_url == leader), None)

    def kill(self, i: int) -> None:
        """SIGKILL member ``i``."""
        self.members[i].kill()

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start member ``i`` again on its data dir and ports; wait until it serves."""
        self.members[i].restart(wait=True, timeout=timeout)

    def pause(self, i: int) -> None:
        """SIGSTOP member ``i``."""
        self.members[i].pause()

    def resume(self, i: int) -> None:
        """SIGCONT member ``i``."""
        self.members[i].resume()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.stop()


def _run_concurrently(calls: Sequence[Callable[[], None]]) -> None:
    """Run the calls in parallel threads; re-raise the first failure once all are done."""
    with ThreadPoolExecutor(max(1, len(calls))) as pool:
        futures = [pool.submit(call) for call in calls]
    for future in futures:
        future.result()


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _leader_peer_url(url: str) -> Optional[str]:
    """The peer URL of the leader the member at ``url`` follows; None during an election."""
    reply = get_json(url + "/v2/members/leader")
    peer_urls = reply.get("peerURLs") if isinstance(reply, dict) else None
    return str(peer_urls[0]) if peer_urls else None
