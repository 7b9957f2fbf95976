"""Two versions of etcdq_v2 in one interleaved run: is the newer one as fast?

    python -m bench.versus --base f8ba365 [--head WORKTREE_OR_COMMIT] [--rounds 3]

Each round runs the base and then the head (or the head first on odd rounds, so
that neither always follows the other), each in its own process whose
``etcdq_v2`` is that version's source and whose measurements are this tree's
(bench/measure.py), against a fresh etcd:

- *drain*: 2,000 items drained by 8 consumer processes, items/s;
- *claims at 10k*: one consumer process claiming from 10,000 pending items
  (300 claims or 4 s), claims/s inside claim().

Below them, figures the machine's load moves less (COSTS): the drain's client
CPU seconds (user + system, all 8 consumers) and requests per item, and the
median round trips of one claim at 10k.

It prints one markdown table: the median of each side's rounds, the
lowest-highest in parentheses, and head / base.  A commit is checked out with
``git worktree`` under the work directory and removed afterwards.  Rounds
alternate because this machine is shared: figures of one run compare; figures
across runs do not.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Tuple

REPO = Path(__file__).resolve().parent.parent
DRAIN_ITEMS = 2000
DRAIN_CONSUMERS = 8
PENDING = 10_000
PROBE_CLAIMS, PROBE_BUDGET_S = 300, 4.0
FIGURES = ("drain_items_per_s", "claims_per_s_at_10k")
#: Figures of the same runs that the machine's load moves less: what the
#: consumers did per item, not how fast.  Printed with their ratio too.
COSTS = ("drain_client_cpu_us_per_item", "drain_requests_per_item", "round_trips_per_claim")


def measure_once(workdir: Path) -> Dict[str, float]:
    """Run in a child whose ``etcdq_v2`` is the version under test."""
    from bench.designs import Target
    from bench import measure
    from bench.servers import etcd_server

    with etcd_server(workdir) as server:
        drain = measure.drain(Target("etcdq_v2", server.url, "versus-drain"),
                              DRAIN_ITEMS, DRAIN_CONSUMERS, server.pid)
        if drain.missing or drain.run_twice:
            raise SystemExit(f"drain lost or repeated items: {drain}")
        probe = measure.QueueAtLength(Target("etcdq_v2", server.url, "versus-claims"))
        claims = probe.probe(PENDING, PROBE_CLAIMS, PROBE_BUDGET_S)
    return {"drain_items_per_s": drain.items_per_s,
            "claims_per_s_at_10k": claims.claims_per_s,
            "drain_client_cpu_us_per_item": drain.clients_cpu_seconds * 1e6 / DRAIN_ITEMS,
            "drain_requests_per_item": sum(drain.requests.values()) / DRAIN_ITEMS,
            "round_trips_per_claim": claims.round_trips_median}


def _source(spec: str, workdir: Path) -> Tuple[Path, bool]:
    """A directory holding the version's etcdq_v2/, and whether it was checked out here."""
    path = Path(spec)
    if (path / "etcdq_v2").is_dir():
        return path.resolve(), False
    checkout = workdir / f"src-{spec}"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q",
                    str(checkout), spec], check=True)
    return checkout, True


def _stage(source: Path, workdir: Path, name: str) -> Path:
    """A directory for PYTHONPATH: that version's etcdq_v2 beside this tree's bench."""
    stage = workdir / f"stage-{name}"
    stage.mkdir()
    (stage / "etcdq_v2").symlink_to(source / "etcdq_v2")
    (stage / "bench").symlink_to(REPO / "bench")
    return stage


def _run_side(stage: Path, workdir: Path) -> Dict[str, float]:
    env = dict(os.environ, PYTHONPATH=str(stage))
    code = ("import json, sys; from pathlib import Path; import etcdq_v2, bench.versus as v; "
            "print('using', etcdq_v2.__file__, file=sys.stderr); "
            "print(json.dumps(v.measure_once(Path(sys.argv[1]))))")
    # cwd: not this tree, whose etcdq_v2 would come first on sys.path.
    done = subprocess.run([sys.executable, "-c", code, str(workdir)], env=env, check=True,
                          cwd=str(workdir),
                          stdout=subprocess.PIPE, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _cell(values: List[float]) -> str:
    digits = 0 if statistics.median(values) >= 100 else 2
    return (f"{statistics.median(values):,.{digits}f} "
            f"({min(values):,.{digits}f}-{max(values):,.{digits}f})")


def table(base: str, head: str, runs: Dict[str, List[Dict[str, float]]]) -> str:
    lines = [f"| figure | base {base} | head {head} | head / base |", "|---|---|---|---|"]
    for figure in FIGURES + COSTS:
        if any(figure not in run for run in runs["base"] + runs["head"]):
            continue
        b = [run[figure] for run in runs["base"]]
        h = [run[figure] for run in runs["head"]]
        ratio = statistics.median(h) / statistics.median(b)
        lines.append(f"| {figure} | {_cell(b)} | {_cell(h)} | {ratio:.2f}x |")
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True, help="a commit, or a tree holding etcdq_v2/")
    parser.add_argument("--head", default=str(REPO), help="likewise (default: this tree)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="versus-") as tmp:
        workdir = Path(tmp)
        made: List[Path] = []
        stages = {}
        for side, spec in (("base", args.base), ("head", args.head)):
            source, checked_out = _source(spec, workdir)
            if checked_out:
                made.append(source)
            stages[side] = _stage(source, workdir, side)
        runs: Dict[str, List[Dict[str, float]]] = {"base": [], "head": []}
        try:
            for round_ in range(args.rounds):
                order = ("base", "head") if round_ % 2 == 0 else ("head", "base")
                for side in order:
                    print(f"round {round_ + 1}: {side}", file=sys.stderr)
                    runs[side].append(_run_side(stages[side], workdir))
                    print(f"  {runs[side][-1]}", file=sys.stderr)
        finally:
            for checkout in made:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force",
                                str(checkout)], check=False)
    print(table(args.base, "this tree" if args.head == str(REPO) else args.head, runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
