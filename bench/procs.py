"""Worker processes that set up, wait at a common start line, run, and report back.

Consumers run in separate processes, not threads: each etcd client spends
most of its time in Python code, so threads would measure the GIL rather
than the queue.  Processes are *spawned* (a fresh interpreter, no copy of the
parent's threads or connections), which costs ~0.3 s each; that setup time
is kept out of every measurement by the start line: each worker sets up,
then calls the ``start`` function it is given, which returns only once every
worker (and the parent, in :meth:`Workers.go`) is ready.
"""
from __future__ import annotations

import multiprocessing
import queue
import time
import traceback
from types import TracebackType
from typing import Any, Callable, Dict, Generic, List, Optional, Sequence, Tuple, Type, TypeVar

T = TypeVar("T")

#: A worker's ``start()``: waits for the start line, returns the start time (time.time()).
StartLine = Callable[[], float]

_CONTEXT = multiprocessing.get_context("spawn")
#: How long a worker may take to reach the start line (spawning 32 on 2 cores is slow).
_SETUP_TIMEOUT = 120.0
#: How often the parent looks for a worker that died without reporting.
_POLL = 0.05


class WorkerFailed(RuntimeError):
    """A worker raised, or did not finish in time; the message has its traceback."""


def _worker_main(index: int, target: Callable[..., T], args: Tuple[Any, ...],
                 start_line: Any, results: Any) -> None:
    def start() -> float:
        start_line.wait(_SETUP_TIMEOUT)
        # time.time(), not monotonic(): start and end times are compared
        # across processes, and the wall clock is the one they all share.
        return time.time()

    try:
        results.put((index, target(start, *args), None))
    except BaseException:  # report anything, so the parent never waits in vain
        results.put((index, None, traceback.format_exc()))
        start_line.abort()  # a worker that failed in setup must not hold the others back


class Workers(Generic[T]):
    """One process per argument tuple, each running ``target(start, *args)``.

    Use as a context manager: on exit, workers still running are terminated
    (only these processes, by their Process objects) and all are joined.
    """

    def __init__(self, target: Callable[..., T], arg_tuples: Sequence[Tuple[Any, ...]]) -> None:
        self._results: Any = _CONTEXT.Queue()
        self._start_line = _CONTEXT.Barrier(len(arg_tuples) + 1)  # + 1: the parent
        self._processes = [
            _CONTEXT.Process(target=_worker_main, daemon=True,
                             args=(i, target, args, self._start_line, self._results))
            for i, args in enumerate(arg_tuples)]

    def __enter__(self) -> "Workers[T]":
        for process in self._processes:
            process.start()
        return self

    def go(self) -> None:
        """Wait until every worker is at the start line, then let them all run."""
        deadline = time.monotonic() + _SETUP_TIMEOUT
        while self._start_line.n_waiting < len(self._processes):
            # A worker that dies while starting (say, an import error) never
            # reaches the line: notice that instead of waiting for the timeout.
            if any(p.exitcode is not None for p in self._processes) \
                    or time.monotonic() > deadline:
                self._start_line.abort()
                raise WorkerFailed(self._first_error() or
                                   "a worker died or hung before the start line; see stderr")
            time.sleep(_POLL)
        self._start_line.wait(_SETUP_TIMEOUT)

    def results(self, timeout: float) -> List[T]:
        """Every worker's return value, in argument order; WorkerFailed on any failure."""
        deadline = time.monotonic() + timeout
        values: Dict[int, T] = {}
        while len(values) < len(self._processes):
            try:
                index, value, error = self._results.get(timeout=_POLL)
            except queue.Empty:
                self._check_alive(values, deadline, timeout)
                continue
            if error is not None:
                raise WorkerFailed(error)
            values[index] = value
        return [values[i] for i in range(len(self._processes))]

    def _check_alive(self, reported: Dict[int, T], deadline: float, timeout: float) -> None:
        # A worker killed outright (OOM, a signal) reports nothing.
        for index, process in enumerate(self._processes):
            if index not in reported and process.exitcode not in (None, 0):
                raise WorkerFailed(f"worker {index} died with exit code {process.exitcode}")
        if time.monotonic() > deadline:
            raise WorkerFailed(f"workers did not finish within {timeout:g} s")

    def _first_error(self) -> Optional[str]:
        try:
            return str(self._results.get(timeout=1.0)[2])
        except queue.Empty:
            return None

    def __exit__(self, exc_type: Optional[Type[BaseException]],
                 exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        for process in self._processes:
            if process.is_alive() and exc_type is not None:
                process.terminate()
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


def run_workers(target: Callable[..., T], arg_tuples: Sequence[Tuple[Any, ...]],
                timeout: float) -> List[T]:
    """Start the workers, let them go together, and return their results."""
    with Workers(target, arg_tuples) as workers:
        workers.go()
        return workers.results(timeout)
