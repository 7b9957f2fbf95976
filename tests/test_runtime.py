"""Every clock, sleep, lock, thread and random source of the library comes from
its queue's runtime (etcdq_v2/runtime.py), so that a simulated runtime can
replace it.

Two checks: the library's modules import none of those sources themselves (a
new direct use fails here), and a queue given a runtime of its own reaches
every one of them through it, on real etcd.
"""
from __future__ import annotations

import ast
import collections
import threading
from pathlib import Path
from typing import Any, Callable, Counter, List, Optional

import pytest

import etcdq_v2
from etcdq_v2 import ConfigError, Queue, Worker, connect
from etcdq_v2.runtime import SYSTEM, Runtime, ThreadLike

PACKAGE = Path(etcdq_v2.__file__).parent
#: Modules that reach the real sources themselves, and why.
ALLOWED = {
    "runtime.py": "it is the real runtime",
    "wire.py": "the real network, with its socket timeouts; a simulator replaces it whole",
    "signals.py": "signal handlers run on the real main thread",
    "metrics.py": "the HTTP server and its scrape cache run on real threads, outside a simulation",
    "httpd.py": "the dashboard's and the metrics' HTTP servers: real sockets and threads",
    "command.py": "etcdq work's real subprocesses, whose pipes are read on real threads",
    "etcd_binary.py": "finds and runs the etcd binary: no part of a queue",
}
#: Modules whose import is a clock, a thread or a random source.
SOURCES = {"time", "threading", "_thread", "random", "secrets", "queue", "concurrent",
           "selectors", "asyncio", "multiprocessing"}
#: Attributes of ``os`` that are random sources.
OS_RANDOM = {"urandom", "getrandom"}


def direct_uses(source: str) -> List[str]:
    """Each import of a module in SOURCES and each use of os.urandom in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name.split(".")[0] in SOURCES]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            if root in SOURCES or (root == "os" and
                                   any(alias.name in OS_RANDOM for alias in node.names)):
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Attribute) and node.attr in OS_RANDOM \
                and isinstance(node.value, ast.Name) and node.value.id == "os":
            found.append(f"line {node.lineno}: os.{node.attr}")
    return found


def library_modules() -> List[Path]:
    """The library below the CLI: etcdq_v2's own modules (not cli/, dashboard/, testing/)."""
    return sorted(path for path in PACKAGE.glob("*.py") if path.name not in ALLOWED)


def test_no_library_module_reads_a_clock_thread_or_random_source_but_through_the_runtime(
        ) -> None:
    modules = library_modules()
    assert {"protocol.py", "view.py", "queue.py", "claim.py", "worker.py"} <= {
        path.name for path in modules}
    uses = {path.name: direct_uses(path.read_text()) for path in modules}
    assert {name: found for name, found in uses.items() if found} == {}


#: The parts of the library that do no I/O: state machines that drivers feed
#: (the time too), and what they import of etcdq_v2.
NO_IO = {"viewstate.py": {"etcdq_v2.codec", "etcdq_v2.keys", "etcdq_v2.versions"},
         "versions.py": set()}


def test_the_view_s_state_machine_imports_no_source_of_io_time_threads_or_randomness() -> None:
    """viewstate.py (and what it holds, versions.py) import neither a source of
    time, threads or randomness, nor socket, nor the runtime, transport, wire
    or protocol modules: it is fed events and the time, and returns what to do."""
    for name, allowed in NO_IO.items():
        source = (PACKAGE / name).read_text()
        assert direct_uses(source) == [], name
        imported = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                imported.add(f"etcdq_v2.{node.module}" if node.level else str(node.module))
        ours = {module for module in imported if module.startswith("etcdq_v2")}
        assert ours <= allowed, f"{name} imports {sorted(ours - allowed)}"
        assert not imported & {"socket", "ssl", "http", "urllib", "os", "logging"}, name


@pytest.mark.parametrize("source", [
    "import time\ntime.sleep(1)", "import threading as t", "from random import choice",
    "import os\nos.urandom(12)", "from os import urandom", "from queue import SimpleQueue",
    "import concurrent.futures", "def f():\n    import secrets",
])
def test_the_import_check_finds_every_kind_of_direct_use(source: str) -> None:
    assert direct_uses(source)


