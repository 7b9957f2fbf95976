"""What a free check costs (ViewState.is_free, run per item by candidates,
pick's walk and the backlog count): it reads the view's maps, and touches
no item's value while no version of the item was found junk (``skip``).

Fed to the state with no etcd and no threads, as tests/test_viewstate.py does.
"""
from __future__ import annotations

import hashlib
import random
from typing import Any


from etcdq_v2 import viewstate
from etcdq_v2.codec import Item

from test_viewstate import item_id, ready_state


def test_free_checks_hash_no_value_while_no_version_is_skipped(monkeypatch: Any) -> None:
    """A backlog of 200 items of 4 kB, none found junk: each pick calls
    is_free for every item it passes, a few dict lookups; hashing the value
    too (blake2b of up to MAX_CACHED_VALUE bytes) makes a free check about 5
    times dearer for 137 B values, 17 for 4 kB, 100 for 60 kB."""
    raw = Item(payload={"pad": "x" * 4000}, token="t", created=0.0).encode()
    state, _ = ready_state([(item_id(n), n, raw) for n in range(1, 201)])
    hashed: list[int] = []

    class _Counting:
        @staticmethod
        def blake2b(data: bytes, **kwargs: Any) -> Any:
            hashed.append(len(data))
            return hashlib.blake2b(data, **kwargs)

    monkeypatch.setattr(viewstate, "hashlib", _Counting, raising=False)
    rng = random.Random(1)
    for _ in range(20):
        found, _switch = state.pick(50, rng)
        assert found is not None
        state.untaken(found[0])
    assert not hashed, f"{len(hashed)} values hashed ({sum(hashed)} bytes) by 20 picks"
