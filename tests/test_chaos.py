"""The chaos run of bench/chaos.py, small enough for CI: nothing lost, nothing recorded
twice, no stale claim's commit, nothing left; and the checks of its report."""
from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from chaos import (Event, Workers, healthy, run_chaos, stale_outcomes,  # noqa: E402
                   superseded_records)

from etcdq_v2 import ItemInfo  # noqa: E402


def test_chaos_loses_nothing(cluster, tmp_path: Path) -> None:
    report = run_chaos(cluster, items=1500, workers=4, rounds=4, folder=tmp_path,
                       lock_ttl=15.0, pause_seconds=3.0)
    print("\nchaos report:", json.dumps(asdict(report)))
    assert report.leader_kills >= 1 and report.member_pauses >= 1
    assert report.black_holes >= 1 and report.held_writes >= 1
    assert report.acknowledged + report.unknown_puts == report.items
    assert report.lost == 0
    assert report.both_records == 0  # one outcome per item: completed/ or failed/
    assert report.stale_outcomes == 0 and report.superseded_records == 0, report.stale_examples
    assert report.left_in_work == 0 and report.left_in_locks == 0
    assert healthy(report)
    # Every record is one item; puts whose outcome was unknown add at most one each.
    records = report.completed_records + report.failed_records
    assert report.acknowledged <= records <= report.items
    # At-least-once: an item whose handler succeeds runs again only if its worker
    # was SIGKILLed, or its outcome could not be recorded (a held write, a lost lock).
    assert report.executed_more_than_once <= report.worker_kills + report.unsettled


def test_chaos_report_counts_runs_from_the_worker_logs(tmp_path: Path) -> None:
    workers = Workers(lambda slot: "http://127.0.0.1:1", "q", tmp_path, 1.0)
    (tmp_path / "worker-1.log").write_text("claimed a 1 1.5\nclaimed b 1 2.0\ncompleted a 1 2.1\n")
    (tmp_path / "worker-2.log").write_text("claimed b 2 9.0\nclaimed c 1 9.5\nclaimed b 3 10")
    assert workers.executions() == Counter({"a": 1, "b": 3, "c": 1})
    (tmp_path / "worker-3.log").write_text("claimed d 1 1\nclaimed d 2")  # cut by a SIGKILL
    assert workers.executions()["d"] == 1


def events(*lines: str) -> List[Event]:
    return [Event(kind, item, int(attempt), float(at))
            for kind, item, attempt, at in (line.split() for line in lines)]


def test_a_later_attempt_handed_out_makes_an_ok_outcome_stale() -> None:
    # Handed to attempt 2 while attempt 1's complete was in flight, and after it returned.
    assert len(stale_outcomes(events("claimed x 1 1", "claimed x 2 5", "completed x 1 6"))) == 1
    assert "after" in stale_outcomes(events("claimed y 1 1", "dead-lettered y 1 2",
                                            "claimed y 2 3"))[0]
    # Attempt 1 could not record its outcome, so attempt 2 is the item's only outcome.
    assert stale_outcomes(events("claimed z 1 1", "unsettled z 1 5", "claimed z 2 6",
                                 "completed z 2 7")) == []


def test_a_record_of_an_older_attempt_than_the_last_handed_out_is_superseded() -> None:
    records = {"completed": {"x": ItemInfo("x", "completed", None, 1),
                             "y": ItemInfo("y", "completed", None, 2)},
               "failed": {"z": ItemInfo("z", "failed", None, 3)}}
    log = events("claimed x 1 1", "claimed x 2 5", "claimed y 1 1", "claimed y 2 5",
                 "claimed z 3 1")
    assert [line.split(":")[0] for line in superseded_records(records, log)] == ["x"]
