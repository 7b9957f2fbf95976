"""One version: etcdq_v2/_version.py defines it; setup.py, ``etcdq --version`` and
CHANGELOG.md show that one.  (The built wheel's metadata: tests/test_packaging.py.)"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import etcdq_v2
from etcdq_v2._version import __version__

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
#: A PEP 440 release, or a development version on the way to one.
VERSION = re.compile(r"(\d+\.\d+\.\d+)(\.dev\d+)?")


def test_the_version_is_a_release_or_a_development_version_of_one() -> None:
    assert VERSION.fullmatch(__version__), __version__
    assert etcdq_v2.__version__ == __version__


def test_setup_py_reads_the_one_definition() -> None:
    done = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == __version__
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert not VERSION.search(setup.split("setup(", 1)[1].split("version=", 1)[1][:40])


def test_etcdq_version_shows_it() -> None:
    done = subprocess.run([sys.executable, "-m", "etcdq_v2", "--version"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == f"etcdq {__version__}"


def sections() -> list:
    return re.findall(r"(?m)^## \[([^\]]+)\]", CHANGELOG)


def test_the_changelog_keeps_one_unreleased_section_on_top_and_names_the_version() -> None:
    names = sections()
    assert names[0] == "Unreleased" and names.count("Unreleased") == 1
    release, dev = VERSION.fullmatch(__version__).groups()  # type: ignore[union-attr]
    if dev:  # main, on its way to the release
        top = CHANGELOG.split("## [Unreleased]", 1)[1].split("\n## [", 1)[0]
        assert f"To be released as {release}." in top and __version__ in CHANGELOG
        assert release not in names  # not yet released
    else:
        assert names[1] == release
    assert all(VERSION.fullmatch(name) for name in names[1:]), names


def test_the_readme_holds_no_changelog() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert not re.search(r"(?im)^#+ changelog", readme)
    assert "(unreleased)" not in readme.lower()
    assert "CHANGELOG.md" in readme
