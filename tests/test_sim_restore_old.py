"""The simulator's restore of the whole cluster from an older backup
(``simulate(restore_old=)``, ``--restore-old``): etcd's index goes back,
the writes since the backup are lost, every watch ends.  The invariants
judge each history apart (docs/simulation.md, "Invariants"): what etcd lost
at the restore is not the library's fault; what the library keeps of the
lost history is.
"""
from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any, Dict

import pytest

from etcdq_v2.testing.sim import invariants
from etcdq_v2.testing.sim.actors import History
from etcdq_v2.testing.sim.invariants import Stored
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


@pytest.mark.xfail(strict=True, reason=(
    "the view keeps the lock signs of the history etcd lost at a restore: a listing of "
    "locks/ (or a removal) at an index below a sign frees nothing (ViewState.unlocked), so "
    "an item stays taken in every view that held the sign until etcd's index passes it "
    "again, and with no work left to raise it, for ever (being fixed on branch lockback)"))
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


@pytest.mark.xfail(strict=True, reason=(
    "acknowledged-put-kept skips any put whose payload some POST of the lost history "
    "carried, whenever it returned and whatever id it returned: a put whose first POST "
    "the restore lost and whose second created an item the new history holds is not "
    "checked (invariants._kept, lost_payloads)"))
def test_a_put_acknowledged_after_a_restore_under_an_id_it_did_not_lose_must_be_stored() -> None:
    # The cluster restored at 50 s from a backup at index 100; a POST of p0-3
    # applied in the lost history at index 120.  The put returned at 70 s with
    # item 150, which the new history created (a second POST of the payload
    # after the first one's reply timed out): etcd did not lose it, so an end
    # with item 150 stored nowhere breaks acknowledged-put-kept.
    history = History()
    history.eras = [(50.0, 10, 0, 100)]
    history.puts = {f"{150:020d}": (70.0, "p0-3")}
    store = Stored(work={}, completed={}, failed={})
    found = invariants.check(history, store, {}, None, eras=[{}, {}],
                             lost={"p0-3", f"{120:020d}"})
    assert "acknowledged-put-kept" in [violation.name for violation in found]


def test_a_put_of_the_history_etcd_lost_is_not_the_library_s_fault() -> None:
    # The same put, acknowledged before the restore under the id the lost
    # history created: etcd lost it.
    history = History()
    history.eras = [(50.0, 10, 0, 100)]
    history.puts = {f"{120:020d}": (45.0, "p0-3")}
    store = Stored(work={}, completed={}, failed={})
    found = invariants.check(history, store, {}, None, eras=[{}, {}],
                             lost={"p0-3", f"{120:020d}"})
    assert "acknowledged-put-kept" not in [violation.name for violation in found]


def _open_claim() -> Any:
    """An open claim that says it is not lost, its complete() not running."""
    return SimpleNamespace(outcome=None, lost=False, _mutex=SimpleNamespace(_owner=None))


@pytest.mark.xfail(strict=True, reason=(
    "one-live-claim pairs only claims handed out in the current history "
    "(History.check_live_claims): a claim handed out before a restore is never paired "
    "again, also when the backup kept its lock and its refreshes succeed, so a second "
    "claim of its item beside it passes"))
def test_a_claim_of_the_history_before_a_restore_still_counts_while_it_says_it_is_live() -> None:
    history = History(overlap=2.0)
    older, newer = _open_claim(), _open_claim()
    history.open["x"] = [older]
    history.eras = [(50.0, 10, 0, 100)]
    history.open["x"].append(newer)
    history._era_of[id(newer)] = 1
    for now in (60.0, 70.0):
        history.check_live_claims(now)
    assert "one-live-claim" in [name for name, _ in history.seen]


@pytest.mark.xfail(strict=True, reason=(
    "a Worker's commit, noted at the end, is judged in the history of its claim's "
    "hand-out (Commit.era), not in the one its F1 applied in: in seed 0 the backup kept "
    "w0's claim of item 23 (C2 at index 28, the backup at 59), its F1 applied after the "
    "restore, and one-outcome, no-commit-after-reclaim and no-hand-out-after-outcome "
    "judge that outcome against the history etcd lost"))
def test_a_worker_s_outcome_applied_after_a_restore_is_judged_in_the_new_history(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: Dict[str, Any] = {}
    check = invariants.check

    def noting(history: History, *args: Any, **kwargs: Any) -> Any:
        seen["history"] = history
        return check(history, *args, **kwargs)
    monkeypatch.setattr(invariants, "check", noting)
    simulate(0, restore_old=1.0)
    history = seen["history"]
    [commit] = [commit for commit in history.commits
                if commit.item == f"{23:020d}" and commit.token.startswith("7c35ff")]
    assert history.eras[0][0] < 13.6  # the restore struck before the F1 applied
    assert history.commit_era(commit) == 1
