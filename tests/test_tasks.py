"""Tasks as functions: calls put by ``.delay()`` and run by real worker processes.

The tasks module is written to a temporary directory and imported twice, as a
user's would be: here by the producer (the test), and by a worker process
(``etcdq work QUEUE --tasks app_tasks:tasks``, or a script that builds
``Worker(queue, tasks=tasks)``) started in that directory, against a real etcd.
"""
from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

from etcdq_v2 import (ConfigError, InvalidArgument, InvalidPayload, Queue, Retry, TaskFailed,
                      Tasks, WaitTimeout, Worker)

BOUND = 30.0

TASKS = '''
import os
import re
import signal
from etcdq_v2 import Queue, Retry, Tasks, current_task

tasks = Tasks(Queue(os.environ["ETCDQ_ENDPOINTS"], os.environ["TASKS_QUEUE"]))

@tasks.task
def add(a, b=0):
    return a + b

@tasks.task(max_attempts=1)
def divide(a, b):
    return a / b

@tasks.task
def flaky(succeed_at):
    attempt = current_task().claim.attempt
    if attempt < succeed_at:
        raise Retry(delay=1, reason=f"not yet at attempt {attempt}")
    return {"attempt": attempt}

@tasks.task(name="greet", delay=1)
def hello(name):
    return "hello " + name
'''

#: A worker script of the user's own: Worker(queue, tasks=tasks), run until empty.
WORKER_SCRIPT = '''
from etcdq_v2 import Worker
from app_tasks import tasks

print(Worker(tasks.queue, tasks=tasks, install_signal_handlers=False).run(until_empty=True))
'''


@pytest.fixture
def app(tmp_path: Path, etcd_url: str, queue_name: str,
        monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The tasks module ``app_tasks``, imported here as the producer imports it."""
    (tmp_path / "app_tasks.py").write_text(TASKS)
    (tmp_path / "worker_script.py").write_text(WORKER_SCRIPT)
    monkeypatch.setenv("ETCDQ_ENDPOINTS", etcd_url)
    monkeypatch.setenv("TASKS_QUEUE", queue_name)
    spec = importlib.util.spec_from_file_location("app_tasks", tmp_path / "app_tasks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    module.tasks.queue.close()


def work(app: ModuleType, *options: str) -> "subprocess.CompletedProcess[str]":
    """``etcdq work QUEUE --tasks app_tasks:tasks OPTIONS`` in the tasks' directory."""
    return subprocess.run(
        [sys.executable, "-m", "etcdq_v2", "work", app.tasks.queue.name, "--tasks",
         "app_tasks:tasks", *options], capture_output=True, text=True, timeout=90,
        cwd=Path(app.__file__).parent, env=dict(os.environ))


def test_a_call_runs_in_a_worker_process_and_wait_returns_its_result(app: ModuleType) -> None:
    item_id = app.add.delay(2, b=3)
    done = work(app, "--until-empty")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[:2] == ["completed", "1"]
    assert app.add.wait(item_id, BOUND) == 5
    assert app.tasks.queue.get(item_id).payload == {"task": "app_tasks.add", "args": [2],
                                                    "kwargs": {"b": 3}}


def test_a_worker_given_tasks_runs_them_by_name(app: ModuleType) -> None:
    ids = [app.add.delay(n, n) for n in range(3)]
    done = subprocess.run([sys.executable, "worker_script.py"], capture_output=True, text=True,
                          timeout=90, cwd=Path(app.__file__).parent, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "completed 3  attempts failed 0  dead-lettered 0" in done.stdout
    assert [app.tasks.wait(item_id, BOUND) for item_id in ids] == [0, 2, 4]


def test_an_unknown_task_is_dead_lettered_at_once_not_retried(app: ModuleType) -> None:
    queue: Queue = app.tasks.queue
    assert queue.max_attempts == 10
    item_id = queue.put({"task": "app_tasks.missing", "args": [1]})
    done = work(app, "--until-empty")
    assert done.returncode == 1
    assert "dead-lettered 1" in done.stdout
    info = queue.get(item_id)
    assert (info.state, info.attempts) == ("failed", 1)
    assert info.reason is not None and "unknown task app_tasks.missing" in info.reason
    with pytest.raises(TaskFailed, match="unknown task app_tasks.missing") as failed:
        app.tasks.wait(item_id, BOUND)
    assert failed.value.item_id == item_id


def test_arguments_that_do_not_bind_are_dead_lettered_at_once(app: ModuleType) -> None:
    queue: Queue = app.tasks.queue
    extra = queue.put({"task": "app_tasks.add", "args": [1, 2, 3], "kwargs": {}})
    unknown = queue.put({"task": "app_tasks.add", "args": [1], "kwargs": {"c": 1}})
    not_a_call = queue.put("just a string")
    work(app, "--until-empty")
    for item_id in (extra, unknown):
        info = queue.get(item_id)
        assert (info.state, info.attempts) == ("failed", 1)
        assert info.reason is not None and "arguments do not fit task app_tasks.add(a, b=0)" \
            in info.reason
    assert "not a task call" in (queue.get(not_a_call).reason or "")


def test_delay_refuses_arguments_that_do_not_bind_before_storing(app: ModuleType) -> None:
    with pytest.raises(InvalidArgument, match="do not fit task app_tasks.add"):
        app.add.delay(1, 2, 3)
    assert app.tasks.queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 0}


def test_non_json_arguments_raise_invalid_payload_before_anything_is_stored(
        app: ModuleType) -> None:
    for bad in (object(), b"bytes", float("nan"), {1j: 2}):
        with pytest.raises(InvalidPayload, match="arguments of task app_tasks.add"):
            app.add.delay(bad)
    assert app.tasks.queue.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 0}
    assert app.tasks.queue.items() == []


