"""Client instructions per item: put, claim and complete, counted by callgrind.

    python -m bench.instructions [--items 50 250] [--tree DIR ...]

One process (the tree's ``etcdq_v2``) opens a queue on a fresh local etcd,
puts N items one by one, then claims and completes them one by one; it runs
under ``valgrind --tool=callgrind`` with ``PYTHONHASHSEED=0``, which counts
every instruction of the process (its threads too: the view's follower and
the heartbeat), etcd's none.  The count at the larger N less the count at
the smaller, over the difference of N, is the instructions per item: the
imports, the queue's opening and the first listing cancel out.  A busy
machine moves CPU seconds by tens of percent; instructions move by well
under 1 % from one run to the next.  Each ``--tree`` is a directory holding
an ``etcdq_v2/`` (a worktree of an older commit, say), default this tree.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

REPO = Path(__file__).resolve().parent.parent

LOOP = """
import sys
from etcdq_v2 import Queue
url, name, items = sys.argv[1], sys.argv[2], int(sys.argv[3])
queue = Queue(url, name, lock_ttl=30)
for number in range(items):
    queue.put({"n": number})
done = 0
while done < items:
    claim = queue.claim(timeout=10)
    assert claim is not None, "an item put was not handed out"
    claim.complete(None)
    done += 1
queue.close()
"""


def count(tree: Path, url: str, name: str, items: int) -> int:
    """Instructions callgrind counted in one run of LOOP."""
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={scratch}/out",
             sys.executable, "-c", LOOP, url, name, str(items)],
            env=env, cwd=str(tree), capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no count in callgrind's output:\n{done.stderr}")
    return int(found.group(1))


def main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, nargs=2, default=[50, 250])
    parser.add_argument("--tree", type=Path, action="append")
    args = parser.parse_args(argv)
    from bench.servers import etcd_server

    small, large = args.items
    print("| tree | instructions at N={:,} | at N={:,} | per item |".format(small, large))
    print("|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work, etcd_server(Path(work)) as server:
        for number, tree in enumerate(path.resolve() for path in args.tree or [REPO]):
            low = count(tree, server.url, f"ins{number}a", small)
            high = count(tree, server.url, f"ins{number}b", large)
            print(f"| {tree} | {low:,} | {high:,} | {(high - low) / (large - small):,.0f} |",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
