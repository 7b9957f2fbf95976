"""The markdown tables of the "Across a network and resources" section (bench/network.py).

Figures are medians of the repeated runs with the lowest–highest in
parentheses (bench/report.py's ``Spread``); ratios divide medians of the
same run of the benchmark.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from .network import DIRECT, PROXY, DrainRun, LatencyRun, NetworkPlan, NetworkResults
from .report import Spread, group, markdown_table, percentile, ratio

R = TypeVar("R")
Key = Tuple[str, float, int, int]  # route, rtt_ms, processes, concurrency
#: Sockets a Worker may hold beyond one per slot: the view's stream, a listing,
#: the main thread's claim, the heartbeat, the second connection of F3/F4.
SOCKET_ALLOWANCE = 5


def _order(key: Key) -> Tuple[int, float, int]:
    route, rtt, _, concurrency = key
    return (0 if route == DIRECT else 1, rtt, concurrency)


def _by_key(runs: Sequence[R], key: Callable[[R], Key]) -> Dict[Key, List[R]]:
    grouped = group(runs, key)
    return {k: grouped[k] for k in sorted(grouped, key=_order)}


def _where(key: Key, measured: Dict[str, List[float]]) -> Tuple[str, str]:
    route, rtt, _, _ = key
    if route == DIRECT:
        return "loopback", "–"
    seen = measured.get(f"{rtt:g}", [])
    return f"proxy ({rtt:g} ms)", f"{rtt:g} → {Spread.of(seen).text(2)}" if seen else f"{rtt:g}"


def _loopback_rate(by_key: Dict[Key, List[DrainRun]], key: Key) -> Optional[float]:
    same = by_key.get((DIRECT, 0.0, key[2], key[3]))
    return statistics.median(run.items_per_s for run in same) if same else None


def _latency_cells(runs: Optional[List[LatencyRun]]) -> List[str]:
    if not runs or not any(run.latencies_ms for run in runs):
        return ["–", "–"]
    return [Spread.of(percentile(run.latencies_ms, q) for run in runs if run.latencies_ms)
            .text(1) for q in (0.5, 0.99)]


def rate_table(results: NetworkResults) -> str:
    """items/s and latency by route and concurrency."""
    drains = _by_key(results.drains, lambda run: run.key)
    latencies = _by_key(results.latencies, lambda run: run.key)
    rows = []
    for key, same in drains.items():
        rate = Spread.of(run.items_per_s for run in same)
        where, rtt = _where(key, results.added_rtt_ms)
        rows.append([where, rtt, f"{key[2]} × {key[3]}", rate.text(),
                     ratio(rate.median, _loopback_rate(drains, key)),
                     *_latency_cells(latencies.get(key)),
                     str(sum(run.run_twice for run in same)),
                     str(sum(run.missing for run in same))])
    return markdown_table(["route", "added RTT (ms): set → measured", "processes × concurrency",
                           "items/s", "× loopback", "p50 put → completed (ms)", "p99 (ms)",
                           "run twice", "missing"], rows)


def cost_table(results: NetworkResults) -> str:
    """CPU per item: etcd's, the Workers', the proxy's."""
    rows = []
    for key, same in _by_key(results.drains, lambda run: run.key).items():
        used = [run.proxy for run in same if run.proxy is not None]
        proxy = ["–", "–", "–"] if not used else [
            Spread.of(u.cpu_s / max(1, u.chunks) * 1e6 for u in used).text(1),
            Spread.of(u.chunks / run.items for u, run in zip(used, same)).text(1),
            Spread.of(u.cpu_s / run.items * 1e3 for u, run in zip(used, same)).text(2)]
        rows.append([_where(key, {})[0], f"{key[2]} × {key[3]}",
                     Spread.of(run.etcd_cpu_s / run.items * 1e3 for run in same).text(2),
                     Spread.of(run.clients_cpu_s / run.items * 1e3 for run in same).text(2),
                     Spread.of(sum(run.requests.values()) / run.items for run in same).text(2),
                     *proxy])
    return markdown_table(["route", "processes × concurrency", "etcd CPU ms/item",
                           "Workers' CPU ms/item", "requests/item", "proxy CPU µs/chunk",
                           "proxy chunks/item", "proxy CPU ms/item"], rows)


def socket_table(results: NetworkResults) -> str:
    rows = [[str(run.concurrency), "all slots finish together" if run.burst else "no-op",
             f"{run.items:,}", str(run.established), str(run.time_wait), str(run.other),
             str(run.total), str(run.peak), f"{run.concurrency + SOCKET_ALLOWANCE}",
             f"{run.seconds:.1f}"]
            for run in results.sockets]
    return markdown_table(["concurrency", "handler", "items", "established", "TIME-WAIT",
                           "other states", "total at the end", "peak (sampled every 0.25 s)",
                           f"concurrency + {SOCKET_ALLOWANCE}", "seconds"], rows)


