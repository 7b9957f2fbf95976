"""A claim that finishes its item tells its view F1's index (ViewState.finished),
so that the view's left mark covers the version F1 wrote: a listing of work/
under way as the claim finished it, read between F1 and F3, shows the item at
F1's index (committed, with "o"), and must not offer it again (docs/protocol.md,
the view's state table, ``left`` and ``wrote``; docs/guarantees.md, "Order").

Against a real etcd: F1's index is read off etcd's event history of the item.
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any, List, Tuple

import pytest

from etcdq_v2 import Queue

BOUND = 10.0


class _Told:
    """The claim's view, recording what finished() is told."""

    def __init__(self, view: Any) -> None:
        self._view = view
        self.finished_calls: List[Tuple[str, int]] = []

    def finished(self, item_id: str, index: int = 0) -> None:
        self.finished_calls.append((item_id, index))
        self._view.finished(item_id, index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)


def _f1_index(etcd_url: str, queue: Queue, item_id: str, after: int) -> int:
    """The index of the first write of work/<id> after ``after`` (F1)."""
    key = queue.layout.key("work", item_id)
    url = f"{etcd_url}/v2/keys{key}?wait=true&waitIndex={after + 1}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        node = json.loads(reply.read())["node"]
    assert '"o":' in node["value"], node
    return int(node["modifiedIndex"])


@pytest.mark.parametrize("how", ["complete", "dead-letter"])
def test_a_finishing_claim_tells_its_view_the_index_its_commit_applied_at(
        etcd_url: str, queue_name: str, how: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put({"n": 1})
        claim = queue.claim(timeout=BOUND)
        assert claim is not None and claim.id == item_id
        c2_index = claim._state.index
        told = _Told(claim._view)
        claim._view = told  # type: ignore[assignment]
        if how == "complete":
            claim.complete("done")
        else:
            claim.fail("no", retry=False)
        f1 = _f1_index(etcd_url, queue, item_id, c2_index)
        assert told.finished_calls == [(item_id, f1)], (
            f"the view was told {told.finished_calls}, F1 applied at {f1} (C2 at {c2_index})")
