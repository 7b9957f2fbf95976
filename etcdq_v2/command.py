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
import threading
from typing import IO, Any, Collection, List, Optional, Sequence, Tuple

from .codec import DEFAULT_MAX_PAYLOAD
from .errors import ConfigError
from .worker import ReasonOnly, current_task

#: Seconds between SIGTERM and SIGKILL when a command is stopped.
KILL_DELAY = 1.0
#: How much of a failed command's stderr is kept as the failure reason.
STDERR_TAIL = 2000
#: The library's own secrets (etcd's password, the TLS key, the dashboard's token, and the
#: files holding them), kept out of a command's environment unless passed on (``pass_env``):
#: a command runs an item's payload, which anyone who may put may write.
SECRET_ENVIRONMENT = frozenset({"ETCDQ_PASSWORD", "ETCDQ_PASSWORD_FILE", "ETCDQ_KEY",
                                "ETCDQ_DASHBOARD_TOKEN", "ETCDQ_DASHBOARD_TOKEN_FILE"})
_POLL = 0.1
_CHUNK = 64 * 1024


class CommandFailed(ReasonOnly):
    """The command exited non-zero, was killed, or could not start (the reason
    carries the end of its stderr; no traceback of ours is stored)."""


class CommandHandler:
    """A :class:`Worker` handler that runs ``argv`` once per item.

    The command runs in a new session (process group), so that a timeout or
    a forced shutdown can kill it and everything it started, and so that a
    Ctrl-C in the worker's terminal reaches the worker, which decides.  Its
    environment is the worker's without :data:`SECRET_ENVIRONMENT` (but for
    the names in ``pass_env``).  Of its stdout and stderr at most
    ``max_output`` + 1 bytes each are read (default: the payload limit, which
    a result must fit too): one that writes more is stopped, and its item
    fails with "result too large".
    """

    def __init__(self, argv: Sequence[str], queue_name: Optional[str] = None, *,
                 pass_env: Collection[str] = (), max_output: int = DEFAULT_MAX_PAYLOAD) -> None:
        self.argv = list(argv)
        #: ETCDQ_QUEUE for the command; None: the name of the item's own queue.
        self.queue_name = queue_name
        self.withheld = SECRET_ENVIRONMENT - set(pass_env)
        self.max_output = max_output

    def __call__(self, payload: Any) -> Any:
        task = current_task()
        env = {name: value for name, value in os.environ.items() if name not in self.withheld}
        env.update(ETCDQ_QUEUE=self.queue_name or task.claim.queue,
                   ETCDQ_ITEM_ID=task.claim.id, ETCDQ_ATTEMPT=str(task.claim.attempt))
        try:
            process = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       env=env, start_new_session=True)
        except OSError as exc:
            raise CommandFailed(f"cannot run {self.argv[0]}: {exc}") from None
        stdout, stderr = _communicate(process, _stdin_bytes(payload), task.cancelled,
                                      self.max_output)
        if stdout.over or stderr.over:
            name = "stdout" if stdout.over else "stderr"
            raise CommandFailed(f"result too large: the command wrote more than "
                                f"{self.max_output} bytes to {name}")
        if process.returncode != 0:
            raise CommandFailed(_failure_reason(process.returncode, stderr.data()))
        return command_result(stdout.data())


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


class _Output:
    """One of a command's output pipes, read in a thread of its own up to ``limit`` + 1
    bytes: then ``over`` is set and ``wake`` is, and the rest is left unread."""

    def __init__(self, stream: "IO[bytes]", limit: int, wake: threading.Event) -> None:
        self._stream, self._limit, self._wake = stream, limit, wake
        self._chunks: List[bytes] = []
        self.over = False
        self._thread = threading.Thread(target=self._read, name="etcdq-command-output",
                                        daemon=True)
        self._thread.start()

    def _read(self) -> None:
        size = 0
        while size <= self._limit:
            chunk = os.read(self._stream.fileno(), min(_CHUNK, self._limit + 1 - size))
            if not chunk:
                return
            self._chunks.append(chunk)
            size += len(chunk)
        self.over = True
        self._wake.set()

    def data(self) -> bytes:
        """What was read, once the pipe ended (or was read to its limit)."""
        self._thread.join()
        self._stream.close()
        return b"".join(self._chunks)


def _communicate(process: "subprocess.Popen[bytes]", data: bytes, cancelled: Any,
                 limit: int) -> Tuple[_Output, _Output]:
    """Feed stdin and read the output; stop the process group once ``cancelled`` is set
    or an output is over ``limit``.  Returns the outputs, read to their end."""
    wake = threading.Event()
    assert process.stdin and process.stdout and process.stderr  # all three are pipes
    outputs = (_Output(process.stdout, limit, wake), _Output(process.stderr, limit, wake))
    threading.Thread(target=_feed, args=(process.stdin, data), name="etcdq-command-input",
                     daemon=True).start()
    while process.poll() is None:
        if cancelled.is_set() or wake.is_set():
            _stop_group(process)
            break
        wake.wait(_POLL)
    for output in outputs:
        output.data()
    return outputs


def _feed(stdin: "IO[bytes]", data: bytes) -> None:
    try:
        stdin.write(data)
        stdin.close()
    except (BrokenPipeError, OSError):
        pass  # the command exited, or closed its stdin, without reading it all


def _stop_group(process: "subprocess.Popen[bytes]") -> None:
    _signal_group(process, signal.SIGTERM)
    try:
        process.wait(timeout=KILL_DELAY)
    except subprocess.TimeoutExpired:
        _signal_group(process, signal.SIGKILL)
        process.wait()


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
