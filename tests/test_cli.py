"""The ``etcdq`` command line, run as a subprocess against a real etcd.

Every verb, the exit codes of user errors, ``work`` with a real command
(results, failures, a timeout, SIGTERM), ``dashboard`` served until a signal,
``server``, and ``demo`` end to end on an embedded etcd in a bare environment.  State is checked through the
Python API, so a CLI that printed the right thing but did the wrong thing fails.
"""
from __future__ import annotations

import base64
import io
import json
import os
import pty
import queue as queue_module
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from etcdq_v2 import Queue
from etcdq_v2.cli import EXIT_CODES
from etcdq_v2.cli.output import Progress, StatusLine
from etcdq_v2.server import TemporaryEtcd, free_port

from faultproxy import FaultProxy
from helpers import is_gone, wait_until

BOUND = 20.0
VERBS = ("put", "work", "stats", "ls", "show", "wait", "cancel", "requeue", "purge", "drop",
         "metrics", "dashboard", "export", "import", "server", "demo", "completion")
#: The global options, with their environment variables.
GLOBAL_OPTIONS = {"--endpoints": "ETCDQ_ENDPOINTS", "--prefix": "ETCDQ_PREFIX",
                  "--ca-cert": "ETCDQ_CA_CERT", "--cert": "ETCDQ_CERT", "--key": "ETCDQ_KEY",
                  "--username": "ETCDQ_USERNAME", "--password": "ETCDQ_PASSWORD",
                  "--request-timeout": "ETCDQ_TIMEOUT", "--json": None, "--verbose": None,
                  "--quiet": None}

Run = Callable[..., "subprocess.CompletedProcess[Any]"]

# Fails every third item, prints text for n == 2, echoes raw bytes payloads as hex,
# and otherwise reports what the worker told it through the environment.
JOB = """
import json, os, sys
data = sys.stdin.buffer.read()
try:
    n = json.loads(data)["n"]
except ValueError:
    print(json.dumps({"raw": data.hex()}))
    sys.exit(0)
if n % 3 == 0:
    print("line one\\nboom %d" % n, file=sys.stderr)
    sys.exit(3)
if n == 2:
    print("plain text")
    sys.exit(0)
print(json.dumps({"n": n, "queue": os.environ["ETCDQ_QUEUE"],
                  "item": os.environ["ETCDQ_ITEM_ID"], "attempt": os.environ["ETCDQ_ATTEMPT"]}))
"""

# Writes "<its pid> <its child's pid>" to pids-<item id> in the directory given,
# then waits for a file named "go" there (at most 30 s) and prints "finished".
BLOCKING_JOB = """
import os, subprocess, sys, time
directory = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
path = os.path.join(directory, "pids-" + os.environ["ETCDQ_ITEM_ID"])
with open(path + ".tmp", "w") as out:
    out.write("%d %d" % (os.getpid(), child.pid))
os.replace(path + ".tmp", path)
deadline = time.monotonic() + 30
while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
    time.sleep(0.05)
child.kill()
print("finished")
"""


def run_etcdq(args: Sequence[str], *, env: Optional[Dict[str, str]] = None,
              input: Any = None, timeout: float = 60.0,
              cwd: Optional[Path] = None) -> "subprocess.CompletedProcess[Any]":
    """``python -m etcdq_v2 ARGS``; bytes in, bytes out, else text."""
    return subprocess.run([sys.executable, "-m", "etcdq_v2", *args], input=input,
                          capture_output=True, text=not isinstance(input, bytes),
                          timeout=timeout, cwd=cwd,
                          env=env if env is not None else dict(os.environ))


def runner(etcd_url: str) -> Run:
    """Run etcdq on ``etcd_url``, given through ETCDQ_ENDPOINTS as a user would."""
    def run(*args: str, **kwargs: Any) -> "subprocess.CompletedProcess[Any]":
        env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url, **kwargs.pop("env", {})}
        return run_etcdq(args, env=env, **kwargs)
    return run


@pytest.fixture
def etcdq(etcd_url: str) -> Run:
    """Run etcdq on the shared etcd (see :func:`runner`)."""
    return runner(etcd_url)


def dead_on_failure(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    """A queue that dead-letters an item at its first failure (the ``queue`` fixture)."""
    with Queue(etcd_url, queue_name, max_attempts=1) as q:
        yield q


queue = pytest.fixture(dead_on_failure, name="queue")


def ok(done: "subprocess.CompletedProcess[str]") -> str:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def assert_user_error(done: "subprocess.CompletedProcess[str]", code: int,
                      *fragments: str) -> None:
    """One line ``etcdq: error: ...`` naming the problem, the given exit code, no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, f"exit {done.returncode}\n{done.stderr}"
    assert len(lines) == 1 and lines[0].startswith("etcdq: error: "), done.stderr
    for fragment in fragments:
        assert fragment in lines[0]


def payloads(queue: Queue, state: str = "pending") -> List[Any]:
    return [info.payload for info in queue.items(state)]


def take(queue: Queue, timeout: float = BOUND) -> Any:
    """The next item's claim (waiting: a claim may not see a put of a moment ago)."""
    claim = queue.claim(timeout=timeout)
    assert claim is not None, "nothing to claim"
    return claim


def fail_items(queue: Queue, count: int) -> List[str]:
    """``count`` dead letters (the queue has max_attempts=1)."""
    ids = queue.put_many([{"n": n} for n in range(count)])
    for _ in ids:
        take(queue).fail("on purpose")
    return ids


class Lines:
    """A process's output lines, read in a thread so that each wait can be bounded."""

    def __init__(self, stream: Optional[IO[str]]) -> None:
        assert stream is not None, "start the process with that stream piped"
        self._lines: "queue_module.Queue[Optional[str]]" = queue_module.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout: float = BOUND) -> str:
        line = self._lines.get(timeout=timeout)
        assert line is not None, "the output ended"
        return line

    def rest(self, timeout: float = BOUND) -> List[str]:
        """The lines up to the end of the output (of a process that has exited)."""
        found: List[str] = []
        line = self._lines.get(timeout=timeout)
        while line is not None:
            found.append(line)
            line = self._lines.get(timeout=timeout)
        return found


def find(pattern: str, text: str) -> "re.Match[str]":
    match = re.search(pattern, text)
    assert match, f"no {pattern!r} in:\n{text}"
    return match


def wait_all_gone(pids_file: Path) -> None:
    """Wait until the command and the child it started, listed in ``pids_file``, have ended."""
    pids = [int(pid) for pid in pids_file.read_text().split()]
    wait_until(lambda: all(is_gone(pid) for pid in pids), BOUND,
               message=f"processes {pids} to end")


def serves_v2(url: str) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        opener.open(f"{url}/v2/keys/", timeout=1).close()
    except OSError:
        return False
    return True


# -- help -------------------------------------------------------------------------------

def test_help_lists_every_verb_and_exit_code() -> None:
    text = ok(run_etcdq(["--help"]))
    for verb in VERBS:
        assert re.search(rf"^\s+{verb}\s", text, re.MULTILINE), verb
    for code, meaning in EXIT_CODES:
        assert re.search(rf"^\s+{code}\s+{re.escape(meaning)}", text, re.MULTILINE), code


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("etcdq")
    assert "usage: etcdq" in ok(subprocess.run([str(script), "work", "--help"],
                                               capture_output=True, text=True, timeout=30))


@pytest.mark.parametrize("verb", VERBS)
def test_a_verbs_help_lists_the_global_options_with_their_environment(verb: str) -> None:
    text = ok(run_etcdq([verb, "--help"]))
    usage = text.split("\n\n")[0]
    assert "--endpoints" not in usage  # the verb's own usage stays short
    section = find(r"(?ms)^global options \(before or after the verb\):\n(.*?)(?:\n\n|\Z)",
                   text).group(1)
    flat = " ".join(section.split())
    for flag, env in GLOBAL_OPTIONS.items():
        assert flag in flat, flag
        if env:  # named in the flag's own entry, before the next flag
            find(rf"{re.escape(flag)}\b(?:(?!--\w).)*\(env {env}\b", flat)


# -- put, stats, ls, show -----------------------------------------------------------------

def test_put_parses_each_argument_as_json_else_as_a_string(etcdq: Run, queue: Queue) -> None:
    out = ok(etcdq("put", queue.name, "1", '"s"', '{"a": [1]}', "hello world", "NaN"))
    assert out.split() == [info.id for info in queue.items()]
    assert payloads(queue) == [1, "s", {"a": [1]}, "hello world", "NaN"]


def test_put_dash_reads_one_payload_per_line_from_stdin(etcdq: Run, queue: Queue) -> None:
    out = ok(etcdq("put", queue.name, "-", "--json", input='1\n{"x": 2}\n\ntext\n'))
    assert json.loads(out) == [info.id for info in queue.items()]
    assert payloads(queue) == [1, {"x": 2}, "text"]


def test_put_in_flight_stores_every_line_once_and_prints_the_ids_in_input_order(
        etcdq: Run, queue: Queue) -> None:
    lines = [f"line-{n}" for n in range(200)]
    out = ok(etcdq("put", queue.name, "--in-flight", "16", "-", input="\n".join(lines) + "\n"))
    assert {info.id: info.payload for info in queue.items()} == dict(zip(out.split(), lines))


def test_put_in_flight_out_of_range_exits_2_and_writes_nothing(etcdq: Run, queue: Queue) -> None:
    assert_user_error(etcdq("put", queue.name, "--in-flight", "65", "1", "2"), 2,
                      "--in-flight", "at most 64")
    assert queue.stats()["pending"] == 0


def test_stats_prints_the_four_counts_and_the_delayed_within_pending(etcdq: Run,
                                                                     queue: Queue) -> None:
    queue.put_many([{"n": 1}, {"n": 2}])
    queue.put({"n": 3}, delay=60)
    claim = take(queue)
    assert json.loads(ok(etcdq("stats", queue.name, "--json"))) == \
        {"pending": 2, "running": 1, "completed": 0, "failed": 0, "delayed": 1}
    assert ok(etcdq("stats", queue.name)).split() == \
        ["pending", "2", "(delayed", "1)", "running", "1", "completed", "0", "failed", "0"]
    claim.complete()


def test_stats_watch_prints_a_line_per_refresh_until_ctrl_c(etcd_url: str, queue: Queue) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "etcdq_v2", "--endpoints", etcd_url, "stats", queue.name,
         "--watch", "--interval", "0.1", "--json"], stdout=subprocess.PIPE, text=True)
    try:
        lines = Lines(process.stdout)
        assert json.loads(lines.next())["pending"] == 0
        queue.put("x")
        wait_until(lambda: json.loads(lines.next())["pending"] == 1, BOUND,
                   message="a refresh showing the new item")
        process.send_signal(signal.SIGINT)
        assert process.wait(BOUND) == 0
    finally:
        process.kill()
        process.wait()


def test_ls_lists_items_of_a_state(etcdq: Run, queue: Queue) -> None:
    ids = queue.put_many([{"n": n} for n in range(3)])
    take(queue).complete({"r": 0})
    table = ok(etcdq("ls", queue.name)).splitlines()
    assert table[0].split() == ["ID", "ATTEMPTS", "NODE", "CREATED", "PAYLOAD"]
    assert [row.split()[0] for row in table[1:]] == ids[1:]
    assert len(ok(etcdq("ls", queue.name, "--limit", "1")).splitlines()) == 2
    [done] = json.loads(ok(etcdq("ls", queue.name, "--state", "completed", "--json")))
    assert (done["id"], done["state"], done["payload"], done["result"]) == \
        (ids[0], "completed", {"n": 0}, {"r": 0})


def test_ls_and_stats_count_no_finished_item_as_running_while_its_lock_lingers(
        etcdq: Run, queue: Queue) -> None:
    """issue 14: F4 is skipped (lock_ttl 30 s): the finishers' locks are in locks/."""
    done, dead, waiting = queue.put_many(["done", "dead", "waiting"])
    take(queue).complete()
    take(queue).fail("no")
    assert {e.id for e in queue._protocol.list("locks")[1]} == {done, dead}  # lingering
    assert json.loads(ok(etcdq("ls", queue.name, "--state", "running", "--json"))) == []
    pending = json.loads(ok(etcdq("ls", queue.name, "--state", "pending", "--json")))
    assert [item["id"] for item in pending] == [waiting]
    assert json.loads(ok(etcdq("stats", queue.name, "--json"))) == \
        {"pending": 1, "running": 0, "completed": 1, "failed": 1, "delayed": 0}


def test_show_prints_one_item(etcdq: Run, queue: Queue) -> None:
    item_id = queue.put(b"\x00\xffraw")
    fields = dict(line.split(":", 1) for line in ok(etcdq("show", queue.name, item_id))
                  .splitlines())
    assert (fields["id"].strip(), fields["state"].strip()) == (item_id, "pending")
    shown = json.loads(ok(etcdq("show", queue.name, item_id, "--json")))
    assert base64.b64decode(shown["payload"]["base64"]) == b"\x00\xffraw"


# -- requeue, purge -----------------------------------------------------------------------

def test_requeue_moves_dead_letters_back(etcdq: Run, queue: Queue) -> None:
    first, *others = fail_items(queue, 3)
    out = ok(etcdq("requeue", queue.name, first))
    new_id = queue.items()[0].id
    assert out.strip() == f"{first} -> {new_id}"
    assert (queue.stats()["pending"], queue.stats()["failed"]) == (1, 2)
    moved = json.loads(ok(etcdq("requeue", queue.name, "--all-failed", "--json")))
    assert sorted(entry["id"] for entry in moved) == sorted(others)
    assert (queue.stats()["pending"], queue.stats()["failed"]) == (3, 0)


def test_purge_asks_for_confirmation_unless_yes(etcdq: Run, queue: Queue) -> None:
    fail_items(queue, 1)
    queue.put("done")
    take(queue).complete()
    declined = etcdq("purge", queue.name, "--completed", input="n\n")
    prompt, error = declined.stderr.splitlines()
    assert prompt == f"Remove 1 completed record(s) of queue {queue.name}? [y/N] "
    assert (declined.returncode, error) == (1, "etcdq: error: purge not confirmed; nothing removed")
    assert queue.stats()["completed"] == 1
    assert ok(etcdq("purge", queue.name, "--completed", input="y\n")).strip() == \
        "removed 1 record(s)"
    assert json.loads(ok(etcdq("purge", queue.name, "--all", "--yes", "--json"))) == \
        {"removed": 1}
    assert queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 0}


# -- progress -----------------------------------------------------------------------------

class Clock:
    """A monotonic clock that a test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_shows_a_count_and_rate_on_a_terminal_once_the_operation_is_long() -> None:
    clock, terminal = Clock(), Terminal()
    with Progress("put", terminal, after=1.0, every=0.5, clock=clock) as progress:
        progress.advance()  # t=0: maybe a quick one, nothing yet
        clock.now = 1.0
        progress.advance()
        clock.now = 1.2
        progress.advance()  # drawn 0.2 s ago: not again yet
        clock.now = 2.0
        progress.advance()
    assert terminal.getvalue() == ("\r2 items put  2 items/s\x1b[K"
                                   "\r4 items put  2 items/s\x1b[K"
                                   "\r4 items put  2 items/s\x1b[K\n")  # close: final, newline


def test_progress_is_silent_for_a_quick_operation_and_off_a_terminal() -> None:
    clock, terminal, log = Clock(), Terminal(), io.StringIO()
    with Progress("put", terminal, after=1.0, clock=clock) as quick, \
            Progress("put", log, after=1.0, clock=clock) as logged:
        clock.now = 0.9
        quick.advance()
        clock.now = 5.0
        logged.advance()
    assert terminal.getvalue() == log.getvalue() == ""


def run_on_a_terminal(args: Sequence[str], input: Optional[str]) -> Tuple[str, str]:
    """Run etcdq with stderr on a pseudo-terminal: (stdout, what the terminal got)."""
    master, slave = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "etcdq_v2", *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    chunks: List[bytes] = []
    reader = threading.Thread(target=_read_terminal, args=(master, chunks), daemon=True)
    reader.start()
    try:
        out, _ = process.communicate(input, timeout=60)
    finally:
        process.kill()
        reader.join(BOUND)
        os.close(master)
    assert process.returncode == 0, b"".join(chunks)
    return out, b"".join(chunks).decode()


def _read_terminal(master: int, chunks: List[bytes]) -> None:
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: every process holding the terminal has ended
            return
        if not chunk:
            return
        chunks.append(chunk)


@pytest.mark.parametrize("verb", ["put", "purge"])
def test_a_long_put_or_purge_shows_progress_on_a_terminal_and_nothing_elsewhere(
        proxy: FaultProxy, queue: Queue, verb: str) -> None:
    count = 30
    if verb == "put":
        args, input, done = ["put", queue.name, "-"], "".join(f"{n}\n" for n in range(count)), "put"
    else:
        for item_id in queue.put_many(range(count)):
            queue.cancel(item_id)
        args, input, done = ["purge", queue.name, "--failed", "--yes"], None, "purged"
    proxy.delay(25)  # >= 50 ms a request: 30 items take over PROGRESS_AFTER (1 s)
    out, terminal = run_on_a_terminal(["--endpoints", proxy.url, *args], input)
    if verb == "put":
        assert out.split() == [info.id for info in queue.items()]
    else:
        assert out == f"removed {count} record(s)\n"
    find(rf"\r{count} items {done}  \d+ items/s\x1b\[K\r?\n$", terminal)  # the final count
    if verb == "put":  # the same with stderr on a pipe: quiet
        done_piped = run_etcdq(["--endpoints", proxy.url, *args], input=input)
        assert (done_piped.returncode, done_piped.stderr) == (0, "")


# -- completion ---------------------------------------------------------------------------

@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_prints_a_script_that_knows_every_verb(shell: str) -> None:
    script = ok(run_etcdq(["completion", shell]))
    for verb in VERBS:
        assert re.search(rf"\b{verb}\b", script), verb
    assert "--endpoints" in script and "--until-empty" in script
    interpreter = shutil.which(shell)
    if interpreter:  # zsh may be missing: then the script is only read, not parsed
        ok(subprocess.run([interpreter, "-n"], input=script, capture_output=True, text=True,
                          timeout=30))


def test_bash_completion_completes_verbs_options_and_files(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    script = tmp_path / "etcdq.bash"
    script.write_text(ok(run_etcdq(["completion", "bash"])))
    (tmp_path / "ca.pem").touch()

    def complete(*words: str) -> List[str]:
        # The function the script registers for etcdq, called as bash's TAB would.
        program = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); '
                   'COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; '
                   '$(complete -p etcdq | sed -E "s/.*-F ([^ ]+).*/\\1/"); '
                   'printf "%s\\n" "${COMPREPLY[@]}"')
        done = subprocess.run([bash, "-c", program, "-", str(script), "etcdq", *words],
                              capture_output=True, text=True, timeout=30, cwd=tmp_path)
        return sorted(ok(done).split())

    assert complete("pu") == ["purge", "put"]
    assert complete("work", "q", "--until") == ["--until-empty"]
    assert complete("put", "--end") == ["--endpoints"]  # a global option after the verb
    assert complete("completion", "") == ["bash", "zsh"]
    assert "ca.pem" in complete("stats", "--ca-cert", "")


def test_completion_without_shtab_says_which_extra_to_install() -> None:
    program = ("import sys; sys.modules['shtab'] = None  # import shtab raises ImportError\n"
               "from etcdq_v2.cli import main; sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", program, "completion", "bash"],
                          capture_output=True, text=True, timeout=30)
    assert_user_error(done, 1, "pip install 'etcdq_v2[completion]'")


# -- user errors ------------------------------------------------------------------------

@pytest.mark.parametrize("args", [["stats", "q"], ["put", "q", "1"], ["ls", "q"],
                                  ["work", "q", "--", "true"], ["dashboard", "--port", "0"]],
                         ids=lambda a: a[0])
def test_an_unreachable_endpoint_exits_3(args: List[str]) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    done = run_etcdq(["--endpoints", endpoint, "--request-timeout", "0.5", *args])
    assert_user_error(done, 3, endpoint)


@pytest.mark.parametrize("args", [["stats", "bad/name"], ["put", "..", "1"],
                                  ["ls", "x" * 129], ["work", "a b", "--", "true"]],
                         ids=lambda a: a[0])
def test_a_bad_queue_name_exits_2(etcdq: Run, args: List[str]) -> None:
    assert_user_error(etcdq(*args), 2, "invalid queue name")


def test_a_bad_payload_exits_2_and_writes_nothing(etcdq: Run, queue: Queue) -> None:
    assert_user_error(etcdq("put", queue.name, "-", input="1\n" + "x" * (2 << 20) + "\n"),
                      2, "over the limit")
    done = etcdq("put", queue.name, "-", input=b"\xff\xfe\n")
    assert done.returncode == 2 and b"not UTF-8" in done.stderr
    assert queue.stats()["pending"] == 0


def test_a_missing_item_exits_5(etcdq: Run, queue: Queue) -> None:
    missing = "9" * 20
    assert_user_error(etcdq("show", queue.name, missing), 5, missing)
    assert_user_error(etcdq("requeue", queue.name, missing), 5, missing)
    assert_user_error(etcdq("show", queue.name, "abc"), 2, "item id")


@pytest.mark.parametrize("args, fragment", [
    (["work", "q"], "command"),
    (["work", "q", "--", "/no/such/program"], "/no/such/program"),
    (["purge", "q"], "--completed"),
    (["requeue", "q"], "--all-failed"),
    (["put", "q"], "nothing to put"),
    (["frobnicate"], "invalid choice"),
    (["stats"], "QUEUE"),
    (["dashboard", "--port", "0", "--token", "short"], "at least 16"),
])
def test_usage_errors_exit_2_with_one_line(etcdq: Run, args: List[str], fragment: str) -> None:
    assert_user_error(etcdq(*args), 2, fragment)


def test_refused_credentials_exit_4() -> None:
    with TemporaryEtcd() as server:
        _enable_auth(server.url, "rootpw")
        base = ["--endpoints", server.url, "stats", "q"]
        assert_user_error(run_etcdq(["--username", "root", "--password", "wrong", *base]), 4,
                          "refused")
        assert_user_error(run_etcdq(base), 4, "refused")
        ok(run_etcdq(base, env={**os.environ, "ETCDQ_USERNAME": "root",
                                "ETCDQ_PASSWORD": "rootpw"}))


def _enable_auth(url: str, root_password: str) -> None:
    """etcd v2 auth with a root user, and the guest role's default full access revoked."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    root = base64.b64encode(f"root:{root_password}".encode()).decode()
    for path, body, auth in [
        ("/v2/auth/users/root", {"user": "root", "password": root_password}, False),
        ("/v2/auth/enable", None, False),
        ("/v2/auth/roles/guest",
         {"role": "guest", "revoke": {"kv": {"read": ["/*"], "write": ["/*"]}}}, True),
    ]:
        request = urllib.request.Request(
            url + path, method="PUT", data=json.dumps(body).encode() if body else b"",
            headers={"Content-Type": "application/json",
                     **({"Authorization": f"Basic {root}"} if auth else {})})
        opener.open(request, timeout=10).close()


