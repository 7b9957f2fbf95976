"""The benchmark's PNG: items/s against consumers, claims/s against queue length, and
(when the network section ran) items/s against round-trip time.

matplotlib is optional (``pip install 'etcdq_v2[bench]'``): without it,
:func:`draw` writes nothing and says so.
"""
from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

from .designs import DESIGNS
from .measure import ClaimCostRun, DrainRun
from .report import group

R = TypeVar("R")
#: x values, median y values, and the distances from each median down to the
#: lowest and up to the highest run (matplotlib's asymmetric error bars).
Series = Tuple[List[int], List[float], List[float], List[float]]


def _series(runs: Sequence[R], design: Callable[[R], str], x: Callable[[R], int],
            y: Callable[[R], float]) -> Dict[str, Series]:
    """One series per design."""
    series: Dict[str, Series] = {}
    for (name, setting), same in group(runs, lambda run: (design(run), x(run))).items():
        values = [y(run) for run in same]
        median = statistics.median(values)
        xs, medians, below, above = series.setdefault(name, ([], [], [], []))
        xs.append(setting)
        medians.append(median)
        below.append(median - min(values))
        above.append(max(values) - median)
    return series


def _panel(axes: Any, series: Dict[str, Series], xlabel: str, ylabel: str) -> None:
    for name, (xs, medians, below, above) in series.items():
        # One colour per design in both panels: matplotlib's Cn cycle, by DESIGNS order.
        axes.errorbar(xs, medians, yerr=[below, above], marker="o", capsize=3,
                      color=f"C{list(DESIGNS).index(name)}", label=DESIGNS[name].label)
    axes.set_xscale("log")
    axes.set_xticks(sorted({x for xs, *_ in series.values() for x in xs}))
    axes.xaxis.set_major_formatter("{x:,.0f}")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")


def rtt_panel(axes: Any, runs: Sequence[Any]) -> None:
    """items/s against the added round-trip time (loopback at 0), one line per concurrency.

    ``runs``: bench/network.py's DrainRuns; the proxy's own 0 ms runs are left
    out (loopback is the 0 ms point).
    """
    runs = [run for run in runs if run.route == "direct" or run.rtt_ms > 0]
    series = _series(runs, lambda r: f"{r.processes} × {r.concurrency}",
                     lambda r: r.rtt_ms, lambda r: r.items_per_s)
    for n, (name, (xs, medians, below, above)) in enumerate(sorted(
            series.items(), key=lambda item: int(item[0].split("×")[1]))):
        axes.errorbar(xs, medians, yerr=[below, above], marker="o", capsize=3,
                      color=f"C{n}", label=f"{name} (processes × concurrency)")
    axes.set_xticks(sorted({x for xs, *_ in series.values() for x in xs}))
    axes.set_xlabel("round-trip time added to loopback (ms; delaying proxy)")
    axes.set_ylabel("items/s (Worker drain; median, min–max)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small")


def _rtt_alone(plt: Any, network: Sequence[Any], path: Path) -> None:
    figure, axes = plt.subplots(figsize=(6.5, 5))
    rtt_panel(axes, network)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def draw(drains: Sequence[DrainRun], claim_costs: Sequence[ClaimCostRun],
         path: Path, network: Sequence[Any] = ()) -> Optional[str]:
    """Write the PNG to ``path``; return a note instead if matplotlib is missing.

    ``network``: the network section's drains, drawn in a third panel (:func:`rtt_panel`),
    or alone when the other sections did not run.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install 'etcdq_v2[bench]'): no PNG written"
    if network and not (drains or claim_costs):  # bench/run.py --only network
        return _rtt_alone(plt, network, path)
    # One panel per section that ran (``--only``): consumers, queue length, round trip.
    shown = [bool(drains), bool(claim_costs), bool(network)]
    figure, panels = plt.subplots(1, sum(shown), figsize=(6.5 * sum(shown), 5), squeeze=False)
    axes = iter(panels[0])
    if drains:
        left = next(axes)
        _panel(left, _series(drains, lambda r: r.design, lambda r: r.consumers,
                             lambda r: r.items_per_s),
               "consumer processes", "items/s (drain; median, min–max)")
        left.set_ylim(bottom=0)
    if claim_costs:
        right = next(axes)
        _panel(right, _series(claim_costs, lambda r: r.design, lambda r: r.pending,
                              lambda r: r.claims_per_s),
               "pending items", "claims/s (one consumer; median, min–max)")
        right.set_yscale("log")  # the literal design falls by orders of magnitude
    if network:
        rtt_panel(next(axes), network)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return None
