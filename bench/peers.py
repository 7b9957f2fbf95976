"""Baseline queues ("peers") that etcdq_v2 is compared with.  Not part of etcdq_v2.

Each peer is written the way a typical user would write it from a tutorial:
python-etcd (or Kazoo) used directly, no tuning, no clever tricks.  They are
baselines for the benchmark, NOT recommended designs, and they are not safe:

* :class:`MutexQueue` - one global lock key around "list work/, take the
  first item, delete it".  Consumers are serialised by the mutex, and an item
  is deleted before it is processed, so a crashed consumer loses it.
* :class:`LiteralQueue` - the directory-lock design taken literally: list
  work/ on every claim, walk the listing, lock the first unlocked item with
  a TTL key, process, write completed/<id>, delete work/<id> and the lock.
  A listing taken before another consumer finished an item lets a consumer
  lock that finished item and run it again; the benchmark counts how often.
* :class:`KazooQueue` - Kazoo's ``LockingQueue`` recipe on ZooKeeper.

All three offer the interface the benchmark drives (see bench/designs.py):
``put_many``, ``claim`` (take the next item; None when none is free),
``finish`` (mark the claimed item done), ``requests`` and ``lock_failures``.
Processing itself is a no-op: the benchmark measures the queue, not the work.
"""
from __future__ import annotations

import uuid
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import etcd

#: Where the peers keep their queues in etcd (etcdq_v2 uses /etcdq).
ETCD_PREFIX = "/peers"
#: Lock TTL in seconds, as etcdq_v2 is configured in the benchmark.
LOCK_TTL = 30
#: How long Kazoo's get() may wait for a free item before the consumer calls the
#: queue empty.  Not counted in throughput: a drain ends at the last completion.
KAZOO_CLAIM_WAIT = 0.5


class CountingClient(etcd.Client):  # type: ignore[misc]  # python-etcd has no type hints
    """An ``etcd.Client`` that counts the HTTP requests it sends, by method.

    The same measure etcdq_v2 exposes as ``Queue.etcd.requests``, so round
    trips per claim compare like with like.
    """

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        super().__init__(host=parts.hostname, port=parts.port, protocol=parts.scheme)
        self.requests: "Counter[str]" = Counter()

    def api_execute(self, path: str, method: str, params: Optional[Dict[str, Any]] = None,
                    timeout: Optional[float] = None) -> Any:
        self.requests[method] += 1
        return super().api_execute(path, method, params=params, timeout=timeout)


def _files(listing: etcd.EtcdResult) -> List[etcd.EtcdResult]:
    """The files of a directory listing, in listing order.

    python-etcd yields the directory itself for an empty directory, so
    directories are skipped.
    """
    return [child for child in listing.children if not child.dir]


def _list_sorted(client: etcd.Client, directory: str) -> List[etcd.EtcdResult]:
    """Every item under ``directory``, oldest first (in-order keys sort by index)."""
    try:
        return _files(client.read(directory, sorted=True))
    except etcd.EtcdKeyNotFound:
        return []


class _EtcdPeer:
    """What the etcd peers share: a counting client, a queue directory, a unique token."""

    def __init__(self, url: str, name: str) -> None:
        self.etcd = CountingClient(url)
        self.root = f"{ETCD_PREFIX}/{name}"
        self.work = f"{self.root}/work"
        # Lock values: a consumer only ever deletes a lock holding its own token.
        self.token = uuid.uuid4().hex
        self.lock_failures = 0

    @property
    def requests(self) -> "Counter[str]":
        return self.etcd.requests

    def put_many(self, payloads: Sequence[str]) -> None:
        for payload in payloads:
            self.etcd.write(self.work, payload, append=True)

    def runs_recorded_twice(self) -> Optional[int]:
        return None  # these designs keep no record that could tell

    def close(self) -> None:
        self.etcd.http.clear()


