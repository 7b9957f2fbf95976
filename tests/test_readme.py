"""Every code sample of README.md and of the docs pages it sends a newcomer to runs, as
written, on an etcd that already holds other queues and the leftovers of earlier runs of
the same samples: so the README cannot rot, and no sample needs an empty etcd."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from etcdq_v2 import Queue

from test_security import MINIMAL_ROLE

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: The pages the README's samples moved to (reference material), tested as the README is.
PAGES = [README] + [ROOT / "docs" / name for name in (
    "api.md", "cli.md", "configuration.md", "metrics.md", "dashboard.md",
    "leaving-etcd-v2.md", "performance.md")]
BLOCK = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.S | re.M)
DEFAULT_ENDPOINT = "http://127.0.0.1:2379"
#: The queue names the samples use, which earlier runs and other users leave behind.
USED_NAMES = ("emails", "newsletters", "jobs", "reminders", "urgent", "bulk")


def blocks(language: str, page: Path = README) -> List[str]:
    text = page.read_text(encoding="utf-8")
    return [re.sub(r"(?m)^" + indent, "", body)
            for indent, lang, body in BLOCK.findall(text) if lang == language]


def samples(language: str) -> List[Tuple[str, int]]:
    """(page, number) of every ``language`` block of the pages."""
    return [(page.relative_to(ROOT).as_posix(), number)
            for page in PAGES for number in range(len(blocks(language, page)))]


@pytest.fixture
def used_etcd(etcd_url: str) -> Iterator[str]:
    """The shared etcd, holding what a used one holds: under the samples' queue names and
    another queue, a pending item, a completion record, a dead letter and a running item."""
    queues = [Queue(etcd_url, name, max_attempts=1) for name in USED_NAMES + ("other-team",)]
    try:
        for queue in queues:
            queue.put_many([{"left": "by an earlier run"}, "failed", "running", "pending"])
            for settle in (lambda c: c.complete("an earlier result"),
                           lambda c: c.fail("an earlier failure"), lambda c: None):
                claim = queue.claim(timeout=10)
                assert claim is not None
                settle(claim)
        yield etcd_url
    finally:
        for queue in queues:
            queue.close()


def test_the_first_screen_has_the_two_commands_and_ci_runs_the_test_command() -> None:
    first_screen = "\n".join(README.read_text(encoding="utf-8").splitlines()[:25])
    demo, tests = blocks("sh")[:2]
    assert demo.strip() in first_screen and tests.strip() in first_screen
    assert demo.strip().endswith("etcdq demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci.splitlines()


def test_the_readme_runs_only_samples_this_file_tests() -> None:
    """Beyond the two first commands (the demo: test_cli's demo test; the tests: CI),
    every block of the README is Python or a console session, both run below."""
    languages = [lang for _, lang, _ in BLOCK.findall(README.read_text(encoding="utf-8"))]
    assert languages[:2] == ["sh", "sh"]
    assert set(languages[2:]) <= {"python", "console"}, languages


@pytest.mark.parametrize("page, number", samples("python"), ids=lambda v: str(v))
def test_python_samples_run_twice_on_a_used_etcd(page: str, number: int, used_etcd: str,
                                                 tmp_path: Path) -> None:
    code = blocks("python", ROOT / page)[number].replace(DEFAULT_ENDPOINT, used_etcd)
    script = tmp_path / "sample.py"
    script.write_text(code)
    for run in (1, 2):  # the second run meets the first run's queues
        result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                                timeout=120, cwd=tmp_path)
        assert result.returncode == 0, f"run {run}:\n{result.stderr}"


def console_lines(block: str) -> Iterator[List[str]]:
    for line in block.splitlines():
        assert line.startswith("$ "), line
        yield shlex.split(line[2:], comments=True)


@pytest.mark.parametrize("number", range(len(blocks("console"))))
def test_console_samples_run_twice_on_a_used_etcd(number: int, used_etcd: str) -> None:
    etcdq = str(Path(sys.executable).with_name("etcdq"))
    env = {**os.environ, "ETCDQ_ENDPOINTS": used_etcd}
    for run in (1, 2):
        outputs: Dict[str, str] = {}
        for command in console_lines(blocks("console")[number]):
            assert command[0] == "etcdq"
            result = subprocess.run([etcdq, *command[1:]], capture_output=True, text=True,
                                    env=env, timeout=120)
            assert result.returncode == 0, (run, command, result.stderr)
            outputs[command[1] if command[1] != "--json" else command[2]] = result.stdout
        # What this run put was done, whatever the queue held before (an item a crashed
        # worker held, which comes back, may be done too).
        if "work" in outputs:
            put = outputs["put"].split()
            with Queue(used_etcd, "jobs") as jobs:
                assert [jobs.get(item_id).state for item_id in put] == ["completed"] * 3
            assert set(json.loads(outputs["stats"])) == {"pending", "running", "completed",
                                                         "failed", "delayed"}


def test_the_documented_role_is_the_one_the_auth_test_uses() -> None:
    assert json.loads(blocks("json", ROOT / "docs" / "configuration.md")[0]) == MINIMAL_ROLE


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_point_to_files_that_exist(page: Path) -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", page.read_text(encoding="utf-8")):
        if not re.match(r"[a-z]+://", target):
            assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_every_section_the_readme_had_is_still_reachable() -> None:
    """The reference material moved to docs/ pages: each is linked from the README."""
    text = README.read_text(encoding="utf-8")
    for page in PAGES[1:]:
        assert f"](docs/{page.name})" in text, page.name
