"""A seed's trace does not depend on the str hash seed (PYTHONHASHSEED).

The simulator's command pins PYTHONHASHSEED=0 when it is not set, so that a
seed replays byte for byte in another process.  If the library or the
simulator decided anything by the order of a set of strs, that pin would
also hide the schedules other hash seeds reach.  So a few seeds of several
schedules run under two other hash seeds, each in its own process, and
their traces must be the same.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: (flags, seed): the default schedule, a swarm seed with partitions and
#: delayed replies, a restore from an older backup, Workers only.
SCHEDULES = [([], 3), (["--swarm"], 5), (["--restore-old", "1"], 5),
             (["--consumers", "0", "--workers", "2"], 1)]


def _trace(hash_seed: str, flags: List[str], seed: int, out: Path) -> bytes:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed,
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "etcdq_v2.testing.sim", "--seed", str(seed),
                    *flags, "--trace", str(out)], env=env, check=True, capture_output=True)
    return out.read_bytes()


@pytest.mark.parametrize("flags,seed", SCHEDULES)
def test_a_seed_s_trace_is_the_same_under_other_hash_seeds(flags: List[str], seed: int,
                                                           tmp_path: Path) -> None:
    first = _trace("1", flags, seed, tmp_path / "1.trace")
    assert first and _trace("2", flags, seed, tmp_path / "2.trace") == first
