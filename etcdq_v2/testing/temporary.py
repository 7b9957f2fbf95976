"""A throwaway member in a temporary directory: ``etcdq demo``'s etcd, and the tests'."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

from ..etcd_binary import find_etcd_binary
from .member import EtcdServer
from .probe import answers_v2


class TemporaryEtcd(EtcdServer):
    """A single member in a temporary directory that :meth:`stop` also deletes."""

    def __init__(self, *, binary: Optional[str] = None) -> None:
        binary = binary or find_etcd_binary()  # before mkdtemp: no dir left on error
        self.temp_dir = Path(tempfile.mkdtemp(prefix="etcdq-etcd-"))
        super().__init__(self.temp_dir / "data", binary=binary)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop etcd and remove its data and log."""
        super().stop(timeout)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def ensure_etcd(endpoints: Union[str, Sequence[str]], *,
                binary: Optional[str] = None) -> Optional[TemporaryEtcd]:
    """Start a throwaway etcd unless one of ``endpoints`` already serves v2.

    Backs ``etcdq demo``, which should just work on a machine with no etcd
    running.  Returns the started server (the caller must ``stop()`` it and
    use its ``url``), or None when an existing etcd answered.
    """
    urls = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    if any(answers_v2(url.strip()) for url in urls if url.strip()):
        return None
    server = TemporaryEtcd(binary=binary)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server