def depth_table(results: NetworkResults) -> str:
    rows = [[f"{run.pending:,}", str(run.concurrency), f"{run.first_claim_s:.2f}",
             str(run.items), f"{run.vm_hwm_mb:.0f}", f"{run.vm_rss_mb:.0f}"]
            for run in results.depths]
    return markdown_table(["pending items", "concurrency", "first claim (s)",
                           "items taken", "peak RSS, VmHWM (MB)", "RSS at the end (MB)"], rows)


def _median(runs: Sequence[DrainRun], value: Callable[[DrainRun], float],
            key: Key) -> Optional[float]:
    same = [run for run in runs if run.key == key]
    return statistics.median(map(value, same)) if same else None


def _divide(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _goal(goal: str, measured: Optional[float], shown: str,
          holds: Callable[[float], bool]) -> List[str]:
    if measured is None:
        return [goal, "not measured", "–"]
    return [goal, shown.format(measured), "yes" if holds(measured) else "**no**"]


def targets_table(plan: NetworkPlan, results: NetworkResults) -> str:
    """Issue 14's targets 3 and 5, and the Worker rows of target 1, with this run's figures."""
    runs, p = results.drains, plan.processes
    rate = lambda key: _median(runs, lambda run: run.items_per_s, key)  # noqa: E731
    etcd = lambda key: _median(runs, lambda run: run.etcd_cpu_s / run.items, key)  # noqa: E731
    loop8, loop1 = (DIRECT, 0.0, p, 8), (DIRECT, 0.0, p, 1)
    worst_sockets = max((max(run.total, run.peak) - run.concurrency
                         for run in results.sockets if not run.burst), default=None)
    rss = max((run.vm_hwm_mb for run in results.depths), default=None)
    depth = max((run.pending for run in results.depths), default=plan.depth_pending)
    rows = [
        _goal(f"+1 ms RTT: {p} × 8 ≥ 60 % of its loopback rate",
              _divide(rate((PROXY, 1.0, p, 8)), rate(loop8)), "{:.0%}", lambda x: x >= 0.6),
        _goal(f"Worker processes, loopback: {p} × 8 ≥ 0.8× the rate of {p} × 1",
              _divide(rate(loop8), rate(loop1)), "{:.2f}×", lambda x: x >= 0.8),
        _goal(f"Worker processes, loopback: etcd CPU/item at {p} × 8 ≤ 1.25× at {p} × 1",
              _divide(etcd(loop8), etcd(loop1)), "{:.2f}×", lambda x: x <= 1.25),
        _goal(f"the proxy at 0 ms: {p} × 8 ≥ 0.9× loopback (it is not the wall)",
              _divide(rate((PROXY, 0.0, p, 8)), rate(loop8)), "{:.2f}×",
              lambda x: x >= 0.9),
        _goal(f"sockets after {plan.socket_items:,} items ≤ concurrency + {SOCKET_ALLOWANCE} "
              "(no-op handler; the rows where all slots finish together: bench/README.md)",
              worst_sockets, "concurrency + {:.0f} at most", lambda x: x <= SOCKET_ALLOWANCE),
        _goal(f"consumer RSS at {depth:,} pending ≤ 200 MB", rss, "{:.0f} MB",
              lambda x: x <= 200),
        _goal("no item run twice or missing (every drain of this section)",
              sum(run.run_twice + run.missing for run in runs), "{:.0f}", lambda x: x == 0),
    ]
    return markdown_table(["target (issue 14)", "measured", "holds"], rows)


def tables(plan: NetworkPlan, results: NetworkResults) -> List[Tuple[str, str]]:
    """(title, table) for each table of the section, in print order."""
    proxy = results.proxy + (f"; {results.proxy_note}" if results.proxy_note else "")
    sections = [
        (f"Across a network: {plan.processes} Worker processes, {plan.items:,}-item drains; "
         f"latency at {results.latency_rate:g} items/s (proxy: {proxy})", rate_table(results)),
        ("Across a network: CPU per item (etcd, the Worker processes, the proxy)",
         cost_table(results)),
        ("Resources: one Worker process's sockets to etcd after its items",
         socket_table(results)),
        ("Resources: one Worker process started on a deep queue", depth_table(results)),
        ("Targets of issue 14: across a network, resources, Worker processes",
         targets_table(plan, results)),
    ]
    if results.skipped:
        sections.append(("Not measured (network section)", markdown_table(
            ["part", "why"], [[name, why] for name, why in results.skipped.items()])))
    return sections