def test_a_task_raising_retry_runs_again_after_its_delay(app: ModuleType) -> None:
    item_id = app.flaky.delay(2)
    done = work(app, "--max-items", "2")
    assert done.returncode == 1, done.stderr  # an attempt failed
    assert "completed 1  attempts failed 1  dead-lettered 0" in done.stdout
    assert app.flaky.wait(item_id, BOUND) == {"attempt": 2}


def test_retry_counts_as_an_attempt_so_max_attempts_ends_it(app: ModuleType) -> None:
    item_id = app.flaky.delay(5)
    done = work(app, "--max-items", "2", "--max-attempts", "2")
    assert "attempts failed 1  dead-lettered 1" in done.stdout
    info = app.tasks.queue.get(item_id)
    assert (info.state, info.attempts, info.reason) == ("failed", 2, "not yet at attempt 2")


def test_a_failing_task_is_dead_lettered_with_its_traceback(app: ModuleType) -> None:
    item_id = app.divide.delay(1, 0)  # the task's own max_attempts=1, the queue's 10
    work(app, "--until-empty")
    with pytest.raises(TaskFailed, match="ZeroDivisionError") as failed:
        app.divide.wait(item_id, BOUND)
    assert failed.value.traceback is not None
    assert "in divide" in failed.value.traceback and "return a / b" in failed.value.traceback
    assert failed.value.traceback.rstrip().endswith("ZeroDivisionError: division by zero")
    assert failed.value.traceback.splitlines()[1].endswith("in divide")  # no runner frames
    assert app.tasks.queue.get(item_id).attempts == 1


def test_task_options_name_and_delay(app: ModuleType) -> None:
    assert app.hello.name == "greet" and "greet" in app.tasks
    assert app.add.name == "app_tasks.add"
    item_id = app.hello.delay("ada")
    assert app.tasks.queue.get(item_id).due is not None  # held back by the task's delay
    assert app.hello("here") == "hello here"  # still an ordinary function


def test_wait_raises_wait_timeout_when_nothing_runs_the_call(app: ModuleType) -> None:
    item_id = app.add.delay(1)
    with pytest.raises(WaitTimeout):
        app.add.wait(item_id, 0.2)
    assert isinstance(WaitTimeout("x"), TimeoutError)


def test_registration_mistakes_are_config_errors(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        tasks = Tasks(queue)

        @tasks.task
        def twice() -> None:
            """A task registered once."""

        with pytest.raises(ConfigError, match="registered already"):
            tasks.task(twice.function)
        with pytest.raises(ConfigError, match="max_attempts"):
            tasks.task(max_attempts=0)
        with pytest.raises(InvalidArgument, match="delay"):
            tasks.task(delay=-1)
        with pytest.raises(InvalidArgument, match="delay"):
            Retry(delay=-1)
        with pytest.raises(ConfigError, match="either a handler or tasks"):
            Worker(queue, print, tasks=tasks)
        with pytest.raises(InvalidArgument, match="no task nothing"):
            tasks.enqueue("nothing")
        assert twice.__doc__ == "A task registered once."


def test_work_names_a_tasks_object_it_cannot_load(app: ModuleType) -> None:
    for spec, message in (("app_tasks", "MODULE:NAME"), ("no_such_module:tasks", "cannot import"),
                          ("app_tasks:add", "is not an etcdq_v2.Tasks")):
        done = subprocess.run(
            [sys.executable, "-m", "etcdq_v2", "work", app.tasks.queue.name, "--tasks", spec],
            capture_output=True, text=True, timeout=60, cwd=Path(app.__file__).parent,
            env=dict(os.environ))
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and "Traceback" not in done.stderr


DOCS = Path(__file__).resolve().parent.parent / "docs" / "tasks.md"


def test_the_docs_producer_and_worker_run_as_written(tmp_path: Path, etcd_url: str,
                                                     queue_name: str) -> None:
    """docs/tasks.md's tasks.py and producer.py, on this test's etcd and queue, with
    its ``etcdq work`` command running beside them."""
    text = DOCS.read_text(encoding="utf-8")
    python = re.findall(r"```python\n(.*?)```", text, re.S)
    shell = re.findall(r"```sh\n(.*?)```", text, re.S)
    tasks_py, producer_py = python[0], python[1]
    (tmp_path / "tasks.py").write_text(tasks_py.replace("http://127.0.0.1:2379", etcd_url)
                                       .replace('"emails"', repr(queue_name)))
    (tmp_path / "producer.py").write_text(producer_py)
    command = shell[0].split()
    assert command[:4] == ["etcdq", "work", "emails", "--tasks"]
    worker = subprocess.Popen(
        [sys.executable, "-m", "etcdq_v2", "--endpoints", etcd_url, "work", queue_name,
         *command[3:]], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        done = subprocess.run([sys.executable, "producer.py"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=90)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1] == "{'sent_to': 'ada@example.com'}"
    assert worker.returncode == 0, err
    assert out.split()[:2] == ["completed", "1"]
