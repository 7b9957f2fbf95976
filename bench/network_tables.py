"""The markdown tables of the "Across a network and resources" section (bench/network.py).

Figures are medians of the repeated runs with the lowest–highest in
parentheses (bench/report.py's ``Spread``); ratios divide medians of the
same run of the benchmark.
"""
from __future__ import annotations

import statistics
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from .network import DIRECT, PROXY, DrainRun, LatencyRun, NetworkResults
from .report import Spread, group, markdown_table, percentile

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


def per_round(runs: Sequence[DrainRun], key: Key, base: Key,
              value: Callable[[DrainRun], float] = lambda run: run.items_per_s) -> List[float]:
    """``value`` of ``key``'s run over that of ``base``'s, round by round: the runs of
    a round were made one after the other, so the machine's other load (it is
    shared) weighs on both alike."""
    of_base = {run.round: value(run) for run in runs if run.key == base}
    return [value(run) / of_base[run.round] for run in runs
            if run.key == key and of_base.get(run.round)]


def ratios_to(runs: Sequence[DrainRun], key: Key, route: str = DIRECT,
              rtt_ms: float = 0.0) -> List[float]:
    """Each round's rate of ``key`` over that round's on ``route`` at ``rtt_ms``
    (loopback by default), with the same processes and concurrency."""
    return per_round(runs, key, (route, rtt_ms, key[2], key[3]))


def _ratio_cell(ratios: List[float]) -> str:
    return Spread.of(ratios).text(2, "×") if ratios else "–"


def _latency_cells(runs: Optional[List[LatencyRun]]) -> List[str]:
    if not runs or not any(run.latencies_ms for run in runs):
        return ["–", "–", "–"]
    return [*(Spread.of(percentile(run.latencies_ms, q) for run in runs if run.latencies_ms)
              .text(1) for q in (0.5, 0.99)),
            Spread.of(run.failed_writes / run.items for run in runs).text(1)]


def rate_table(results: NetworkResults) -> str:
    """items/s and latency by route and concurrency."""
    drains = _by_key(results.drains, lambda run: run.key)
    latencies = _by_key(results.latencies, lambda run: run.key)
    rows = []
    for key, same in drains.items():
        rate = Spread.of(run.items_per_s for run in same)
        where, rtt = _where(key, results.added_rtt_ms)
        over_zero = ratios_to(results.drains, key, PROXY) if key[1] > 0 else []
        rows.append([where, rtt, f"{key[2]} × {key[3]}", rate.text(),
                     _ratio_cell(ratios_to(results.drains, key)), _ratio_cell(over_zero),
                     *_latency_cells(latencies.get(key)),
                     str(sum(run.run_twice for run in same)),
                     str(sum(run.missing for run in same))])
    return markdown_table(["route", "added RTT (ms): set → measured", "processes × concurrency",
                           "items/s", "× loopback (same round)", "× proxy at 0 ms",
                           "steady rate: p50 put → completed (ms)", "p99 (ms)",
                           "lost lock races/item",
                           "run twice", "missing"], rows)


def cost_table(results: NetworkResults) -> str:
    """CPU per item: etcd's, the Workers', the proxy's."""
    rows = []
    for key, same in _by_key(results.drains, lambda run: run.key).items():
        used = [run.proxy for run in same if run.proxy is not None]
        proxy = ["–", "–", "–", "–"] if not used else [
            Spread.of(u.cpu_s / max(1, u.chunks) * 1e6 for u in used).text(1),
            Spread.of(u.chunks / run.items for u, run in zip(used, same)).text(1),
            Spread.of(u.cpu_s / run.items * 1e3 for u, run in zip(used, same)).text(2),
            Spread.of(100 * u.cpu_s / (u.cpu_s + run.etcd_cpu_s + run.clients_cpu_s)
                      for u, run in zip(used, same)).text(0, " %")]
        rows.append([_where(key, {})[0], f"{key[2]} × {key[3]}",
                     Spread.of(run.etcd_cpu_s / run.items * 1e3 for run in same).text(2),
                     Spread.of(run.clients_cpu_s / run.items * 1e3 for run in same).text(2),
                     Spread.of(sum(run.requests.values()) / run.items for run in same).text(2),
                     *proxy])
    return markdown_table(["route", "processes × concurrency", "etcd CPU ms/item",
                           "Workers' CPU ms/item", "requests/item", "proxy CPU µs/chunk",
                           "proxy chunks/item", "proxy CPU ms/item",
                           "proxy's share of all CPU"], rows)


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


def _median(values: List[float]) -> Optional[float]:
    return statistics.median(values) if values else None


def _goal(goal: str, measured: Optional[float], shown: str,
          holds: Callable[[float], bool]) -> List[str]:
    if measured is None:
        return [goal, "not measured", "–"]
    return [goal, shown.format(measured), "yes" if holds(measured) else "**no**"]


def targets_table(results: NetworkResults) -> str:
    """Issue 14's targets 3 and 5, and the Worker rows of target 1, with this run's figures."""
    plan = results.plan
    runs, p = results.drains, plan.processes
    loop8, loop1 = (DIRECT, 0.0, p, 8), (DIRECT, 0.0, p, 1)
    etcd_cpu: Callable[[DrainRun], float] = lambda run: run.etcd_cpu_s / run.items  # noqa: E731
    worst_sockets = max((max(run.total, run.peak) - run.concurrency
                         for run in results.sockets if not run.burst), default=None)
    rss = max((run.vm_hwm_mb for run in results.depths), default=None)
    depth = max((run.pending for run in results.depths), default=plan.depth_pending)
    rows = [
        _goal(f"+1 ms RTT: {p} × 8 ≥ 60 % of its loopback rate (median of the rounds)",
              _median(ratios_to(runs, (PROXY, 1.0, p, 8))), "{:.0%}", lambda x: x >= 0.6),
        _goal("the same against the proxy at 0 ms: the round trip alone (the proxy's CPU, "
              "on the same 2 cores, weighs on both)",
              _median(ratios_to(runs, (PROXY, 1.0, p, 8), PROXY)), "{:.0%}",
              lambda x: x >= 0.6),
        _goal(f"Worker processes, loopback: {p} × 8 ≥ 0.8× the rate of {p} × 1",
              _median(per_round(runs, loop8, loop1)), "{:.2f}×", lambda x: x >= 0.8),
        _goal(f"Worker processes, loopback: etcd CPU/item at {p} × 8 ≤ 1.25× at {p} × 1",
              _median(per_round(runs, loop8, loop1, etcd_cpu)), "{:.2f}×",
              lambda x: x <= 1.25),
        _goal(f"sockets after {plan.socket_items:,} items ≤ concurrency + {SOCKET_ALLOWANCE} "
              "(no-op handler; the rows where all slots finish together: bench/README.md)",
              worst_sockets, "concurrency + {:.0f} at most", lambda x: x <= SOCKET_ALLOWANCE),
        _goal(f"consumer RSS at {depth:,} pending ≤ 200 MB", rss, "{:.0f} MB",
              lambda x: x <= 200),
        _goal("no item run twice or missing (every drain of this section)",
              sum(run.run_twice + run.missing for run in runs), "{:.0f}", lambda x: x == 0),
    ]
    return markdown_table(["target (issue 14)", "measured", "holds"], rows)


def tables(results: NetworkResults) -> List[Tuple[str, str]]:
    """(title, table) for each table of the section, in print order."""
    plan = results.plan
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
         targets_table(results)),
    ]
    if results.skipped:
        sections.append(("Not measured (network section)", markdown_table(
            ["part", "why"], [[name, why] for name, why in results.skipped.items()])))
    return sections
