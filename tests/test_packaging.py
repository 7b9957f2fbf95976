"""The package as users get it: ``python -m build``, then a fresh virtualenv.

Builds an sdist and a wheel (the wheel from the sdist, as ``build`` does by
default, which also proves the sdist builds), installs the wheel with its
dependencies from the package index into a new virtualenv, and checks what
arrived: the ``etcdq`` command, the importable package with its ``py.typed``
marker, the metadata, and an sdist complete enough to run the tests.

The build runs on a copy of the source tree: building writes ``build/`` and
``*.egg-info`` into the tree, and a stale ``build/lib`` there would leak
deleted modules into the wheel. All tests share one build and one virtualenv,
and the whole module must finish within ``BUDGET_SECONDS``; a hung download
fails the test instead of stalling the run.
"""
from __future__ import annotations

import configparser
import importlib.metadata as importlib_metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path
from typing import List, NamedTuple, Sequence, Set, Union

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGE = "etcdq_v2"
BUDGET_SECONDS = 110.0  # for the whole module: under two minutes
# Not source: local caches, environments and build output. Copying a venv
# (.ci/run makes .venv in the tree) would also be slow.
NOT_SOURCE = (".git", ".tox", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__",
              "*.py[cod]", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis")
VERBS = ("put", "work", "stats", "ls", "show", "wait", "cancel", "requeue", "purge", "drop",
         "metrics", "dashboard", "export", "import", "server", "demo", "completion")
DASHBOARD_FILES = ("index.html", "app.js", "app.css")


class Budget:
    """One deadline shared by every command of this module."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def run(self, argv: Sequence[Union[str, Path]], cwd: Path) -> str:
        """Run ``argv`` in ``cwd`` within what is left; return its output, fail on an error."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            pytest.fail(f"out of time before {' '.join(map(str, argv))}")
        # No PYTHONPATH: the new environment must work on its own.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        try:
            done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, timeout=left,
                                  capture_output=True, text=True, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{' '.join(map(str, argv))} did not finish within the "
                        f"{BUDGET_SECONDS:g} s budget of {Path(__file__).name}")
        assert done.returncode == 0, (f"{' '.join(map(str, argv))} exited {done.returncode}:\n"
                                      f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done.stdout


class Dists(NamedTuple):
    source: Path  # the copy of the tree they were built from
    sdist: Path
    wheel: Path


@pytest.fixture(scope="module")
def budget() -> Budget:
    return Budget(BUDGET_SECONDS)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory, budget: Budget) -> Dists:
    # By distribution, not module: a setuptools build/ directory in the
    # working directory would pass for a `build` module.
    try:
        importlib_metadata.version("build")
    except importlib_metadata.PackageNotFoundError:
        pytest.fail("the `build` package is missing: pip install -e '.[test]'")
    work = tmp_path_factory.mktemp("packaging")
    source = work / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    out = work / "dist"
    budget.run([sys.executable, "-m", "build", "--outdir", out, source], cwd=work)
    sdists, wheels = sorted(out.glob("*.tar.gz")), sorted(out.glob("*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in out.iterdir())
    return Dists(source, sdists[0], wheels[0])


@pytest.fixture(scope="module")
def venv(dists: Dists, tmp_path_factory: pytest.TempPathFactory, budget: Budget) -> Path:
    """A new virtualenv with the wheel and its dependencies installed."""
    env = tmp_path_factory.mktemp("venv")
    budget.run([sys.executable, "-m", "venv", env], cwd=env)
    budget.run([env / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check",
                "--no-input", "--quiet", dists.wheel], cwd=env)
    return env


def wheel_metadata(wheel: Path) -> Message:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(archive.read(name).decode("utf-8"))


def source_version(root: Path) -> str:
    """The version etcdq_v2/_version.py defines in the tree at ``root``."""
    found: dict = {}
    exec((root / PACKAGE / "_version.py").read_text(encoding="utf-8"), found)
    return str(found["__version__"])


def files_under(root: Path, folder: str) -> Set[str]:
    """Source files below ``root/folder``, relative to ``root``, minus caches."""
    return {p.relative_to(root).as_posix() for p in (root / folder).rglob("*")
            if p.is_file() and not any(part in ("__pycache__", ".hypothesis")
                                       for part in p.parts)}


def tox_pythons() -> List[str]:
    """The Python versions of tox.ini's matrix, e.g. ["3.8", ..., "3.13"]."""
    config = configparser.ConfigParser(interpolation=None)
    config.read(REPO / "tox.ini", encoding="utf-8")
    match = re.search(r"py\{([\d,]+)\}", config["tox"]["env_list"])
    assert match, "tox.ini's env_list has no py{...} factor"
    return [f"{v[0]}.{v[1:]}" for v in match.group(1).split(",")]


# --------------------------------------------------------------------------
# What the distributions contain
# --------------------------------------------------------------------------

def test_wheel_holds_the_whole_package_and_nothing_else(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as archive:
        names = set(archive.namelist())
    top_level = {name.split("/")[0] for name in names}
    # tests/, docs/ or bench/ here would be installed as top-level packages.
    assert {t for t in top_level if not t.endswith(".dist-info")} == {PACKAGE}
    modules = {n for n in files_under(dists.source, PACKAGE) if n.endswith(".py")}
    assert modules <= names, f"modules missing from the wheel: {sorted(modules - names)}"
    # The marker that lets users' type checkers read the package's hints.
    assert f"{PACKAGE}/py.typed" in names
    # The dashboard's page, script and style, which it serves from the package.
    static = files_under(dists.source, f"{PACKAGE}/dashboard/static")
    assert {f"{PACKAGE}/dashboard/static/{name}" for name in DASHBOARD_FILES} <= static
    assert static <= names, f"dashboard files missing from the wheel: {sorted(static - names)}"


def test_wheel_metadata_describes_the_project(dists: Dists) -> None:
    meta = wheel_metadata(dists.wheel)
    assert meta["Name"] == PACKAGE
    assert meta["Version"] == source_version(dists.source)  # the one definition
    assert "MIT" in (meta.get("License-Expression") or meta.get("License") or "")
    assert meta["Requires-Python"] == ">=3.8"
    # The README is the long description, rendered as Markdown on the index.
    assert meta["Description-Content-Type"] == "text/markdown"
    readme = (dists.source / "README.md").read_text(encoding="utf-8")
    assert str(meta.get_payload()).strip() == readme.strip()
    classifiers = set(meta.get_all("Classifier") or [])
    assert "Typing :: Typed" in classifiers
    # Claim exactly the Pythons the tox matrix tests, and only those.
    claimed = {c.rsplit(" :: ", 1)[1] for c in classifiers
               if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)}
    assert claimed == set(tox_pythons())


def test_wheel_declares_the_console_script(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt"))
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(name).decode("utf-8"))
    assert entry_points["console_scripts"]["etcdq"].replace(" ", "") == f"{PACKAGE}.cli:main"


def test_sdist_carries_the_docs_and_tests(dists: Dists) -> None:
    with tarfile.open(dists.sdist) as archive:
        root = archive.getnames()[0].split("/")[0]
        names = {n[len(root) + 1:] for n in archive.getnames()}
    expected = {"README.md", "CHANGELOG.md", "setup.py", "pyproject.toml", "tox.ini"}
    expected |= files_under(dists.source, "docs") | files_under(dists.source, "tests")
    assert any(n.startswith("docs/") for n in expected), "the source tree has no docs/"
    # conftest.py and helpers.py too, so that the unpacked sdist runs its tests.
    assert expected <= names, f"missing from the sdist: {sorted(expected - names)}"


def test_pyproject_holds_only_the_build_system() -> None:
    # The metadata stays in setup.py; pyproject.toml only spares pip the
    # deprecated setup.py fallback (setup.py develop for -e).
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert re.findall(r"(?m)^\s*\[+([^\]]+)\]", text) == ["build-system"]
    assert re.search(r'(?m)^build-backend\s*=\s*"setuptools\.build_meta"$', text)


# --------------------------------------------------------------------------
# The installed package
# --------------------------------------------------------------------------

def test_installed_command_runs(venv: Path, budget: Budget) -> None:
    usage = budget.run([venv / "bin" / "etcdq", "--help"], cwd=venv)
    assert usage.startswith("usage: etcdq")
    assert all(re.search(rf"\b{verb}\b", usage) for verb in VERBS), usage
    shown = budget.run([venv / "bin" / "etcdq", "--version"], cwd=venv)
    assert shown.strip() == f"etcdq {source_version(REPO)}"


def test_installed_package_imports_from_the_virtualenv(venv: Path, budget: Budget) -> None:
    # Run from the venv, not the repository, so the source tree cannot be
    # what gets imported.
    where = budget.run([venv / "bin" / "python", "-c",
                        f"import {PACKAGE}; print({PACKAGE}.__file__)"], cwd=venv)
    package_dir = Path(where.strip()).parent
    assert venv.resolve() in package_dir.resolve().parents, package_dir
    assert (package_dir / "py.typed").is_file()
    # The installed dashboard finds its page where it serves it from.
    static = Path(budget.run([venv / "bin" / "python", "-c", "from etcdq_v2.dashboard.server "
                              "import STATIC; print(STATIC)"], cwd=venv).strip())
    assert package_dir in static.parents
    assert all((static / name).is_file() for name in DASHBOARD_FILES)
    usage = budget.run([venv / "bin" / "python", "-m", PACKAGE, "--help"], cwd=venv)
    assert "usage:" in usage
