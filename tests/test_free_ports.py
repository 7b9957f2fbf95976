"""A test cluster's members get distinct ports: ports picked one at a time,
each socket closed before the next pick, can come back twice, and etcd then
refuses the cluster ("initial cluster ... has duplicate url")."""

from __future__ import annotations

import socket

from etcdq_v2.testing.probe import LOOPBACK, free_ports


def test_ports_picked_together_are_distinct_and_free() -> None:
    ports = free_ports(64)
    assert len(set(ports)) == len(ports), sorted(ports)
    for port in ports:  # each one free once picked: a member can bind it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((LOOPBACK, port))
