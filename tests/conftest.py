"""pytest fixtures that run real etcd processes for the tests.

The tests exercise etcdq against a real etcd (never a mock), because the
queue's correctness rests on etcd's exact v2 semantics.  One single-member
server is shared by the whole session (starting one costs ~1 s); tests that
need a cluster or that break a server get their own.

The etcd binary is the one :func:`etcdq_v2.server.find_etcd_binary` picks:
set ``ETCDQ_ETCD_BIN`` to test against another etcd version.
"""
from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import re
import secrets
import signal
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, List, Tuple

import pytest

from etcdq_v2.errors import ConfigError
from etcdq_v2.server import EtcdCluster, EtcdServer, etcd_version, find_etcd_binary

from faultproxy import FaultProxy

# A suite started as a background job by a shell without job control (``.ci/run &``
# in a script) inherits SIGINT ignored, and so would every etcdq process a test
# starts, which then never sees the Ctrl-C those tests send: give them the default.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_QUEUE_NAME_MAX = 100
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9._-]+")


@pytest.fixture
def quiet_library() -> Iterator[None]:
    """The library's loggers say only what is critical: a simulation's faults make it warn,
    and its invariants judge."""
    logger = logging.getLogger("etcdq_v2")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)


@pytest.fixture(autouse=True)
def _side_by_side(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test marked ``alone`` runs while no other xdist worker runs a test.

    Such a test measures etcd or the machine over a window of time (a CPU
    profile of a drain), which the tests of other workers would crowd out.
    The other workers wait before their next test; without xdist it is a no-op.
    """
    if not hasattr(request.config, "workerinput"):
        yield
        return
    # The run's base temporary directory, shared by its workers (each has a subdirectory).
    with _turn(tmp_path_factory.getbasetemp().parent,
               alone=request.node.get_closest_marker("alone") is not None):
        yield


@contextlib.contextmanager
def _turn(folder: Path, alone: bool) -> Iterator[None]:
    """A readers-writer lock across processes: many tests side by side, or one alone.

    A test alone holds the gate while it waits for the tests under way to end, so
    that no new one starts meanwhile; the others pass the gate and share the lock.
    Closing the files (a crashed worker too) releases both.
    """
    mode = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
    with open(folder / "side-by-side.gate", "a") as gate, \
            open(folder / "side-by-side.lock", "a") as lock:
        fcntl.flock(gate, mode)
        fcntl.flock(lock, mode)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield


@functools.lru_cache(maxsize=None)
def _etcd_binary_and_version() -> Tuple[str, str]:
    binary = find_etcd_binary()
    return binary, etcd_version(binary)


def pytest_report_header(config: pytest.Config) -> str:
    """Say which etcd the run used: v2 behaviour differs between releases."""
    try:
        binary, version = _etcd_binary_and_version()
    except ConfigError as exc:
        return f"etcd: not available ({exc})"
    return f"etcd: {version} ({binary})"


@pytest.fixture(scope="session")
def etcd_binary(record_testsuite_property: Callable[[str, object], None]) -> str:
    """Path of the etcd binary; its version goes into the junit-xml report."""
    binary, version = _etcd_binary_and_version()
    record_testsuite_property("etcd_version", version)
    return binary


@pytest.fixture(scope="session")
def etcd_server(etcd_binary: str, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[EtcdServer]:
    """One single-member etcd for the whole session, stopped by PID at the end."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd") / "data", binary=etcd_binary)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd_url(etcd_server: EtcdServer) -> str:
    """Client URL of the shared server, brought back first if a test stopped it."""
    if etcd_server.is_paused:
        etcd_server.resume()
    if not etcd_server.is_running():
        etcd_server.restart()
    return etcd_server.url


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> str:
    """A queue name unique to this test: ``t-<test name>-<random>``.

    Only ``[A-Za-z0-9._-]``, at most 100 characters, so it is a valid key
    segment; the test name in it tells whose leftovers a stray key is.
    """
    suffix = secrets.token_hex(4)
    room = _QUEUE_NAME_MAX - len("t--") - len(suffix)
    label = _UNSAFE_NAME_CHARS.sub("_", request.node.name)[:room]
    return f"t-{label}-{suffix}"


@pytest.fixture
def own_etcd(etcd_binary: str, tmp_path: Path) -> Iterator[EtcdServer]:
    """A member of this test's own, which it may pause (freeze) or stop."""
    server = EtcdServer(tmp_path / "etcd", binary=etcd_binary).start()
    yield server
    if server.is_paused:
        server.resume()
    server.stop()


@pytest.fixture
def cluster(etcd_binary: str, tmp_path: Path) -> Iterator[EtcdCluster]:
    """A fresh 3-member loopback cluster for this test, stopped afterwards."""
    members = EtcdCluster(tmp_path / "cluster", 3, binary=etcd_binary)
    members.start()
    try:
        yield members
    finally:
        members.stop()


@pytest.fixture
def proxy_factory() -> Iterator[Callable[[str], FaultProxy]]:
    """``make(url)``: a started FaultProxy in front of ``url``; all stopped after the test."""
    proxies: List[FaultProxy] = []

    def make(url: str) -> FaultProxy:
        proxies.append(FaultProxy.to(url).start())
        return proxies[-1]

    yield make
    for proxy in proxies:
        proxy.stop()


@pytest.fixture
def proxy(etcd_url: str, proxy_factory: Callable[[str], FaultProxy]) -> FaultProxy:
    """A FaultProxy in front of the shared etcd server (``proxy.url``), passing everything."""
    return proxy_factory(etcd_url)


#: Seconds a thread started by ``background`` may take before the test counts it as a hang.
BACKGROUND_BOUND = 15.0


@pytest.fixture
def background() -> Iterator[Callable[[Callable[[], Any]], "Future[Any]"]]:
    """Run a function in a thread; its exception is re-raised at the end of the test."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures: List["Future[Any]"] = []

        def submit(function: Callable[[], Any]) -> "Future[Any]":
            futures.append(pool.submit(function))
            return futures[-1]

        yield submit
        for future in futures:
            future.result(timeout=BACKGROUND_BOUND)
