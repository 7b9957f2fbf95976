"""What the library's requests cost, counted on the simulated network.

A :class:`Costs` set as :attr:`etcdq_v2.testing.sim.net.Network.costs` is
told of every request handed to the network, every reply that reached its
client, and every block of watch events a stream delivered.  It counts them
by *kind*: the method, the queue directory the request addresses, whether it
names the directory (a listing, a POST, a watch) or one key in it, and the
condition it carries, for instance ``PUT locks/<id> prevExist=false`` (C1),
``PUT work/<id> prevIndex`` (C2, F1), ``PUT locks/<id> refresh`` (a
heartbeat), ``GET work/ listing``, ``GET / watch``.  Bytes are the bodies
etcd sends (a reply's body, a stream's event lines) and the paths and forms
clients send it; HTTP headers are not counted.

Nothing here reads a clock or draws a number: the counts of a seed replay.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple
from urllib.parse import parse_qsl

#: The conditions a write may carry, in the order a kind names them.
_CONDITIONS = ("refresh", "prevExist", "prevIndex", "prevValue")


def kind(method: str, target: str, body: Optional[str]) -> str:
    """The kind of one request: ``target`` is the path and query wire sends,
    ``body`` its form (PUT, POST)."""
    path, _, query = target.partition("?")
    form = dict(parse_qsl(query))
    form.update(parse_qsl(body or ""))
    where = _where(path)
    if method == "GET":
        if form.get("wait") == "true":
            return f"GET {where} watch"
        listing = where.endswith("/") or form.get("recursive") == "true"
        return f"GET {where} {'listing' if listing else 'read'}" + \
            (" quorum" if form.get("quorum") == "true" else "")
    conditions = [f"{name}={form[name]}" if name == "prevExist" else name
                  for name in _CONDITIONS if name in form]
    return " ".join([method, where] + conditions)


def _where(path: str) -> str:
    """``work/<id>``, ``work/``, ``/`` (the queue directory): the part of a
    key path below the queue (``/v2/keys/<prefix>/<queue>/...``)."""
    parts = path.strip("/").split("/")
    for n, part in enumerate(parts):
        if part in ("work", "locks", "completed", "failed"):
            rest = parts[n + 1:]
            return f"{part}/<id>" if rest else f"{part}/"
    return "/"


@dataclass
class Tally:
    """Of one kind: requests, bytes sent to etcd, replies and their body bytes."""

    requests: int = 0
    sent: int = 0
    replies: int = 0
    received: int = 0
    #: Watch events delivered on the kind's streams, and their bytes.
    events: int = 0
    streamed: int = 0

    @property
    def from_etcd(self) -> int:
        return self.received + self.streamed


@dataclass
class Costs:
    """Counts of a run (or of a stretch of it: :meth:`reset`), by kind."""

    kinds: Dict[str, Tally] = field(default_factory=dict)

    def _tally(self, method: str, target: str, body: Optional[str]) -> Tally:
        name = kind(method, target, body)
        tally = self.kinds.get(name)
        if tally is None:
            tally = self.kinds[name] = Tally()
        return tally

    def request(self, method: str, target: str, body: Optional[str]) -> None:
        tally = self._tally(method, target, body)
        tally.requests += 1
        tally.sent += len(target) + len(body or "")

    def reply(self, request: Tuple[str, str, Optional[str]], body: bytes) -> None:
        tally = self._tally(*request)
        tally.replies += 1
        tally.received += len(body)

    def streamed(self, target: str, lines: Iterable[bytes]) -> None:
        tally = self._tally("GET", target, None)
        for line in lines:
            tally.events += 1
            tally.streamed += len(line)

    def reset(self) -> None:
        self.kinds.clear()

    def total(self) -> Tally:
        whole = Tally()
        for tally in self.kinds.values():
            for name in vars(whole):
                setattr(whole, name, getattr(whole, name) + getattr(tally, name))
        return whole
