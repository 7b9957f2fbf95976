"""The chaos run of bench/chaos.py, small enough for CI: nothing lost, nothing left."""
from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from chaos import run_chaos  # noqa: E402


def test_chaos_loses_nothing(cluster, tmp_path: Path) -> None:
    report = run_chaos(cluster, items=1500, workers=4, rounds=4, folder=tmp_path,
                       lock_ttl=15.0, pause_seconds=3.0)
    print("\nchaos report:", json.dumps(asdict(report)))
    assert report.leader_kills >= 1 and report.member_pauses >= 1
    assert report.acknowledged + report.unknown_puts == report.items
    assert report.lost == 0
    assert report.left_in_work == 0
    # Every record is one item; puts whose outcome was unknown add at most one each.
    assert report.acknowledged <= report.completed_records <= report.items
    # At-least-once: only an item whose worker was SIGKILLed may run twice.
    assert report.executed_more_than_once <= report.worker_kills


def test_chaos_report_counts_duplicates(tmp_path: Path) -> None:
    from chaos import Workers
    workers = Workers("http://127.0.0.1:1", "q", tmp_path, 1.0)
    (tmp_path / "worker-1.log").write_text("a\nb\n")
    (tmp_path / "worker-2.log").write_text("b\nc\nb\n")
    assert workers.executions() == Counter({"a": 1, "b": 3, "c": 1})