class MutexQueue(_EtcdPeer):
    """One global mutex (``{root}/mutex``, prevExist=false + TTL) around taking the head.

    A consumer that finds the mutex taken watches it and tries again when it
    changes (deleted or expired), as a tutorial would; ``lock_failures``
    counts those failed attempts.
    """

    def __init__(self, url: str, name: str) -> None:
        super().__init__(url, name)
        self.mutex = f"{self.root}/mutex"

    def claim(self) -> Optional[str]:
        self._acquire()
        try:
            items = _list_sorted(self.etcd, self.work)
            if not items:
                return None
            self.etcd.delete(items[0].key)
            return str(items[0].value)
        finally:
            self.etcd.delete(self.mutex, prevValue=self.token)

    def finish(self) -> None:
        """Nothing to do: the item was deleted under the mutex, before processing."""

    def _acquire(self) -> None:
        while True:
            try:
                self.etcd.write(self.mutex, self.token, prevExist=False, ttl=LOCK_TTL)
                return
            except etcd.EtcdAlreadyExist as taken:
                self.lock_failures += 1
                self._wait_for_release(taken.payload["index"])

    def _wait_for_release(self, seen_index: int) -> None:
        # Watching from the index of our failed attempt + 1 cannot miss a
        # release that happened in between: etcd replays it from its history.
        try:
            self.etcd.watch(self.mutex, index=seen_index + 1, timeout=LOCK_TTL)
        except (etcd.EtcdWatchTimedOut, etcd.EtcdEventIndexCleared):
            pass  # just try again


class LiteralQueue(_EtcdPeer):
    """The directory-lock design, literally; ``lock_failures`` counts lost lock races (105).

    claim: list work/ sorted, walk it, PUT locks/<id> prevExist=false ttl=30
    on the first item not locked.  finish: PUT completed/<id>, DELETE
    work/<id>, DELETE locks/<id>.
    """

    def __init__(self, url: str, name: str) -> None:
        super().__init__(url, name)
        self._current: Optional[Tuple[str, str]] = None  # (id, payload) being processed

    def _key(self, directory: str, item_id: str) -> str:
        return f"{self.root}/{directory}/{item_id}"

    def claim(self) -> Optional[str]:
        for item in _list_sorted(self.etcd, self.work):
            item_id = item.key.rsplit("/", 1)[-1]
            try:
                self.etcd.write(self._key("locks", item_id), self.token,
                                prevExist=False, ttl=LOCK_TTL)
            except etcd.EtcdAlreadyExist:
                self.lock_failures += 1
                continue
            self._current = (item_id, str(item.value))
            return str(item.value)
        return None

    def finish(self) -> None:
        assert self._current is not None, "finish() without a claim"
        item_id, payload = self._current
        self._current = None
        self.etcd.write(self._key("completed", item_id), payload)
        try:
            self.etcd.delete(self._key("work", item_id))
        except etcd.EtcdKeyNotFound:
            pass  # a stale listing let us lock an item another consumer had finished
        self.etcd.delete(self._key("locks", item_id), prevValue=self.token)


class KazooQueue:
    """Kazoo's ``LockingQueue`` recipe on ZooKeeper: get() locks an entry, consume() removes it.

    ZooKeeper requests are not counted (``requests`` stays empty) and lost
    lock races are hidden inside the recipe (``lock_failures`` is None).
    """

    def __init__(self, hosts: str, name: str) -> None:
        # Imported here: kazoo is optional, only this peer needs it.
        from kazoo.client import KazooClient
        from kazoo.recipe.queue import LockingQueue

        self._client = KazooClient(hosts=hosts)
        self._client.start(timeout=10)
        self._queue = LockingQueue(self._client, f"/peers/{name}")
        self.requests: "Counter[str]" = Counter()
        self.lock_failures: Optional[int] = None

    def put_many(self, payloads: Sequence[str]) -> None:
        self._queue.put_all([payload.encode() for payload in payloads])

    def claim(self) -> Optional[str]:
        value = self._queue.get(timeout=KAZOO_CLAIM_WAIT)
        return None if value is None else bytes(value).decode()

    def finish(self) -> None:
        self._queue.consume()

    def runs_recorded_twice(self) -> Optional[int]:
        return None

    def close(self) -> None:
        self._client.stop()
        self._client.close()
