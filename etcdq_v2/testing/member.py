"""One etcd member: :class:`EtcdServer`, a real etcd process on 127.0.0.1 with v2 enabled.

The binary is started directly with :class:`subprocess.Popen` (no shell), so
the PID held is etcd's own and signals reach it, not a shell; in its own
session, so a Ctrl-C aimed at the test run or the CLI does not also kill etcd
behind our back; and tied to this process (:func:`.processes.popen_tied`).
A member is ready once it answers ``/v2/keys/`` as itself.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Callable, List, Optional, Sequence, Type, Union

from ..errors import ConfigError, Unavailable
from ..etcd_binary import find_etcd_binary
from .flags import initial_cluster_value, member_flags
from .probe import LOOPBACK, answers_v2, free_port, get_json, poll
from .processes import popen_tied

_LOG_HEAD_LINES = 3
_LOG_TAIL_LINES = 20
_BIND_ERROR = "address already in use"
_BIND_RETRY_DELAY = 0.5
_BIND_RETRIES = 10  # x 0.5 s: ports are free again ~2 s after a SIGTERM

PathLike = Union[str, "os.PathLike[str]"]


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
        self.url = f"{scheme}://{LOOPBACK}:{client_port or free_port()}"
        self.peer_url = f"http://{LOOPBACK}:{peer_port or free_port()}"
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
        ready = poll(deadline, lambda: False if stop() else self._ready_or_respawned())
        if ready is None:
            raise Unavailable(f"etcd {self.name} at {self.url} not ready after {timeout:g} s"
                              + self._log_excerpt_text())
        return ready

    def _ready_or_respawned(self) -> Optional[bool]:
        if self._process is None:
            raise Unavailable(f"etcd {self.name} was never started")
        if self._process.poll() is None:
            return True if answers_v2(self.url) and self._answers_as_itself() else None
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
        reply = get_json(self.url + "/v2/members")
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
        poll(time.monotonic() + 5.0, lambda: True if _all_threads_stopped(pid) else None)

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

    def log_text(self) -> str:
        """Everything etcd wrote to its log since it was last started (a test
        looks for what the member did, such as applying a raft snapshot)."""
        return self._log_since_start()

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
