"""own-claims-live on a schedule of delayed replies and cut streams (30 % each):
at seed 24 a consumer's process pauses (SIGSTOP) while its claim's first
refresh waits to be sent; the claim is lost (lock_ttl since C1's send) before
the process resumes, and the refresh, sent on resuming, finds the lock expired
and re-creates it over delayed replies for 4.5 s more.  The view must stop
trusting the item's sign as its own live claim's when the claim turns lost,
not when that refresh returns (docs/protocol.md, **heartbeat**).

Run through etcdq_v2.testing.sim.reach in a process of its own, under two
hash seeds: the schedule is the same under each.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCHEDULE = ["--delay-reply", "0.3", "--rate", "cut_stream=0.3"]


@pytest.mark.parametrize("hash_seed", ["0", "3"])
def test_a_claim_lost_while_its_refresh_is_in_flight_is_disowned_in_time(hash_seed: str) -> None:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "etcdq_v2.testing.sim.reach", "--first", "24",
                          "--seeds", "1", *SCHEDULE], env=env, check=True, capture_output=True,
                         text=True).stdout
    [line] = [line for line in out.splitlines() if line.startswith("24 ")]
    assert line.startswith("24 [] "), line
    assert "'pause'" in line and "'delay_reply'" in line, line  # the schedule struck