def test_the_import_check_lets_relative_imports_and_other_os_uses_pass() -> None:
    assert direct_uses("from .queue import Queue\nfrom . import runtime\nimport os\n"
                       "os.getpid()\nfrom typing import Optional") == []


def test_the_real_runtime_gives_fresh_96_bit_tokens_and_real_primitives() -> None:
    tokens = {SYSTEM.token() for _ in range(100)}
    assert len(tokens) == 100 and all(len(t) == 24 and int(t, 16) >= 0 for t in tokens)
    event = SYSTEM.Event()
    thread = SYSTEM.Thread(event.set, name="etcdq-test")
    thread.start()
    thread.join(5)
    assert event.wait(0) and thread.name == "etcdq-test" and not thread.is_alive()
    inbox = SYSTEM.Inbox()
    inbox.put(1)
    assert inbox.get() == 1


class CountingRuntime(Runtime):
    """The real runtime, counting what is asked of it (from any thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = collections.Counter()
        self.threads: List[str] = []
        self._mutex = threading.Lock()

    def _count(self, name: str) -> None:
        with self._mutex:
            self.calls[name] += 1

    def monotonic(self) -> float:  # type: ignore[override]
        self._count("monotonic")
        return SYSTEM.monotonic()

    def boot_clock(self) -> float:  # type: ignore[override]
        self._count("boot_clock")
        return SYSTEM.boot_clock()

    def wall(self) -> float:  # type: ignore[override]
        self._count("wall")
        return SYSTEM.wall()

    def token(self) -> str:
        self._count("token")
        return super().token()

    def Condition(self, lock: Any = None) -> Any:  # noqa: N802
        self._count("Condition")
        return super().Condition(lock)

    def Thread(self, target: Callable[..., Any], *, name: Optional[str] = None,  # noqa: N802
               daemon: bool = True, args: Any = ()) -> ThreadLike:
        with self._mutex:
            self.threads.append(name or "")
        return super().Thread(target, name=name, daemon=daemon, args=args)


def test_a_queue_and_its_worker_take_every_source_from_the_queue_s_runtime(
        etcd_url: str, queue_name: str) -> None:
    runtime = CountingRuntime()
    with Queue(etcd_url, queue_name, runtime=runtime, lock_ttl=5) as queue:
        assert queue.runtime is runtime and queue.etcd.runtime is runtime
        queue.put("a")
        claim = queue.claim(timeout=5)
        assert claim is not None
        claim.complete()
        queue.put("b")
        done: List[Any] = []
        worker = Worker(queue, lambda payload: done.append(payload),
                        install_signal_handlers=False, claim_timeout=0.2)
        assert worker.runtime is runtime
        worker.run(max_items=1)
        assert done == ["b"]
    # The tokens of both puts and claims, C3's and the heartbeat's boot clock,
    # the records' times, the view's deadlines, and every thread.
    assert runtime.calls["token"] >= 4 and runtime.calls["boot_clock"] >= 2
    assert runtime.calls["wall"] >= 2 and runtime.calls["monotonic"] > 0
    assert {"etcdq-view", "etcdq-heartbeat", "etcdq-slot-1", "etcdq-handler-1"} <= set(
        runtime.threads)


def test_a_queue_s_runtime_is_its_transport_s(etcd_url: str, queue_name: str) -> None:
    runtime = Runtime()
    transport = connect(etcd_url, runtime=runtime)
    with Queue(transport, queue_name) as queue:
        assert queue.runtime is runtime
    with pytest.raises(ConfigError, match="runtime"):
        Queue(transport, queue_name, runtime=Runtime())


def test_a_worker_refuses_queues_of_different_runtimes(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name + "a", runtime=Runtime()) as first, \
            Queue(etcd_url, queue_name + "b", runtime=Runtime()) as second:
        with pytest.raises(ConfigError, match="runtimes"):
            Worker([first, second], lambda payload: None, install_signal_handlers=False)
