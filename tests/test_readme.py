"""Every command and code sample in README.md runs, so the README cannot rot."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from test_security import MINIMAL_ROLE

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCK = re.compile(r"^( *)```(\w+)\n(.*?)^\1```", re.S | re.M)


def blocks(language: str) -> list:
    return [re.sub(r"(?m)^" + indent, "", body)
            for indent, lang, body in BLOCK.findall(README) if lang == language]


def test_the_first_screen_has_the_two_commands_and_ci_runs_the_test_command() -> None:
    first_screen = "\n".join(README.splitlines()[:25])
    demo, tests = blocks("sh")[:2]
    assert demo.strip() in first_screen and tests.strip() in first_screen
    assert demo.strip().endswith("etcdq demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip() in ci.splitlines()


@pytest.mark.parametrize("number", range(len(blocks("python"))))
def test_python_samples_run(number: int, etcd_url: str, queue_name: str, tmp_path: Path) -> None:
    code = blocks("python")[number].replace("http://127.0.0.1:2379", etcd_url)
    for name in ("emails", "newsletters"):
        code = code.replace(f'"{name}"', f'"{queue_name}-{name}"')
    script = tmp_path / "sample.py"
    script.write_text(code)
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_console_samples_run(etcd_url: str, queue_name: str) -> None:
    etcdq = str(Path(sys.executable).with_name("etcdq"))
    env = {**os.environ, "ETCDQ_ENDPOINTS": etcd_url}
    outputs = []
    for line in blocks("console")[0].splitlines():
        command = shlex.split(line.lstrip("$ ").replace(" jobs", f" {queue_name}"))
        assert command[0] == "etcdq"
        result = subprocess.run([etcdq, *command[1:]], capture_output=True, text=True,
                                env=env, timeout=120)
        assert result.returncode == 0, (line, result.stderr)
        outputs.append(result.stdout)
    assert json.loads(outputs[-1])["completed"] == 3


def test_the_documented_role_is_the_one_the_auth_test_uses() -> None:
    assert json.loads(blocks("json")[0]) == MINIMAL_ROLE


def test_links_point_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        assert (ROOT / target).exists(), target
