"""``import`` reads a line up to the longest that export writes, never a whole overlong
line: one of tens of megabytes is refused, naming it, with the memory it takes bounded by
the limit rather than by the line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest

from etcdq_v2 import InvalidArgument, Queue

LONG = 40 << 20


@pytest.fixture
def queue(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, queue_name) as q:
        yield q


@pytest.fixture
def overlong(tmp_path: Path) -> Path:
    """A good line, then one of 40 MiB (a payload far over the limit)."""
    path = tmp_path / "lines.jsonl"
    good = {"id": "1", "state": "pending", "token": "t1", "attempts": 0, "created": 1.0,
            "payload": "ok"}
    with path.open("w") as out:
        out.write(json.dumps(good) + "\n")
        out.write('{"id": "2", "state": "pending", "token": "t2", "payload": "')
        out.write("x" * LONG)
        out.write('"}\n')
    return path


def test_an_overlong_line_is_refused_before_it_is_read_whole(queue: Queue,
                                                               overlong: Path) -> None:
    tracemalloc.start()
    try:
        with overlong.open("rb") as lines, pytest.raises(InvalidArgument, match="line 2"):
            queue.import_items(lines)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < LONG // 4  # of the limit's order (about 3 MiB), not the line's
    assert [info.payload for info in queue.items()] == ["ok"]  # the line before it is stored


def test_etcdq_import_refuses_an_overlong_line(etcd_url: str, queue: Queue,
                                               overlong: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "etcdq_v2", "import", queue.name,
                           str(overlong)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ETCDQ_ENDPOINTS": etcd_url})
    assert done.returncode == 2, done.stderr
    assert "line 2: longer than" in done.stderr
    assert queue.stats()["pending"] == 1
