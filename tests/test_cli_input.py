"""What a newcomer types at ``etcdq``: files and raw bytes as payloads, ids without their
leading zeros, numbers checked before anything is sent, a help text for every option, and
emptying a queue.  Subprocesses against a real etcd; state is checked through the API."""
from __future__ import annotations

import argparse
import json
import os
import pty
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator, List

import pytest

from etcdq_v2 import Queue
from etcdq_v2.cli import EXIT_FAILURE, EXIT_USAGE, build_parser

from test_cli import Run, assert_user_error, dead_on_failure, fail_items, ok, runner, take

PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"


#: test_cli's fixtures: etcdq on the shared etcd, and a queue with max_attempts=1.
etcdq = pytest.fixture(runner, name="etcdq")
queue = pytest.fixture(dead_on_failure, name="queue")


def pending(queue: Queue) -> List[object]:
    return [info.payload for info in queue.items("pending")]


# -- payloads from files and stdin ----------------------------------------------------------

def test_put_file_stores_the_files_bytes_as_one_payload(etcdq: Run, queue: Queue,
                                                        tmp_path: Path) -> None:
    image = tmp_path / "image.png"
    image.write_bytes(PNG)
    (item_id,) = ok(etcdq("put", queue.name, "--file", str(image))).split()
    assert queue.get(item_id).payload == PNG


