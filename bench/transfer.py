"""What export and import cost: ``python bench/transfer.py [--items N ...] [--pad B]``.

Starts its own etcd, fills a queue with N pending items (``{"n": n, "pad":
"x" * B}``, about 100 bytes each with the default pad, put from 8 threads),
and runs each operation as its own child process, the way an operator runs
it.  The child reports its own peak RSS (``VmHWM`` of /proc/self/status, at
exit): ``ru_maxrss`` would not do, since a forked child keeps its parent's
high-water mark across exec.  Linux only.  The children:

* ``python -c 'import etcdq_v2'``: the interpreter and the library, the floor;
* ``etcdq export Q > file``: the listings read as they arrive;
* ``Queue.items("pending")``: one ordinary (whole) listing of work/, decoded,
  for comparison: what export would cost without streaming;
* ``etcdq import Q2 file`` into an empty queue, then the same again (every
  line skipped: the token set of N items, and a listing of N items).

Prints one markdown table; bench/README.md, "Export and import", has a run.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import markdown_table  # noqa: E402
from bench.servers import etcd_server  # noqa: E402
from etcdq_v2 import Queue  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ITEMS_SCRIPT = ("import sys; from etcdq_v2 import Queue; "
                "q = Queue(sys.argv[1], sys.argv[2]); print(len(q.items('pending')))")
#: Runs a module (``-m NAME ARGS``) or code (``-c CODE ARGS``) as python would, and
#: writes the process's peak RSS in kB to the file named first, at exit.
PEAK_RSS = """
import atexit, re, runpy, sys
report_to, mode, what = sys.argv[1:4]
def report():
    with open("/proc/self/status") as status:
        peak = re.search(r"VmHWM:\\s+(\\d+) kB", status.read()).group(1)
    with open(report_to, "w") as out:
        out.write(peak)
atexit.register(report)
if mode == "-m":
    sys.argv = [what, *sys.argv[4:]]
    runpy.run_module(what, run_name="__main__", alter_sys=True)
else:
    sys.argv = ["-c", *sys.argv[4:]]
    exec(compile(what, "<string>", "exec"), {"__name__": "__main__"})
"""


def fill(url: str, name: str, count: int, pad: int) -> None:
    """``count`` pending items, put from 8 threads."""
    with Queue(url, name) as queue:
        def put(start: int) -> None:
            queue.put_many([{"n": n, "pad": "x" * pad} for n in range(start, count, 8)])
        threads = [threading.Thread(target=put, args=(start,)) for start in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def child(args: List[str], url: str, work: Path,
          stdout: Optional[Path] = None) -> Tuple[float, int]:
    """Run ``python -m MODULE ...`` or ``python -c CODE ...`` to its end: (seconds,
    its peak RSS in bytes)."""
    env = {**os.environ, "ETCDQ_ENDPOINTS": url, "PYTHONPATH": str(ROOT)}
    report = work / "peak-rss"
    with open(stdout or os.devnull, "wb") as out:
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", PEAK_RSS, str(report), *args],
                       stdin=subprocess.DEVNULL, stdout=out, env=env, check=True)
        elapsed = time.perf_counter() - started
    return elapsed, int(report.read_text()) * 1024


def listing_bytes(url: str, name: str) -> int:
    """The size of work/'s listing as etcd sends it (read and counted, not kept)."""
    size = 0
    with urllib.request.urlopen(f"{url}/v2/keys/etcdq/{name}/work?sorted=true") as reply:
        for block in iter(lambda: reply.read(1 << 16), b""):
            size += len(block)
    return size


def one_size(url: str, count: int, pad: int, work: Path) -> Dict[str, str]:
    name, copy, lines = f"bench-{count}", f"bench-{count}-copy", work / f"items-{count}.jsonl"
    fill(url, name, count, pad)
    row = {"items": f"{count:,}", "listing": mb(listing_bytes(url, name))}
    row["floor"] = mb(child(["-c", "import etcdq_v2"], url, work)[1])
    seconds, peak = child(["-m", "etcdq_v2", "export", name], url, work, stdout=lines)
    row["export"] = f"{seconds:.1f} s, {mb(peak)}"
    row["file"] = mb(lines.stat().st_size)
    seconds, peak = child(["-c", ITEMS_SCRIPT, url, name], url, work)
    row["items()"] = f"{seconds:.1f} s, {mb(peak)}"
    seconds, peak = child(["-m", "etcdq_v2", "import", copy, str(lines)], url, work)
    row["import"] = f"{seconds:.1f} s ({count / seconds:,.0f}/s), {mb(peak)}"
    seconds, peak = child(["-m", "etcdq_v2", "import", copy, str(lines)], url, work)
    row["import again"] = f"{seconds:.1f} s, {mb(peak)}"
    return row


def mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--pad", type=int, default=80, help="bytes of padding per payload")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, etcd_server(Path(work)) as server:
        rows = []
        for count in args.items:
            rows.append(one_size(server.url, count, args.pad, Path(work)))
            print(f"{count} items done", file=sys.stderr, flush=True)
    headers = list(rows[0])
    print(markdown_table(headers, [[row[h] for h in headers] for row in rows]))


if __name__ == "__main__":
    main()
