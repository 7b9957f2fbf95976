"""The servers the benchmark runs against, started and stopped by the benchmark itself.

Every section gets a fresh etcd (via :class:`etcdq_v2.server.EtcdServer`), so
one section's leftovers (100,000 items, completion records, a long WAL) never
slow down the next, and etcd's own operation counters can be diffed around a
single run.  ZooKeeper is only needed for the Kazoo peer; when it cannot be
started, :class:`ZooKeeperUnavailable` says why and that row is skipped.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List

from etcdq_v2.server import EtcdServer, free_port

# -- etcd ----------------------------------------------------------------------------

#: /v2/stats/store operations that go through raft: one log entry each, whether
#: they succeed or fail (a lost ``prevExist=false`` race is a failed create).
WRITE_OPS = ("sets", "update", "create", "compareAndSwap", "delete", "compareAndDelete")
#: Prefix of the per-method HTTP request counts in etcd_counters(): httpGET, httpQGET, ...
_HTTP = "http"
_RECEIVED = re.compile(r'etcd_http_received_total\{method="(\w+)"\}$')
#: Other /metrics counters kept, by the key they get in etcd_counters().
_METRICS = {
    "watches": "etcd_debugging_store_watch_requests_total",
    "fsyncs": "etcd_disk_wal_fsync_duration_seconds_count",
    "fsync_seconds": "etcd_disk_wal_fsync_duration_seconds_sum",
}


@contextmanager
def etcd_server(workdir: Path) -> Iterator[EtcdServer]:
    """A fresh single-member etcd in a new directory under ``workdir``."""
    data = Path(tempfile.mkdtemp(prefix="etcd-", dir=workdir)) / "data"
    server = EtcdServer(data).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class EtcdOps:
    """Operations etcd itself counted between two :func:`etcd_counters` snapshots."""

    writes: int           # successful writes of any kind
    failed_writes: int    # writes that went through raft and then failed a condition
    reads: int            # GET requests, plain and quorum (QGET); not watches
    watches: int          # watch requests (each long-poll or stream counts once)
    fsyncs: int           # WAL fsyncs: each commits one batch of raft entries
    fsync_seconds: float  # time etcd spent in them

    @classmethod
    def between(cls, before: Dict[str, float], after: Dict[str, float]) -> "EtcdOps":
        def diff(*names: str) -> float:
            return sum(after.get(name, 0) - before.get(name, 0) for name in names)
        return cls(writes=int(diff(*(op + "Success" for op in WRITE_OPS))),
                   failed_writes=int(diff(*(op + "Fail" for op in WRITE_OPS))),
                   reads=int(diff(_HTTP + "GET", _HTTP + "QGET")),
                   watches=int(diff("watches")), fsyncs=int(diff("fsyncs")),
                   fsync_seconds=diff("fsync_seconds"))

    @property
    def requests(self) -> int:
        """Every request a client made, of any kind."""
        return self.writes + self.failed_writes + self.reads + self.watches


def etcd_counters(url: str) -> Dict[str, float]:
    """A snapshot of etcd's own counters, counted by the server for all clients together.

    Writes come from the v2 store's counters (``GET /v2/stats/store``:
    setsSuccess, createFail, ...), which split successes from failed
    conditions.  Its gets counters are not used for reads: etcd counts an
    internal failed get on every request (the v2 auth check).  Reads are the
    HTTP requests received by method (``/metrics`` etcd_http_received_total:
    keys httpGET, httpQGET for quorum reads, httpPUT, ...), which leave
    watches out; those, and the WAL fsyncs that bound how fast etcd commits,
    come from other ``/metrics`` counters (see _METRICS).  Reading the stats
    and metrics themselves counts nowhere.
    """
    with urllib.request.urlopen(url + "/v2/stats/store", timeout=5) as reply:
        counters: Dict[str, float] = {key: int(value) for key, value in json.load(reply).items()}
    wanted = {metric: key for key, metric in _METRICS.items()}
    with urllib.request.urlopen(url + "/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            name, _, value = line.rpartition(" ")
            received = _RECEIVED.match(name)
            if received:
                counters[_HTTP + received.group(1)] = float(value)
            elif name in wanted:
                counters[wanted[name]] = float(value)
    return counters


# -- ZooKeeper (for the Kazoo peer only) -----------------------------------------------

#: Debian's ``zookeeper`` package: the jar's manifest lists its dependencies.
DEBIAN_ZOOKEEPER_JAR = Path("/usr/share/java/zookeeper.jar")
#: Or point this at an unpacked Apache release (its lib/*.jar are used).
ENV_ZOOKEEPER_HOME = "ZOOKEEPER_HOME"
_ZOOKEEPER_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"
_ZOOKEEPER_START_TIMEOUT = 30.0


class ZooKeeperUnavailable(Exception):
    """ZooKeeper or Kazoo is missing or would not start; the message says which."""


def _zookeeper_classpath() -> str:
    home = os.environ.get(ENV_ZOOKEEPER_HOME)
    if home:
        jars = sorted(Path(home, "lib").glob("*.jar"))
        if not jars:
            raise ZooKeeperUnavailable(f"no jars in ${ENV_ZOOKEEPER_HOME}/lib ({home}/lib)")
        return os.pathsep.join(str(jar) for jar in jars)
    if DEBIAN_ZOOKEEPER_JAR.is_file():
        return str(DEBIAN_ZOOKEEPER_JAR)
    raise ZooKeeperUnavailable(f"no ZooKeeper found: apt-get install zookeeper, or set "
                               f"${ENV_ZOOKEEPER_HOME} to an unpacked release")


def _zookeeper_command(workdir: Path, port: int) -> List[str]:
    """The java command for a standalone ZooKeeper on loopback ``port``, data in ``workdir``."""
    java = shutil.which("java")
    if java is None:
        raise ZooKeeperUnavailable("no java on PATH")
    try:
        import kazoo  # noqa: F401  (the client side of the peer)
    except ImportError:
        raise ZooKeeperUnavailable("kazoo is not installed (pip install kazoo)") from None
    config = workdir / "zoo.cfg"
    config.write_text("\n".join([
        "tickTime=2000",
        f"dataDir={workdir / 'data'}",
        f"clientPort={port}",
        "clientPortAddress=127.0.0.1",
        "admin.enableServer=false",  # its HTTP port (8080) may be taken; we don't need it
        "maxClientCnxns=0",          # the default 60 per address is too few for 32 consumers
        "4lw.commands.whitelist=ruok",  # for the readiness check
    ]) + "\n")
    return [java, "-Xmx512m", "-cp", _zookeeper_classpath(), _ZOOKEEPER_MAIN, str(config)]


def _answers_ruok(port: int) -> bool:
    """ZooKeeper's "are you ok" four-letter command; True once it serves clients."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(b"ruok")
            return sock.recv(16) == b"imok"
    except OSError:
        return False


def _wait_for_zookeeper(process: "subprocess.Popen[bytes]", port: int, log: Path) -> None:
    deadline = time.monotonic() + _ZOOKEEPER_START_TIMEOUT
    while not _answers_ruok(port):
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise ZooKeeperUnavailable(f"ZooKeeper exited with {process.returncode}: {tail}")
        if time.monotonic() > deadline:
            raise ZooKeeperUnavailable(f"ZooKeeper not serving on port {port} after "
                                       f"{_ZOOKEEPER_START_TIMEOUT:g} s; see {log}")
        time.sleep(0.1)


@contextmanager
def zookeeper_server(workdir: Path) -> Iterator[str]:
    """A standalone ZooKeeper in a new directory under ``workdir``; yields ``host:port``.

    Raises :class:`ZooKeeperUnavailable` (before yielding) if it cannot run here.
    """
    home = Path(tempfile.mkdtemp(prefix="zookeeper-", dir=workdir))
    port = free_port()
    command = _zookeeper_command(home, port)
    log = home / "zookeeper.log"
    with open(log, "wb") as out:
        # Own session: a Ctrl-C on the benchmark must not kill it before we stop it.
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for_zookeeper(process, port, log)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