def test_put_json_file_stores_the_document(etcdq: Run, queue: Queue, tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    job.write_text('{"to": "ada@example.com",\n "tries": [1, 2]}\n')
    ok(etcdq("put", queue.name, "--json-file", str(job)))
    assert pending(queue) == [{"to": "ada@example.com", "tries": [1, 2]}]


def test_put_raw_reads_stdin_whole_as_one_bytes_payload(etcdq: Run, queue: Queue) -> None:
    (item_id,) = ok(etcdq("put", queue.name, "--raw", input=PNG + b"\nsecond line\n")).split()
    assert queue.get(item_id.decode()).payload == PNG + b"\nsecond line\n"


def test_put_takes_arguments_then_files_then_stdin_in_that_order(
        etcdq: Run, queue: Queue, tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x00a")
    (tmp_path / "b.json").write_text("[1]")
    ok(etcdq("put", queue.name, "first", "--json-file", str(tmp_path / "b.json"), "--file",
             str(tmp_path / "a.bin"), "--raw", input=b"\xffz"))
    assert pending(queue) == ["first", b"\x00a", [1], b"\xffz"]


def test_bytes_on_a_line_of_stdin_name_the_options_that_take_bytes(etcdq: Run,
                                                                   queue: Queue) -> None:
    done = etcdq("put", queue.name, "-", input=PNG)
    assert done.returncode == EXIT_USAGE
    assert b"not UTF-8" in done.stderr and b"--raw" in done.stderr
    assert queue.stats()["pending"] == 0


@pytest.mark.parametrize("content, fragment", [
    (b"{not json", "not a JSON document"), (b"NaN", "NaN is not JSON"),
    (b"\xff\xfe", "not a JSON document")])
def test_a_json_file_that_is_not_json_exits_2_and_writes_nothing(
        etcdq: Run, queue: Queue, tmp_path: Path, content: bytes, fragment: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    assert_user_error(etcdq("put", queue.name, "ok", "--json-file", str(bad)), EXIT_USAGE,
                      str(bad), fragment)
    assert queue.stats()["pending"] == 0


def test_a_missing_file_or_stdin_read_twice_exits_2_and_writes_nothing(
        etcdq: Run, queue: Queue, tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    assert_user_error(etcdq("put", queue.name, "--file", str(missing)), EXIT_USAGE,
                      f"cannot read {missing}")
    assert_user_error(etcdq("put", queue.name, "-", "--raw", input="x\n"), EXIT_USAGE,
                      "not both")
    assert queue.stats()["pending"] == 0


# -- ids and numbers ---------------------------------------------------------------------

def test_ids_may_be_typed_without_their_leading_zeros(etcdq: Run, queue: Queue) -> None:
    item_id = queue.put("short id")
    short = str(int(item_id))
    shown = json.loads(ok(etcdq("show", queue.name, short, "--json")))
    assert (shown["id"], shown["payload"]) == (item_id, "short id")
    assert ok(etcdq("cancel", queue.name, short)).split()[0] == item_id
    waited = etcdq("wait", queue.name, short, "--timeout", "0")
    assert (waited.returncode, waited.stdout.split()[:2]) == (EXIT_FAILURE, [item_id, "failed"])
    new_id = ok(etcdq("requeue", queue.name, "0" + short)).split()[-1]
    assert queue.get(new_id).payload == "short id"


@pytest.mark.parametrize("typed", ["1" * 21, "-3", "12a", "0x10"])
def test_an_id_that_is_not_up_to_20_digits_exits_2(etcdq: Run, queue: Queue,
                                                   typed: str) -> None:
    assert_user_error(etcdq("show", queue.name, typed), EXIT_USAGE, "invalid item id")


@pytest.mark.parametrize("args", [
    ["ls", "QUEUE", "--limit", "-1"], ["ls", "QUEUE", "--limit", "0"],
    ["ls", "QUEUE", "--limit", "two"], ["put", "QUEUE", "x", "--in-flight", "0"],
    ["put", "QUEUE", "x", "--in-flight", "65"], ["wait", "QUEUE", "1", "--timeout", "-1"],
    ["wait", "QUEUE", "1", "--timeout", "nan"], ["stats", "QUEUE", "--interval", "0"],
    ["--request-timeout", "0", "stats", "QUEUE"],
    ["--request-timeout", "inf", "stats", "QUEUE"]], ids=" ".join)
def test_a_number_out_of_range_is_a_usage_error_and_sends_nothing(
        etcdq: Run, queue: Queue, args: List[str]) -> None:
    args = [queue.name if arg == "QUEUE" else arg for arg in args]
    done = etcdq(*args)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "expected a" in done.stderr and "Traceback" not in done.stderr
    assert queue.stats()["pending"] == 0


def parsers(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple]:
    """(path, parser) of the top parser and of every verb's, however deep."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, f"{path} {name}")


def test_every_option_and_argument_has_a_help_text() -> None:
    missing = [f"{path}: {'/'.join(action.option_strings) or action.dest}"
               for path, parser in parsers(build_parser(), "etcdq")
               for action in parser._actions
               if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
               and not (action.help or "").strip()]
    assert missing == []


# -- drop --------------------------------------------------------------------------------

def test_drop_pending_cancels_every_pending_item_and_leaves_the_rest(etcdq: Run,
                                                                     queue: Queue) -> None:
    fail_items(queue, 1)
    queue.put("done")
    take(queue).complete()
    running = queue.put("running")
    claim = take(queue)
    assert claim.id == running
    dropped = queue.put_many(["a", "b"]) + [queue.put("later", delay=300)]
    assert json.loads(ok(etcdq("drop", queue.name, "--pending", "--yes", "--json"))) == \
        {"cancelled": 3}
    assert sorted(info.id for info in queue.items("failed") if info.reason == "cancelled") \
        == sorted(dropped)
    assert queue.stats() == {"pending": 0, "running": 1, "completed": 1, "failed": 4}
    claim.complete()  # drop left it to finish
    assert queue.get(running).state == "completed"


def test_drop_without_a_terminal_refuses_unless_yes(etcdq: Run, queue: Queue) -> None:
    queue.put("kept")
    done = etcdq("drop", queue.name, "--pending", input="y\n")
    assert_user_error(done, EXIT_FAILURE, "--yes", "nothing cancelled")
    assert pending(queue) == ["kept"]
    assert_user_error(etcdq("drop", queue.name), EXIT_USAGE, "--pending")


def test_drop_asks_on_a_terminal_and_cancels_only_on_yes(etcd_url: str, queue: Queue) -> None:
    queue.put_many([1, 2])
    for answer, left in ((b"n\n", 2), (b"y\n", 0)):
        main, child = pty.openpty()
        process = subprocess.Popen(
            [sys.executable, "-m", "etcdq_v2", "drop", queue.name, "--pending"],
            stdin=child, stdout=subprocess.PIPE, stderr=child,
            env={**os.environ, "ETCDQ_ENDPOINTS": etcd_url})
        os.close(child)
        prompt = b""
        while b"[y/N]" not in prompt:
            prompt += os.read(main, 1024)
        assert f"Cancel the 2 pending item(s) of queue {queue.name}?".encode() in prompt
        os.write(main, answer)
        out, _ = process.communicate(timeout=60)
        os.close(main)
        assert process.returncode == (EXIT_FAILURE if left else 0)
        assert queue.stats()["pending"] == left
    assert out.decode().strip() == f"cancelled 2 pending item(s) of queue {queue.name}"


# -- import ------------------------------------------------------------------------------

@pytest.mark.parametrize("lines", [b'{"bad": 1}\n', b"not json\n", b"", b"\n\n"],
                         ids=["no state", "not json", "empty", "blank lines"])
def test_an_import_that_stores_nothing_leaves_no_queue_behind(
        etcdq: Run, etcd_url: str, queue_name: str, lines: bytes) -> None:
    done = etcdq("import", queue_name, input=lines)
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{etcd_url}/v2/keys/etcdq/{queue_name}", timeout=10)
    assert missing.value.code == 404  # not even the queue's directory
    assert b"None" not in done.stderr
    assert done.returncode == (0 if not lines.strip() else EXIT_USAGE), done.stderr


def test_a_bad_import_line_names_a_missing_field_as_missing_and_null_as_null(
        etcdq: Run, queue: Queue) -> None:
    missing = etcdq("import", queue.name, input='{"token": "t"}\n')
    assert_user_error(missing, EXIT_USAGE, "line 1: state missing")
    null = etcdq("import", queue.name, input='{"state": null}\n')
    assert_user_error(null, EXIT_USAGE, "line 1: state null")


# -- messages ----------------------------------------------------------------------------

@pytest.mark.parametrize("verb", ["show", "requeue", "cancel", "wait"])
def test_every_verb_names_the_queue_one_way(etcdq: Run, queue: Queue, verb: str) -> None:
    unknown = "9" * 20
    done = etcdq(verb, queue.name, unknown)
    assert done.returncode == 5, done.stderr
    line = done.stderr.strip().splitlines()[0]
    assert f"{unknown} in queue {queue.name}" in line and "/etcdq" not in line, line
