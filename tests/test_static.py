"""Lint and type checks, run by CI with the same settings as tox's lint and type envs."""
from __future__ import annotations

import ast
import configparser
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Set, Tuple

import pytest

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


# --------------------------------------------------------------------------
# Layers: the library core imports neither the CLI nor the test harness
# --------------------------------------------------------------------------

PACKAGE = ROOT / "etcdq_v2"
#: What the harness (etcdq_v2.testing) may use of etcdq: it must not depend on
#: the client code it is there to test.
HARNESS_MAY_USE = {"etcdq_v2.errors", "etcdq_v2.etcd_binary", "etcdq_v2.signals"}


def etcdq_imports(path: Path) -> Tuple[str, Set[str]]:
    """The module at ``path`` (dotted), and the etcdq_v2 modules it imports (absolute)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1]
    if parts[-1] == "__init__":
        parts = package
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            found.add(target)
            if not node.module:  # from . import cli: maybe a module
                found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return ".".join(parts), {name for name in found if name.split(".")[0] == "etcdq_v2"}


def layer(module: str) -> str:
    """core (the library), server (its old name for the harness), testing, sim (the
    simulator, etcdq_v2.testing.sim, which drives the library), or cli (the top)."""
    parts = module.split(".") + ["", ""]
    if parts[1] == "__main__":
        return "cli"
    if parts[1:3] == ["testing", "sim"]:
        return "sim"
    return parts[1] if parts[1] in ("cli", "testing", "server") else "core"


#: The core without I/O, and the only etcdq_v2 modules each may import: the
#: steps reach etcd, the clock and tokens through their driver only; the view's
#: state machine is fed events and the time and returns what to do.
NO_IO = {"etcdq_v2.steps": {"etcdq_v2.codec", "etcdq_v2.errors", "etcdq_v2.keys",
                            "etcdq_v2.versions"},
         "etcdq_v2.viewstate": {"etcdq_v2.codec", "etcdq_v2.keys", "etcdq_v2.versions"},
         "etcdq_v2.versions": set()}
#: What a module without I/O never imports (sockets, threads, clocks, randomness).
IO_MODULES = {"socket", "ssl", "selectors", "asyncio", "threading", "_thread", "time",
              "random", "secrets", "http", "urllib", "subprocess", "multiprocessing",
              "concurrent", "queue"}


def stdlib_imports(path: Path) -> Set[str]:
    """The top-level names of the absolute imports of the module at ``path``."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found


@pytest.mark.parametrize("module", sorted(NO_IO))
def test_the_core_without_io_imports_no_transport_runtime_socket_thread_or_clock(
        module: str) -> None:
    path = PACKAGE / f"{module.split('.', 1)[1]}.py"
    name, imports = etcdq_imports(path)
    assert name == module
    assert imports <= NO_IO[module], imports - NO_IO[module]
    assert not stdlib_imports(path) & IO_MODULES


def test_each_layer_imports_only_from_below() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module, imports = etcdq_imports(path)
        for imported in imports:
            if layer(module) == "core" and layer(imported) != "core":
                wrong.append(f"{module} imports {imported}")
            if layer(module) == "testing" and layer(imported) != "testing" and \
                    not any(imported.startswith(allowed) for allowed in HARNESS_MAY_USE):
                wrong.append(f"{module} imports {imported}")
            if layer(module) == "sim" and layer(imported) == "cli":
                wrong.append(f"{module} imports {imported}")
    assert not wrong, "\n".join(wrong)
