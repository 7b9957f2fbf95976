"""An open dashboard keeps etcd busy at most a fraction of the time: a snapshot is reused
for PACE times as long as the last one took when that is longer than ``interval``, and
the page is told to poll at that period."""
from __future__ import annotations

import json
import urllib.request
import uuid

from etcdq_v2 import Queue
from etcdq_v2.dashboard import Dashboard

DELAY_MS = 300  # each way: every etcd request takes at least 0.6 s through the proxy


def _overview(board: Dashboard) -> dict:
    with urllib.request.urlopen(board.url + "api/overview", timeout=60) as answer:
        return json.loads(answer.read())


def test_a_slow_snapshot_is_reused_for_pace_times_its_duration(etcd_url: str,
                                                               proxy_factory) -> None:
    prefix = f"/pacing-{uuid.uuid4().hex[:8]}"
    with Queue(etcd_url, "q", prefix=prefix) as queue:
        queue.put(1)
    proxy = proxy_factory(etcd_url)
    proxy.delay(DELAY_MS)
    with Dashboard(proxy.url, prefix=prefix, port=0, interval=0.1) as board:
        board.start()
        first = _overview(board)
        assert [q["name"] for q in first["queues"]] == ["q"]
        # Two requests at least (the listing, the queue): 1.2 s, so 4.8 s of reuse.
        assert first["interval"] >= 4 * 2 * 2 * DELAY_MS / 1000
        for _ in range(3):
            _overview(board)
        assert board.snapshots.rounds == 1  # not one per 0.1 s
