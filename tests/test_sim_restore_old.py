"""The simulator's restore of the whole cluster from an older backup
(``simulate(restore_old=)``, ``--restore-old``): etcd's index goes back,
the writes since the backup are lost, every watch ends.  The invariants
judge each history apart (docs/simulation.md, "Invariants"): what etcd lost
at the restore is not the library's fault; what the library keeps of the
lost history is.
"""
from __future__ import annotations

import re
from typing import Any, Dict

import pytest

from etcdq_v2.testing.sim.simulation import simulate


pytestmark = pytest.mark.usefixtures("quiet_library")  # faults make the library warn


def test_a_restore_from_an_older_backup_replays_byte_for_byte() -> None:
    first = simulate(5, restore_old=1.0)
    assert first.faults["restore_old"] == 1
    [backup] = [line for line in first.trace if " back up the cluster at index " in line]
    [restore] = [line for line in first.trace if " restore the cluster from its backup " in line]
    assert float(backup.split()[0]) < float(restore.split()[0])
    # etcd's index went back: a request after the restore reads a lower one
    # than the writes before it had reached.
    indexes = [int(n) for n in re.findall(r"prevIndex=(\d+)", "\n".join(
        first.trace[first.trace.index(backup):first.trace.index(restore)]))]
    assert max(indexes) > int(backup.rsplit(" ", 1)[1])
    assert simulate(5, restore_old=1.0).trace == first.trace


def test_the_default_seeds_restore_no_backup() -> None:
    result = simulate(5)
    assert "restore_old" not in result.faults
    assert not [line for line in result.trace if "back up the cluster" in line]


def test_what_etcd_lost_at_a_restore_is_not_the_library_s_fault() -> None:
    # Seeds 0-7 of the defaults with a restore each: the puts, outcomes and
    # hand-outs of the history etcd lost (acknowledged-put-kept, one-outcome,
    # no-commit-after-reclaim, no-hand-out-after-outcome, delay-kept, ...)
    # are judged within their history, and break no invariant.
    for seed in range(8):
        result = simulate(seed, restore_old=1.0)
        assert result.faults["restore_old"] == 1, seed
        assert result.violations == [], (seed, result.violations)


@pytest.mark.parametrize("seed,options", [
    (27, {"consumers": 1, "workers": 0, "items": 60}),
    (4, {"swarm": True}),
])
def test_a_view_frees_an_item_taken_by_a_lock_sign_of_the_history_etcd_lost(
        seed: int, options: Dict[str, Any]) -> None:
    # view-taken-freed's bound on a sign held across the restore (OLDER_BOUND);
    # liveness breaks too in both seeds: the item is never offered again.
    result = simulate(seed, restore_old=1.0, **options)
    assert result.faults["restore_old"] == 1
    assert result.violations == [], result.violations
