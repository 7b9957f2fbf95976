"""Seeds 0-499 of the simulator at its default flags, with faults, break no invariant;
and --jobs runs seeds in other processes with the output of one.

A file of its own, so that pytest-xdist (--dist loadfile) runs it beside
tests/test_sim.py; the seeds are in chunks so that a failure names its chunk
and ``-k`` can run one again.  A failing seed replays with
``python -m etcdq_v2.testing.sim --seed S --trace sim-S.trace``.
"""
from __future__ import annotations

import re
from typing import List

import pytest

from etcdq_v2.testing.sim.__main__ import main
from etcdq_v2.testing.sim.simulation import simulate

SEEDS = 500
CHUNK = 100

pytestmark = pytest.mark.usefixtures("quiet_library")


@pytest.mark.parametrize("first", range(0, SEEDS, CHUNK))
def test_seeds_with_faults_break_no_invariant(first: int) -> None:
    broken = []
    for seed in range(first, first + CHUNK):
        result = simulate(seed)
        assert result.items > 0 and result.requests > 0, seed
        broken += [(seed, violation.name, violation.detail) for violation in result.violations]
    assert broken == []


def _lines(argv: List[str], capsys: pytest.CaptureFixture[str]) -> List[str]:
    """What the command printed, its last line's time blanked."""
    status = main(argv)
    lines = capsys.readouterr().out.splitlines()
    return [str(status)] + lines[:-1] + [re.sub(r", [0-9.]+ s$", ", T s", lines[-1])]


def test_jobs_give_the_output_of_one_process_in_seed_order(capsys) -> None:
    flags = ["--seeds", "6", "--first", "40", "--summary"]
    alone = _lines(flags, capsys)
    assert _lines(flags + ["--jobs", "3"], capsys) == alone
    assert alone[0] == "0" and alone[-1].startswith("sim: 6 seeds, ")


def test_jobs_stop_at_the_first_violation_in_seed_order(capsys) -> None:
    # f1-unfenced breaks seed 1 (docs/simulation.md's table): the other jobs stop, and
    # what is printed is what one process prints.
    flags = ["--seeds", "8", "--mutant", "f1-unfenced"]
    alone = _lines(flags, capsys)
    assert _lines(flags + ["--jobs", "2"], capsys) == alone
    assert alone[0] == "1" and alone[1].startswith("FAIL seed=1 invariant=")
    assert alone[-1].startswith("sim: 2 seeds, ")
