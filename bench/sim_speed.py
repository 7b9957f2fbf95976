"""The simulator's speed: steps per second on one core, seeds per second, per-seed figures.

``python bench/sim_speed.py --seeds 200`` runs seeds 0..199 of
``python -m etcdq_v2.testing.sim`` at its default flags in this one process
(one core: the simulation is one OS thread) and prints one markdown table.
A *step* is what the simulator's last line counts: one scheduler hand-over
or one request handed to the simulated network.  Rates are given per CPU
second of this process (what the machine's other load disturbs least) and
per wall second; the per-seed figures are the median and the largest.

It runs itself with ``PYTHONHASHSEED=0`` when that is not set, as the
simulator does, so that the step counts are the seeds' own.  A busy machine
moves CPU seconds by tens of percent; instructions do not: under valgrind
(``PYTHONHASHSEED=0 valgrind --tool=callgrind python bench/sim_speed.py
--seeds 3``, less the same with ``--seeds 0``, which only imports), the
difference over the table's steps is the instructions per step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from etcdq_v2.testing.sim.simulation import quiet_library, simulate


@dataclass
class Seed:
    steps: int
    requests: int
    virtual: float
    wall: float
    cpu: float


def measure(seeds: Sequence[int], consumers: int, items: int) -> List[Seed]:
    """Each seed's steps, requests, virtual seconds, wall and CPU seconds."""
    runs = []
    for seed in seeds:
        wall, cpu = time.perf_counter(), time.process_time()
        with quiet_library():
            result = simulate(seed, consumers=consumers, items=items)
        runs.append(Seed(result.handovers + result.requests, result.requests, result.virtual,
                         time.perf_counter() - wall, time.process_time() - cpu))
    return runs


def table(runs: List[Seed], command: str) -> str:
    steps = sum(run.steps for run in runs)
    wall = sum(run.wall for run in runs)
    cpu = sum(run.cpu for run in runs)
    per = [
        ("steps", [run.steps for run in runs], "{:,.0f}"),
        ("requests", [run.requests for run in runs], "{:,.0f}"),
        ("virtual s", [run.virtual for run in runs], "{:.1f}"),
        ("CPU ms", [run.cpu * 1000 for run in runs], "{:.0f}"),
    ]
    lines = [f"`{command}`", "",
             "| seeds | steps | requests | CPU s | wall s | steps/s (CPU) | steps/s (wall) "
             "| seeds/s (CPU) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {len(runs)} | {steps:,} | {sum(run.requests for run in runs):,} | {cpu:.1f} "
             f"| {wall:.1f} | {steps / cpu:,.0f} | {steps / wall:,.0f} "
             f"| {len(runs) / cpu:.2f} |",
             "", "| per seed | median | largest |", "|---|---:|---:|"]
    for name, values, form in per:
        lines.append(f"| {name} | {form.format(statistics.median(values))} "
                     f"| {form.format(max(values))} |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/sim_speed.py",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--items", type=int, default=20)
    args = parser.parse_args(argv)
    runs = measure(range(args.first, args.first + args.seeds), args.consumers, args.items)
    if not runs:  # --seeds 0: the imports alone, what an instruction count subtracts
        return 0
    command = "python bench/sim_speed.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(table(runs, command.strip()))
    return 0


if __name__ == "__main__":
    if os.environ.get("PYTHONHASHSEED") is None:
        os.environ["PYTHONHASHSEED"] = "0"
        os.execv(sys.executable, [sys.executable] + sys.argv)
    sys.exit(main())
