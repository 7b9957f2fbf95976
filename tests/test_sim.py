"""The simulator runs the real library against the model of etcd v2 and checks
the invariants of docs/guarantees.md: a seed replays byte for byte, a run of
seeds with faults finds no violation, and a defect put back is found."""
from __future__ import annotations

from typing import List

import pytest

from etcdq_v2.testing.sim.__main__ import main
from etcdq_v2.testing.sim.mutants import MUTANTS, mutant
from etcdq_v2.testing.sim.simulation import simulate

pytestmark = pytest.mark.usefixtures("quiet_library")


def test_the_same_seed_gives_the_same_trace_byte_for_byte() -> None:
    first, again, other = simulate(11), simulate(11), simulate(12)
    assert first.trace == again.trace
    assert first.trace != other.trace
    assert any(" PUT " in line for line in first.trace)  # requests are in it
    assert first.requests > 50 and first.faults  # faults struck


def test_seeds_with_faults_break_no_invariant() -> None:
    # The seeds the mutants below are found on, without the mutant: it is what breaks them.
    for seed in range(20):
        result = simulate(seed)
        assert result.violations == [], (seed, result.violations)
        assert result.items > 0


def test_the_cli_reports_runs_and_replays_one_seed_with_its_trace(tmp_path, capsys) -> None:
    trace = tmp_path / "run.trace"
    assert main(["--seed", "3", "--items", "6", "--trace", str(trace)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("sim: 1 seeds, ") and last.endswith(" s") and "0 violations" in last
    assert trace.read_text().splitlines() == simulate(3, items=6).trace


def _first_found(name: str, seeds: int) -> List[str]:
    """The invariants the first seed (of ``seeds``) that finds mutant ``name`` breaks."""
    with mutant(name):
        for seed in range(seeds):
            found = [violation.name for violation in simulate(seed).violations]
            if found:
                return found
    return []


@pytest.mark.parametrize("name, seeds", [("f1-unfenced", 5), ("resend-lost-post", 10),
                                         ("lost-without-time-rule", 20), ("claim-unfenced", 20),
                                         ("delay-lock-short", 5)])
def test_a_known_defect_put_back_breaks_its_invariant(name: str, seeds: int) -> None:
    assert MUTANTS[name][3] in _first_found(name, seeds)
