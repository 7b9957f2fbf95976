"""Lint and type checks, run by CI with the same settings as tox's lint and type envs."""
from __future__ import annotations

import configparser
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOX = configparser.ConfigParser(interpolation=None)
TOX.read(ROOT / "tox.ini")


def tox_command(env: str) -> list:
    return shlex.split(TOX[f"testenv:{env}"]["commands"].strip())


def run(command: list) -> subprocess.CompletedProcess:
    tool = str(Path(sys.executable).with_name(command[0]))
    return subprocess.run([tool, *command[1:]], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_ruff_finds_nothing() -> None:
    result = run(tox_command("lint"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_strict_finds_nothing() -> None:
    result = run(tox_command("type"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout
