"""What a command run by ``etcdq work`` sees and may do: the environment without etcdq's
secrets (unless passed on), its output read up to the payload limit only, and its stderr
logged as one escaped line (it cannot forge log lines)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, Iterator

import pytest

from etcdq_v2 import Queue
from etcdq_v2.command import CommandHandler
from etcdq_v2.worker import Worker

#: etcdq's secrets: etcd's password and TLS key, the dashboard's token, and their files.
SECRETS = {"ETCDQ_PASSWORD", "ETCDQ_PASSWORD_FILE", "ETCDQ_KEY", "ETCDQ_DASHBOARD_TOKEN",
           "ETCDQ_DASHBOARD_TOKEN_FILE"}
PRINT_ENV = "import json, os, sys; json.dump(dict(os.environ), sys.stdout)"


@pytest.fixture
def queue(etcd_url: str, queue_name: str) -> Iterator[Queue]:
    with Queue(etcd_url, queue_name, max_attempts=1) as q:
        yield q


def _etcdq(etcd_url: str, *args: str, env: Dict[str, str]
           ) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "etcdq_v2", *args], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "ETCDQ_ENDPOINTS": etcd_url, **env})


def _run_one(queue: Queue, handler: CommandHandler, **options: Any) -> None:
    worker = Worker(queue, handler, install_signal_handlers=False, **options)
    try:
        worker.run(until_empty=True)
    finally:
        worker.close()


def test_a_command_never_sees_the_libraries_secrets(queue: Queue,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in sorted(SECRETS):
        monkeypatch.setenv(name, f"secret of {name}")
    monkeypatch.setenv("ETCDQ_SOMETHING_ELSE", "kept")
    item_id = queue.put({"n": 1})
    _run_one(queue, CommandHandler([sys.executable, "-c", PRINT_ENV]))
    seen = queue.get(item_id).result
    assert not SECRETS & set(seen)
    assert seen["ETCDQ_SOMETHING_ELSE"] == "kept" and seen["ETCDQ_ITEM_ID"] == item_id


def test_work_passes_a_secret_on_only_when_asked(etcd_url: str, queue: Queue) -> None:
    first, second = queue.put(1), queue.put(2)
    env = {"ETCDQ_DASHBOARD_TOKEN": "t" * 32, "ETCDQ_DASHBOARD_TOKEN_FILE": "/somewhere"}
    done = _etcdq(etcd_url, "work", queue.name, "--max-items", "1", "--",
                  sys.executable, "-c", PRINT_ENV, env=env)
    assert done.returncode == 0, done.stderr
    done = _etcdq(etcd_url, "work", queue.name, "--max-items", "1",
                  "--pass-env", "ETCDQ_DASHBOARD_TOKEN", "--", sys.executable, "-c", PRINT_ENV,
                  env=env)
    assert done.returncode == 0, done.stderr
    without, passed = queue.get(first).result, queue.get(second).result
    assert "ETCDQ_DASHBOARD_TOKEN" not in without and "ETCDQ_DASHBOARD_TOKEN_FILE" not in without
    assert passed["ETCDQ_DASHBOARD_TOKEN"] == "t" * 32
    assert "ETCDQ_DASHBOARD_TOKEN_FILE" not in passed


def test_a_failure_reason_is_logged_as_one_escaped_line(etcd_url: str, queue: Queue) -> None:
    forge = ("import sys; sys.stderr.write('bad\\n2026-12-01 00:00:00 INFO item 1 forged"
             "\\r\\x1b[2Khidden\\u2028more'); sys.exit(3)")
    item_id = queue.put(1)
    done = _etcdq(etcd_url, "work", queue.name, "--until-empty", "--max-attempts", "1", "--",
                  sys.executable, "-c", forge, env={})
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if "forged" in line]
    assert len(lines) == 1 and "failed and dead-lettered: " in lines[0], done.stderr
    assert "bad\\n2026" in lines[0] and "\\r\\x1b[2Khidden\\u2028more" in lines[0]
    assert "\x1b" not in done.stderr and "\u2028" not in done.stderr
    # Stored as written: the record keeps the command's own text.
    assert queue.get(item_id).reason.endswith("INFO item 1 forged\r\x1b[2Khidden\u2028more")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_command_writing_more_than_the_limit_is_stopped_and_fails(
        queue: Queue, stream: str) -> None:
    """It writes 3 MiB, then would sleep a minute: stopped at once, its item failed with
    "result too large" (nothing over the limit is read, stored or retried)."""
    write = (f"import sys, time; sys.{stream}.buffer.write(b'x' * (3 << 20)); "
             f"sys.{stream}.flush(); time.sleep(60)")
    item_id = queue.put(1)
    began = time.monotonic()
    _run_one(queue, CommandHandler([sys.executable, "-c", write]),
             item_timeout=50)
    info = queue.get(item_id)
    assert time.monotonic() - began < 40  # stopped, not timed out
    assert info.state == "failed" and "result too large" in (info.reason or ""), info.reason
    assert len(json.dumps(info.reason)) < 1000


def test_work_fails_an_item_whose_result_is_over_the_limit(etcd_url: str,
                                                           queue: Queue) -> None:
    item_id = queue.put(1)
    done = _etcdq(etcd_url, "work", queue.name, "--until-empty", "--max-attempts", "1", "--",
                  sys.executable, "-c", "print('x' * 3000000)", env={})
    assert done.returncode == 1, done.stderr
    info = queue.get(item_id)
    assert info.state == "failed" and "result too large" in (info.reason or "")
    assert queue.stats()["completed"] == 0
