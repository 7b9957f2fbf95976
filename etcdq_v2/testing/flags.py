"""etcd's command-line flags for a member of a cluster (shared with docker-compose).

The cluster flags are built by one function, :func:`cluster_flags`, so the
docker-compose setup and the tests start etcd the same way.  Every member
gets ``--enable-v2``: etcd 3.4+ serves the v2 API only with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Protocol, Sequence
from urllib.parse import urlsplit, urlunsplit


class Member(Protocol):
    """What the flag builders need of a member: its name and advertised URLs.

    Both :class:`MemberAddress` and :class:`EtcdServer` qualify.
    """

    name: str
    url: str
    peer_url: str


@dataclass
class MemberAddress:
    """The name and advertised URLs of a member that runs elsewhere.

    E.g. ``MemberAddress("m1", "http://m1:2379", "http://m1:2380")`` in a
    docker-compose network, to pass to :func:`cluster_flags`.
    """

    name: str
    url: str
    peer_url: str


def initial_cluster_value(members: Sequence[Member]) -> str:
    """Return the ``--initial-cluster`` value: ``name=peer_url`` for every member."""
    return ",".join(f"{m.name}={m.peer_url}" for m in members)


def member_flags(member: Member, initial_cluster: str, *,
                 cluster_token: str = "etcdq-test",
                 listen_host: Optional[str] = None) -> List[str]:
    """Return the etcd flags for ``member`` of the cluster ``initial_cluster``.

    ``listen_host`` replaces the host of the advertised URLs in the listen
    URLs: ``None`` listens exactly where it advertises (loopback tests);
    ``"0.0.0.0"`` suits a container advertising its service name.  The data
    directory is not included, because where it lives differs per caller.
    ``--initial-cluster-state new`` is harmless on a restart: etcd ignores the
    ``--initial-*`` flags once the data directory holds a member.
    """
    return [
        "--name", member.name,
        "--enable-v2",
        "--listen-client-urls", _with_host(member.url, listen_host),
        "--advertise-client-urls", member.url,
        "--listen-peer-urls", _with_host(member.peer_url, listen_host),
        "--initial-advertise-peer-urls", member.peer_url,
        "--initial-cluster", initial_cluster,
        "--initial-cluster-token", cluster_token,
        "--initial-cluster-state", "new",
    ]


def cluster_flags(member: Member, all_members: Sequence[Member], *,
                  cluster_token: str = "etcdq-test",
                  listen_host: Optional[str] = None) -> List[str]:
    """Return the etcd flags for ``member`` of a new cluster of ``all_members``.

    The single source of truth for how etcdq starts a cluster; see
    :func:`member_flags` for the meaning of the arguments.
    """
    return member_flags(member, initial_cluster_value(all_members),
                        cluster_token=cluster_token, listen_host=listen_host)


def _with_host(url: str, host: Optional[str]) -> str:
    if host is None:
        return url
    parts = urlsplit(url)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))
