"""Running a shell command once per queue item: the handler behind ``etcdq work``.

:class:`CommandHandler` is a :class:`~etcdq_v2.worker.Worker` handler that
feeds the item's payload to a command's stdin and turns its exit status and
stdout into the item's outcome.  Each command runs in a process group of its
own, so that a timeout or a forced shutdown can kill it and everything it
started: the reason ``etcdq work`` runs commands as subprocesses rather than
as Python threads, which cannot be killed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from typing import Any, List, Optional, Sequence, Tuple

from .errors import ConfigError
from .worker import ReasonOnly, current_task

#: Seconds between SIGTERM and SIGKILL when a command is stopped.
KILL_DELAY = 1.0
#: How much of a failed command's stderr is kept as the failure reason.
STDERR_TAIL = 2000
_POLL = 0.1


class CommandFailed(ReasonOnly):
    """The command exited non-zero, was killed, or could not start (the reason
    carries the end of its stderr; no traceback of ours is stored)."""


class CommandHandler:
    """A :class:`Worker` handler that runs ``argv`` once per item.

    The command runs in a new session (process group), so that a timeout or
    a forced shutdown can kill it and everything it started, and so that a
    Ctrl-C in the worker's terminal reaches the worker, which decides.
    """

    def __init__(self, argv: Sequence[str], queue_name: Optional[str] = None) -> None:
        self.argv = list(argv)
        #: ETCDQ_QUEUE for the command; None: the name of the item's own queue.
        self.queue_name = queue_name

    def __call__(self, payload: Any) -> Any:
        task = current_task()
        env = {**os.environ, "ETCDQ_QUEUE": self.queue_name or task.claim.queue,
               "ETCDQ_ITEM_ID": task.claim.id,
               "ETCDQ_ATTEMPT": str(task.claim.attempt)}
        try:
            process = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=env, start_new_session=True)
        except OSError as exc:
            raise CommandFailed(f"cannot run {self.argv[0]}: {exc}") from None
        stdout, stderr = _communicate(process, _stdin_bytes(payload), task.cancelled)
        if process.returncode != 0:
            raise CommandFailed(_failure_reason(process.returncode, stderr))
        return command_result(stdout)


def check_command(argv: Sequence[str]) -> List[str]:
    """``argv`` as a list, once its program is found and executable; else ConfigError."""
    program = argv[0]
    found = program if os.sep in program else shutil.which(program)
    if not found or not os.access(found, os.X_OK) or os.path.isdir(found):
        raise ConfigError(f"command not found or not executable: {program}")
    return list(argv)


def command_result(stdout: bytes) -> Any:
    """A command's stdout as an item result: JSON if it parses, else text, else bytes."""
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError:
        return stdout
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text.rstrip("\r\n")


def _stdin_bytes(payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    return json.dumps(payload, ensure_ascii=False).encode("utf-8")


def _communicate(process: "subprocess.Popen[bytes]", data: bytes,
                 cancelled: Any) -> Tuple[bytes, bytes]:
    """Feed stdin and collect output, killing the process group once ``cancelled`` is set."""
    feed: Optional[bytes] = data
    while True:
        try:
            return process.communicate(feed, timeout=_POLL)
        except subprocess.TimeoutExpired:
            feed = None  # communicate() keeps sending what it started with
        if cancelled.is_set():
            return _stop_group(process)


def _stop_group(process: "subprocess.Popen[bytes]") -> Tuple[bytes, bytes]:
    _signal_group(process, signal.SIGTERM)
    try:
        return process.communicate(timeout=KILL_DELAY)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        return process.communicate()


def _signal_group(process: "subprocess.Popen[bytes]", signum: int) -> None:
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass  # the whole group is gone already


def _failure_reason(returncode: int, stderr: bytes) -> str:
    status = f"killed by {signal.Signals(-returncode).name}" if returncode < 0 \
        else f"exit status {returncode}"
    tail = stderr.decode("utf-8", "replace").strip()[-STDERR_TAIL:]
    return f"{status}: {tail}" if tail else status
