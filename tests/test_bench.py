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


def test_floor_section_writes_from_each_process_count_and_renders_its_table(
        tmp_path: Path) -> None:
    """bench/run.py's "floor" section with the quick plan, at 2 and 4 processes
    instead of 8, 32 and 64 (spawning 104 processes is not a fast test): one run
    per count, on its own etcd, every figure positive, one table row per count;
    the same for the queue's floor, whose consumers each drained a queue of
    their own, all its items once, and for one shared queue beside it, each
    drain on a fresh etcd; and each process's one listing of a queue of the
    drains' size.  With those, the comparison needs no drains section."""
    from dataclasses import replace

    from bench import floor, run

    plan = replace(run.Plan.choose(quick=True, full=False, repeats=None), scale_consumers=(2, 4))
    results = run.Results()
    run.run_floor(plan, tmp_path, results)

    assert results.skipped == {}
    assert [(r.processes, r.writes) for r in results.floor] == [(2, plan.floor_writes),
                                                                (4, plan.floor_writes)]
    for r in results.floor:
        assert r.writes_per_s > 0 and r.clients_us_per_write > 0
        assert r.etcd_us_per_write is not None and r.etcd_us_per_write > 0
    assert [(r.consumers, r.queues, r.items) for r in results.floor_drains] == [
        (2, 1, plan.drain_items), (2, 2, plan.drain_items), (4, 1, plan.drain_items),
        (4, 4, plan.drain_items), (2, 1, plan.drain_items)]
    # the last: 2 consumers held to the rate the 4 reached on one shared queue
    assert [r.paced for r in results.floor_drains] == [None] * 4 + [
        results.floor_drains[2].items_per_s]
    assert floor.paced(results.floor_drains) == results.floor_drains[4:]
    assert floor.shared(results.floor_drains) == results.floor_drains[0:3:2]
    for r in results.floor_drains:
        assert (r.missing, r.run_twice, r.claims) == (0, 0, plan.drain_items)
        assert r.steady_items_per_s is not None and r.steady_items_per_s > 0
        assert r.first_item_s is not None and 0 < r.first_item_s < r.seconds
        assert r.etcd_cpu_ms_per_item is not None and r.etcd_cpu_ms_per_item > 0
    for r in floor.alone(results.floor_drains):
        assert r.drain_ops is not None and r.drain_ops.failed_writes == 0  # no one to race
    assert [(r.processes, r.items) for r in results.floor_listings] == [
        (2, plan.drain_items), (4, plan.drain_items)]
    listed = [r.etcd_ms_per_item for r in results.floor_listings]
    assert None not in listed and sum(listed) > 0  # type: ignore[arg-type]
    [(title, table), (alone_title, alone_table), (shared_title, shared_table),
     (held_title, held_table), (listings_title, listings_table),
     (beside_title, beside)] = run.floor_tables(plan, results)
    lines = table.splitlines()
    assert "2, 4 processes" in title and len(lines) == 4
    assert [line.count("|") for line in lines] == [9] * 4
    assert lines[2].startswith("| 2 |") and lines[2].count("1.00×") == 3
    assert lines[3].startswith("| 4 |")
    assert "one queue per consumer" in alone_title
    assert [line.split("|")[1].strip() for line in alone_table.splitlines()[2:]] == ["2", "4"]
    assert "one shared queue" in shared_title
    assert [line.split("|")[1].strip() for line in shared_table.splitlines()[2:]] == ["2", "4"]
    assert "held to the rate 4 reached" in held_title
    assert [line.split("|")[1].strip() for line in held_table.splitlines()[2:]] == ["2"]
    assert "WAL fsyncs/item" in held_table.splitlines()[0]
    assert "first listings" in listings_title
    assert [line.split("|")[1].strip() for line in listings_table.splitlines()[2:]] == ["2", "4"]
    assert "4 processes against 2" in beside_title
    assert "plus one listing of the whole backlog per consumer" in beside
    assert "| one shared queue, fresh etcds (items) |" in beside
    assert "| each consumer alone on its own queue, the queue's floor (items) |" in beside
    assert "| the same, against 2 consumers held to the 4 consumers' rate (items) |" in beside


def test_drain_over_several_queues_splits_the_items_and_gives_each_consumer_one(
        tmp_path: Path) -> None:
    """measure.drain(queues=2) with 4 consumers: 40 items become 20 in each of two
    new queues, each drained completely by its own two consumers (their
    completed/ records), and nothing lands in the queue named by the target."""
    from bench.designs import Target
    from bench.servers import etcd_server
    from etcdq_v2 import Queue

    with etcd_server(tmp_path) as server:
        run = measure.drain(Target("etcdq_v2", server.url, "split"), 41, 4, server.pid,
                            queues=2)
        counts = []
        for name in ("split", "split-0", "split-1"):
            queue = Queue(server.url, name)
            try:
                counts.append((queue.stats()["pending"], queue.stats()["completed"]))
            finally:
                queue.close()
    assert (run.items, run.queues, run.missing, run.run_twice) == (40, 2, 0, 0)
    assert counts == [(0, 0), (0, 20), (0, 20)]


def test_a_paced_drain_holds_its_consumers_to_the_rate_asked(tmp_path: Path) -> None:
    """measure.drain(pace=40) with 2 consumers: each finishes an item per slot,
    2 / 40 = 0.05 s apart, so the one with the most of the 20 items (10 at
    least) takes 9 slots after its first: the drain lasts 0.45 s at least (a
    bound the sleeps set, not a speed), and every item is drained once."""
    from bench.designs import Target
    from bench.servers import etcd_server

    with etcd_server(tmp_path) as server:
        run = measure.drain(Target("etcdq_v2", server.url, "paced"), 20, 2, server.pid,
                            pace=40)
    assert (run.items, run.missing, run.run_twice, run.paced) == (20, 0, 0, 40)
    assert run.seconds >= 9 * 2 / 40, run.seconds


