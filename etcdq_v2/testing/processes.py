"""Child processes that die with this one: :func:`popen_tied`.

On Linux a member (or a demo worker) dies with the process that started it,
even a SIGKILLed one (``PR_SET_PDEATHSIG``): no orphan etcd keeps serving,
and holding its ports, after a crashed test run or CLI.
"""
from __future__ import annotations

import ctypes
import functools
import os
import queue
import signal
import subprocess
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable, Optional, Sequence, Tuple, TypeVar

_T = TypeVar("_T")


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
