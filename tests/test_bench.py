"""Smoke test of bench/: each etcd peer drains a tiny queue with two consumer processes.

Speed is never asserted here (bench/run.py measures it); this keeps the
benchmark importable and its baselines working while the code around them
changes.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# bench/ is a package beside etcdq_v2 in the checkout, not an installed one.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import measure  # noqa: E402
from bench.designs import DESIGNS, Target, peer_names  # noqa: E402
from etcdq_v2.server import EtcdServer  # noqa: E402

ETCD_PEERS = [name for name in peer_names() if DESIGNS[name].backend == "etcd"]


@pytest.mark.parametrize("peer", ETCD_PEERS)
def test_peer_drains_every_item(etcd_url: str, queue_name: str, peer: str) -> None:
    run = measure.drain(Target(peer, etcd_url, queue_name), items=20, consumers=2)

    assert run.missing == 0, f"{peer} left {run.missing} of 20 items unprocessed"
    assert run.claims >= 20
    assert run.etcd_ops is not None and run.etcd_ops.writes >= 20  # at least the puts


def test_lifecycle_bench_counts_the_writes_the_protocol_makes(etcd_binary: str,
                                                              tmp_path: Path) -> None:
    """bench/lifecycle.py's rows, on a few items: each operation's writes per item
    are what docs/protocol.md says (put 1, delayed put 2, claim + complete 5,
    claim + release 4, cancel 4: F4 is skipped, the lock left to expire, at the
    default lock_ttl).  Its own etcd: the counters are server-wide."""
    from bench import lifecycle

    server = EtcdServer(tmp_path / "data", binary=etcd_binary).start()
    try:
        runs = lifecycle.one_round(server.url, "lifecycle", items=4)
    finally:
        server.stop()
    writes = {row: ops.writes / 4 for row, (_, ops) in runs.items()}
    assert writes == {"put": 1, "put(delay=1)": 2, "claim + complete": 5,
                      "claim + release": 4, "cancel (pending item)": 4}


def test_producers_bench_puts_every_item_of_every_row(etcd_server: EtcdServer) -> None:
    """bench/producers.py's rows on a few items: each puts them all (it checks
    the ids itself), and the tables render.  Timing is not asserted."""
    from bench import producers

    runs = producers.measure(etcd_server.url, etcd_server.pid, items=20, repeats=1)
    assert [run.row for run in runs] == [*producers.LIBRARY_ROWS, *producers.CLI_ROWS]
    assert all(run.items == 20 and run.writes >= 20 for run in runs)
    assert "put_many(in_flight=16)" in producers.table(runs)
    assert "holds" in producers.target_table(runs)


@pytest.mark.parametrize("build", ["C", "Python"])
def test_the_delay_proxy_holds_each_way_and_worker_processes_drain_through_it(
        etcd_server: EtcdServer, etcd_url: str, queue_name: str, build: str) -> None:
    """bench/network.py's drain through bench/delayproxy.py (its C build, or the
    Python one used where there is no C compiler): every item completed once,
    and a request through a 20 ms proxy takes at least those 20 ms."""
    from bench import network
    from bench.delayproxy import DelayProxy, ProxyBuild

    proxies = ProxyBuild()
    if build == "C" and proxies.binary is None:
        pytest.skip(proxies.why_not_c)
    try:
        binary = proxies.binary if build == "C" else None
        with DelayProxy(etcd_url, 20, binary) as slow:
            assert network.round_trip_ms(slow.url, requests=3) >= 20
        with DelayProxy(etcd_url, 1, binary) as proxy:
            way = network.Route(network.PROXY, 1, proxy.url, proxy)
            run = network.drain(etcd_server.pid or 0, etcd_url, way, queue_name, items=20,
                                processes=2, concurrency=2)
    finally:
        proxies.close()
    assert (run.missing, run.run_twice, run.problems) == (0, 0, 0)
    assert run.proxy is not None and run.proxy.chunks >= 20 * 2  # a request and a reply each