def test_steady_rate_leaves_out_the_start_and_the_end_of_a_drain() -> None:
    """Items/s between the 10th and 90th percentile of the finishing times: a
    drain whose first item took 5 s and whose last came 9 s after the rest
    is steady at the rate in between."""
    evenly = [i * 0.01 for i in range(101)]
    assert measure.steady_rate(evenly) == pytest.approx(100)
    slow_ends = [5.0] + [10 + i * 0.01 for i in range(98)] + [20.0]
    assert measure.steady_rate(slow_ends) == pytest.approx(100)
    assert measure.steady_rate(evenly[:9]) is None
    assert measure.steady_rate([1.0] * 20) is None


def test_floor_bound_is_the_rate_scaled_by_the_cpu_per_item_growth() -> None:
    """rate8 · (E + C) / (E·fe + C·fc), and comparison() feeds it the drains'
    8-consumer figures and the floor's 64-against-8 factors."""
    from bench import floor

    assert floor.rate_bound(1000, 0.5, 0.5, 1.0, 3.0) == pytest.approx(500)
    assert floor.rate_bound(1000, 0.6, 0.2, 2.0, 1.0) == pytest.approx(1000 * 0.8 / 1.4)
    assert floor.rate_bound(1230, 0.62, 0.69, 1.0, 1.0) == pytest.approx(1230)

    def drain(consumers: int, rate: float, etcd_ms: float, clients_ms: float
              ) -> measure.DrainRun:
        return measure.DrainRun("etcdq_v2", consumers, 1000, 1000 / rate, rate, 1000, 0, 0,
                                0, {}, None, None, etcd_ms, clients_ms)

    def bare(processes: int, etcd_us: float, clients_us: float) -> floor.FloorRun:
        return floor.FloorRun(processes, 0, 1000, 0.1, etcd_us / 1000, clients_us / 1000)

    drains = [drain(8, 1000, 0.5, 0.5), drain(64, 400, 1.0, 2.0)]
    runs = [bare(8, 80, 60), bare(64, 80, 180)]
    assert floor.comparison(runs, [], 8, 64) is None
    text = floor.comparison(runs, drains, 8, 64)
    assert text is not None
    assert "| etcdq_v2 drains (items) | 0.40× | 2.00× | 4.00× |" in text
    assert "| bare writes, the floor | 1.00× | 1.00× | 3.00× |" in text
    assert "**500 items/s**, 0.50×" in text
    assert "alone" not in text
    alone = [drain(8, 1000, 0.5, 0.5), drain(64, 600, 0.6, 1.0)]
    text = floor.comparison(runs, drains, 8, 64, alone)
    assert text is not None
    assert "| each consumer alone on its own queue, the queue's floor (items) | 0.60× | " \
        "1.20× | 2.00× |" in text
    assert "plus one listing" not in text  # the listings were not measured
    listings = [floor.ListingRun(8, 0, 1000, 0.1, 1), floor.ListingRun(64, 0, 1000, 0.6, 1)]
    text = floor.comparison(runs, drains, 8, 64, alone, listings=listings)
    assert text is not None  # (0.6 + 0.6) / (0.5 + 0.1) ms per item
    assert "(+0.100 and +0.600 ms per item) | – | 2.00× | – |" in text
    assert "held to" not in text
    held = [drain(8, 400, 0.9, 0.6)]
    text = floor.comparison(runs, drains, 8, 64, held=held)
    assert text is not None  # 64 flat out against 8 at the same 400 items/s
    assert "| the same, against 8 consumers held to the 64 consumers' rate (items) | " \
        "1.00× | 1.11× | 3.33× |" in text


@pytest.mark.alone  # etcd's profile must catch the drain in its 3 s window
def test_etcd_profile_decodes_etcds_own_cpu_profile_of_a_drain() -> None:
    """bench/etcd_profile.py at 2 consumers and 300 items: every item drained,
    etcd's pprof profile decoded (etcd's own functions in it, each cumulative
    share within the total), and one table row per function plus the total."""
    from bench import etcd_profile

    run = etcd_profile.profile_drain(2, items=300, seconds=3)
    consumers, done, total, spent = run
    assert (consumers, done) == (2, 300)
    assert total > 0 and all(0 < ns <= total for ns in spent.values())
    assert any(name.startswith("go.etcd.io/etcd/") for name in spent)
    lines = etcd_profile.table([run], top=5).splitlines()
    assert len(lines) == 2 + 1 + 5
    assert lines[2].startswith("| all of etcd's samples | ")
    assert etcd_profile.profile_drain(3, items=300, seconds=3, alone=True)[:2] == (3, 300)


def test_sim_speed_counts_the_steps_the_simulator_counts() -> None:
    """bench/sim_speed.py's steps are the simulator's (hand-overs plus requests)."""
    from bench import sim_speed
    from etcdq_v2.testing.sim.simulation import simulate

    runs = sim_speed.measure([3], consumers=3, items=6)
    result = simulate(3, items=6)
    assert (runs[0].steps, runs[0].requests) == (result.handovers + result.requests,
                                                 result.requests)
    assert f"| 1 | {runs[0].steps:,} | {result.requests:,} |" in sim_speed.table(runs, "cmd")