# -- work ---------------------------------------------------------------------------------

def test_work_runs_the_command_once_per_item(etcdq: Run, queue: Queue, tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    ids = queue.put_many([{"n": n} for n in range(1, 7)])
    raw_id = queue.put(b"\x00\xffraw")
    done = etcdq("work", queue.name, "--until-empty", "--concurrency", "3", "--json",
                 "--max-attempts", "1", "--", sys.executable, str(script))
    assert done.returncode == 1, done.stderr  # items failed: etcdq work's exit status 1
    out = done.stdout
    assert json.loads(out) == {"completed": 5, "attempts_failed": 0, "dead_lettered": 2,
                               "lost": 0, "released": 0}
    results = {info.id: info.result for info in queue.items("completed")}
    assert results.pop(raw_id) == {"raw": b"\x00\xffraw".hex()}
    assert results.pop(ids[1]) == "plain text"
    assert results == {item_id: {"n": n, "queue": queue.name, "item": item_id, "attempt": "1"}
                       for n, item_id in enumerate(ids, 1) if n % 3 and n != 2}
    reasons = {info.payload["n"]: info.reason for info in queue.items("failed")}
    assert set(reasons) == {3, 6}
    assert reasons[3] is not None and reasons[3].startswith("CommandFailed: exit status 3: ")
    assert reasons[3].endswith("line one\nboom 3")


def test_work_timeout_kills_the_command_and_its_children(
        etcdq: Run, queue: Queue, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(BLOCKING_JOB)
    item_id = queue.put({"n": 0})
    began = time.monotonic()
    done = etcdq("work", queue.name, "--until-empty", "--timeout", "1", "--max-attempts", "1",
                 "--", sys.executable, str(script), str(tmp_path))
    assert done.returncode == 1, done.stderr  # the item failed: exit status 1
    assert time.monotonic() - began < 15
    info = queue.get(item_id)
    assert (info.state, info.reason) == ("failed", "timed out after 1 s")
    wait_all_gone(tmp_path / f"pids-{item_id}")


def _start_worker(etcd_url: str, queue: Queue, tmp_path: Path,
                  *options: str) -> "subprocess.Popen[str]":
    script = tmp_path / "block.py"
    script.write_text(BLOCKING_JOB)
    return subprocess.Popen(
        [sys.executable, "-m", "etcdq_v2", "--endpoints", etcd_url, "work", queue.name,
         *options, "--", sys.executable, str(script), str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_command(tmp_path: Path) -> Path:
    """The pids file the blocking job writes once it runs."""
    found = wait_until(lambda: next(tmp_path.glob("pids-*[0-9]"), None), BOUND,
                       message="the command to start")
    assert found is not None
    return found


def test_sigterm_lets_the_running_command_finish_and_takes_no_more(
        etcd_url: str, queue: Queue, tmp_path: Path) -> None:
    ids = queue.put_many([{"n": n} for n in range(3)])
    worker = _start_worker(etcd_url, queue, tmp_path)
    try:
        log = Lines(worker.stderr)
        _wait_for_command(tmp_path)
        worker.send_signal(signal.SIGTERM)
        wait_until(lambda: "no new claims" in log.next(), BOUND,
                   message="the worker to acknowledge SIGTERM")
        (tmp_path / "go").touch()
        assert worker.wait(BOUND) == 0
    finally:
        worker.kill()
        worker.wait()
    assert queue.get(ids[0]).result == "finished"
    assert queue.stats() == {"pending": 2, "running": 0, "completed": 1, "failed": 0}


@pytest.mark.parametrize("grace, signals", [("0.5", 1), ("60", 2)],
                         ids=["grace expires", "second SIGTERM"])
def test_sigterm_then_terminates_the_command_and_releases_its_item(
        etcd_url: str, queue_name: str, tmp_path: Path, grace: str, signals: int) -> None:
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put({"n": 0})
        worker = _start_worker(etcd_url, queue, tmp_path, "--grace", grace)
        try:
            log = Lines(worker.stderr)
            pids = _wait_for_command(tmp_path)
            # Wait for each signal's own log line: two signals sent back to back may
            # reach Python's handler as one.
            for acknowledged in ["SIGTERM: no new claims", "SIGTERM again: releasing"][:signals]:
                worker.send_signal(signal.SIGTERM)
                wait_until(lambda: acknowledged in log.next(), BOUND,  # noqa: B023 (called now)
                           message=f"the worker to log {acknowledged!r}")
            assert worker.wait(BOUND) == 0
        finally:
            worker.kill()
            worker.wait()
        assert queue.stats() == {"pending": 1, "running": 0, "completed": 0, "failed": 0}
        wait_all_gone(pids)
        again = take(queue, timeout=2)  # released: no lock TTL (30 s) to wait out
        assert (again.id, again.attempt) == (item_id, 1)  # a release uses up no attempt
        again.complete()


# -- dashboard --------------------------------------------------------------------------

def start_dashboard(etcd_url: str, prefix: str, *options: str,
                    env: Optional[Dict[str, str]] = None) -> "subprocess.Popen[str]":
    """``etcdq dashboard --port 0`` on ``prefix`` of the shared etcd, its output piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "etcdq_v2", "--endpoints", etcd_url, "--prefix", prefix,
         "dashboard", "--port", "0", *options], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})


def get_json(url: str, token: Optional[str] = None) -> Tuple[int, Any]:
    """``(status, JSON body)`` of a GET, error statuses included; no proxy."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with opener.open(request, timeout=BOUND) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def stop_dashboard(board: "subprocess.Popen[str]", out: Lines,
                   signum: int = signal.SIGTERM) -> str:
    """Send ``signum``; the dashboard must exit 0. The rest of its stdout (``out``)."""
    board.send_signal(signum)
    assert board.wait(BOUND) == 0, board.stderr.read() if board.stderr else ""
    return "".join(out.rest())


@pytest.mark.parametrize("signum, options", [(signal.SIGTERM, []),
                                             (signal.SIGINT, ["--allow-actions"])],
                         ids=["SIGTERM", "SIGINT, --allow-actions"])
def test_dashboard_serves_the_queues_until_a_stop_signal(
        etcd_url: str, queue_name: str, signum: int, options: List[str]) -> None:
    prefix = f"/{queue_name}"
    with Queue(etcd_url, "jobs", prefix=prefix, max_attempts=1) as jobs:
        fail_items(jobs, 1)
        jobs.put_many([1, 2])
        # An empty variable is no token (not a too-short one).
        board = start_dashboard(etcd_url, prefix, *options, env={"ETCDQ_DASHBOARD_TOKEN": ""})
        try:
            out = Lines(board.stdout)
            url = out.next().strip()
            assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", url), url
            status, document = get_json(url + "api/overview")
            assert status == 200, document
            assert [q["name"] for q in document["queues"]] == ["jobs"]
            assert document["queues"][0]["counts"] == jobs.stats() == \
                {"pending": 2, "running": 0, "completed": 0, "failed": 1}
            assert document["queues"][0]["dead_letters"][0]["reason"] == "on purpose"
            assert document["prefix"] == prefix and document["actions"] is bool(options)
            assert stop_dashboard(board, out, signum) == ""  # no token line on loopback
        finally:
            board.kill()
            board.wait()
    with pytest.raises(urllib.error.URLError):  # nothing listens any more
        get_json(url + "api/overview")


def test_dashboard_off_loopback_prints_the_token_its_api_requires(
        etcd_url: str, queue_name: str) -> None:
    board = start_dashboard(etcd_url, f"/{queue_name}", "--bind", "0.0.0.0")
    try:
        out = Lines(board.stdout)
        url = out.next().strip()
        token = find(r"^token: (\S{16,})$", out.next()).group(1)
        status, answer = get_json(url + "api/overview")
        assert status == 401 and "token" in answer["error"]
        assert get_json(url + "api/overview", token[::-1])[0] == 401
        status, document = get_json(url + "api/overview", token)
        assert status == 200 and document["queues"] == []
        stop_dashboard(board, out)
    finally:
        board.kill()
        board.wait()


def test_dashboard_takes_a_token_from_the_environment_and_keeps_it_quiet(
        etcd_url: str, queue_name: str) -> None:
    token = "t0ken-from-the-environment"
    board = start_dashboard(etcd_url, f"/{queue_name}", env={"ETCDQ_DASHBOARD_TOKEN": token})
    try:
        out = Lines(board.stdout)
        url = out.next().strip()
        assert url.startswith("http://127.0.0.1:")  # loopback, and a token all the same
        assert get_json(url + "api/overview")[0] == 401
        assert get_json(url + "api/overview", token)[0] == 200
        assert token not in stop_dashboard(board, out)
        assert board.stderr is not None and token not in board.stderr.read()
    finally:
        board.kill()
        board.wait()


# -- server and demo --------------------------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_one_line_on_a_terminal_and_prints_lines_elsewhere() -> None:
    terminal, log = Terminal(), io.StringIO()
    for out in (terminal, log):
        line = StatusLine(out)
        line.update("1/3")
        line.event("killed one")
        line.update("2/3")
        line.close()
    assert terminal.getvalue() == "\r1/3\x1b[K\r\x1b[Kkilled one\n\r2/3\x1b[K\n"
    assert log.getvalue() == "1/3\nkilled one\n2/3\n"


def test_server_runs_etcd_in_the_foreground_until_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "etcdq_v2", "server", "--data-dir", str(tmp_path / "data"),
         "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        warning = Lines(server.stderr).next(timeout=60)
        assert "for development and tests" in warning and "3.5.1" in warning
        url = Lines(server.stdout).next(timeout=60).strip()
        assert url == f"http://127.0.0.1:{port}"
        ok(run_etcdq(["--endpoints", url, "put", "q", "1"]))
        server.send_signal(signal.SIGINT)
        assert server.wait(BOUND) == 0
        assert not serves_v2(url)
    finally:
        server.kill()
        server.wait()


def test_demo_runs_end_to_end_on_an_embedded_etcd_in_a_bare_environment(
        tmp_path: Path) -> None:
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]),
           "HOME": str(tmp_path), "ETCDQ_ENDPOINTS": f"http://127.0.0.1:{free_port()}"}
    if "ETCDQ_ETCD_BIN" in os.environ:  # the tox matrix picks the etcd version
        env["ETCDQ_ETCD_BIN"] = os.environ["ETCDQ_ETCD_BIN"]
    began = time.monotonic()
    out = ok(run_etcdq(["demo"], env=env, cwd=tmp_path, timeout=120))
    assert time.monotonic() - began < 90
    etcd_pid = int(find(r"started a throwaway etcd at \S+ \(pid (\d+)\)", out).group(1))
    killed = find(r"SIGKILLed worker-\d \(pid \d+\) holding (.*?);", out).group(1)
    assert "Final stats: pending 0  running 0  completed 300  failed 0" in out
    assert "Each item completed exactly once: yes" in out
    reclaimed = int(find(r"Items reclaimed after the SIGKILL.*: (\d+)", out).group(1))
    assert reclaimed >= 1, killed
    find(r"300 items in [\d.]+ s = [\d.]+ items/s", out)
    wait_until(lambda: is_gone(etcd_pid), BOUND, message="the demo's etcd to be stopped")
