"""The model of etcd v2 (etcdq_v2.testing.sim) answers as real etcd 3.5 and 3.4 do.

Each script is a function of a client; it runs once against the model and
once against a real member (3.5: the default binary; 3.4: /usr/bin/etcd from
Debian's etcd-server, skipped when absent), and the two transcripts must
agree field by field.  Indexes are compared relative to the index at the
start of the script (a real server has history of its own), expirations
relative to the time of the request, within a second, and ttl within one.
Each version gets a member of its own, so that no other test's TTL keys
expire during a script and shift the indexes.
"""
from __future__ import annotations

import json
import math
import re
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from etcdq_v2.etcd_binary import etcd_version, find_etcd_binary
from etcdq_v2.testing import EtcdServer
from etcdq_v2.testing.sim import Cluster, Version
from etcdq_v2.transport import EventStream, Transport, _FORM_QUOTING, _PATH_QUOTING, _quote
from etcdq_v2.wire import Lost, Member

#: Where the 3.4 cells find etcd 3.4 (apt-get install etcd-server).
ETCD34 = Path("/usr/bin/etcd")
#: Seconds a stream is read after its last event before the take ends.
STREAM_IDLE = 0.5
#: Seconds a wait=true GET is given to answer before the script counts it as blocking.
WAIT_GIVE_UP = 0.2
#: The status recorded for a wait that blocks (no answer within WAIT_GIVE_UP).
NO_ANSWER = -1
#: The model's clock starts here (any fixed time: the model is deterministic).
MODEL_START = 1_800_000_000.0
_TWENTY_DIGITS = re.compile(r"(?<![0-9])[0-9]{20}(?![0-9])")
_INDEX_CAUSE = re.compile(r"\[([0-9]+) != ([0-9]+)\]$")
_CLEARED_CAUSE = re.compile(r"\[([0-9]+)/([0-9]+)\]$")

Record = Dict[str, Any]


def _binary_34() -> Optional[str]:
    if not ETCD34.is_file():
        return None
    try:
        return str(ETCD34) if etcd_version(str(ETCD34)).startswith("3.4.") else None
    except Exception:  # an unusable binary: the cells skip, saying why
        return None


@pytest.fixture(scope="module", params=["3.5", "3.4"])
def real_etcd(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[Tuple[Version, str]]:
    """A member of the module's own for each version: the version, its client URL."""
    if request.param == "3.4":
        binary = _binary_34()
        if binary is None:
            pytest.skip("etcd 3.4 is not installed at /usr/bin/etcd (apt-get install etcd-server)")
    else:
        binary = find_etcd_binary()
        if not etcd_version(binary).startswith("3.5."):
            pytest.skip(f"the default etcd binary {binary} is not 3.5")
    server = EtcdServer(tmp_path_factory.mktemp(f"etcd{request.param}") / "data", binary=binary)
    server.start()
    try:
        yield Version(request.param), server.url
    finally:
        server.stop()


class Client:
    """What a script calls; records each reply, normalised, in ``transcript``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.transcript: List[Record] = []
        self.base = 0

    # -- what scripts use ---------------------------------------------------
    def key(self, name: str) -> str:
        """The script's key ``name`` under its prefix ("": the prefix, "/": etcd's root)."""
        if name == "/":
            return "/"
        return f"{self.prefix}/{name}" if name else self.prefix

    def put(self, name: str, **form: Any) -> Record:
        return self.call("PUT", name, form=form)

    def post(self, name: str, **form: Any) -> Record:
        return self.call("POST", name, form=form)

    def get(self, name: str, **query: Any) -> Record:
        return self.call("GET", name, query=query)

    def delete(self, name: str, **query: Any) -> Record:
        return self.call("DELETE", name, query=query)

    def wait(self, name: str, **query: Any) -> Record:
        """A wait=true GET that etcd answers at once (from history, or an error)."""
        return self.call("GET", name, query=dict(query, wait="true"), wait=True)

    def call(self, method: str, name: str, *, query: Optional[Dict[str, Any]] = None,
             form: Optional[Dict[str, Any]] = None, wait: bool = False) -> Record:
        target = f"/v2/keys{_quote(self.key(name), _PATH_QUOTING)}"
        if query:
            target += "?" + self._encode(query)
        body = self._encode(form) if form is not None else None
        sent = self.clock()
        status, index, lines = self.send(method, target, body, wait)
        record = {"request": f"{method} {name} {query or ''} {form or ''}", "status": status,
                  "index": self.relative(index),
                  "body": [self.normal(line, sent) for line in lines],
                  "raw": [self.raw(line) for line in lines if b'"nodes"' not in line]}
        self.transcript.append(record)
        return record

    def rel(self, record: Record) -> int:
        """The modifiedIndex of a write's reply (relative), for a later prevIndex."""
        return int(record["body"][0]["node"]["modifiedIndex"])

    # -- what each kind of client provides -------------------------------------
    def start(self) -> None:
        self.base = self.current_index()

    def current_index(self) -> int:
        raise NotImplementedError

    def send(self, method: str, target: str, body: Optional[str], wait: bool
             ) -> Tuple[int, int, List[bytes]]:
        raise NotImplementedError

    def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    def clock(self) -> float:
        raise NotImplementedError

    def stream(self, name: str) -> Any:
        raise NotImplementedError

    def take(self, stream: Any, until: Optional[str] = None) -> Record:
        """The events a stream has delivered: until it stays idle, or (``until``)
        until the event of that key, which must come."""
        raise NotImplementedError

    # -- normalising ----------------------------------------------------------
    def _encode(self, params: Dict[str, Any]) -> str:
        pairs = []
        for name, value in params.items():
            if name in ("prevIndex", "waitIndex") and isinstance(value, int) and value > 0:
                value += self.base
            pairs.append(f"{name}={_quote(str(value), _FORM_QUOTING)}")
        return "&".join(pairs)

    def relative(self, index: int) -> int:
        return index - self.base if index else 0

    def raw(self, line: bytes) -> bytes:
        """The bytes as sent, numbers blanked: Go's field order and escaping, exactly."""
        line = re.sub(rb'"expiration":"[^"]*"', b'"expiration":"T"', line)
        return re.sub(rb"[0-9]+", b"#", line.replace(self.prefix.encode(), b"<p>"))

    def normal(self, line: bytes, sent: float) -> Any:
        return self._walk(json.loads(line), sent)

    def _walk(self, value: Any, sent: float) -> Any:
        if isinstance(value, list):
            nodes = [self._walk(item, sent) for item in value]
            return sorted(nodes, key=lambda node: node.get("key", "")) \
                if all(isinstance(node, dict) for node in nodes) else nodes
        if not isinstance(value, dict):
            return self._text(value) if isinstance(value, str) else value
        out: Dict[str, Any] = {}
        for name, item in value.items():
            if name in ("modifiedIndex", "createdIndex", "index"):
                out[name] = self.relative(item)
            elif name == "expiration":
                out[name] = rfc3339_seconds(item) - sent
            elif name == "cause":
                out[name] = self._cause(item)
            else:
                out[name] = self._walk(item, sent)
        return out

    def _text(self, text: str) -> str:
        text = text.replace(self.prefix, "<p>")
        return _TWENTY_DIGITS.sub(lambda m: f"<{int(m.group()) - self.base}>", text)

    def _cause(self, cause: str) -> str:
        for pattern, spelled in ((_INDEX_CAUSE, "[{} != {}]"), (_CLEARED_CAUSE, "[{}/{}]")):
            found = pattern.search(cause)
            if found:
                numbers = [self.relative(int(n)) for n in found.groups()]
                cause = cause[:found.start()] + spelled.format(*numbers)
        return self._text(cause)


def rfc3339_seconds(text: str) -> float:
    """Seconds since the epoch of Go's RFC 3339 time (UTC, up to nanoseconds)."""
    found = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?Z", text)
    assert found, text
    year, month, day, hour, minute, second = (int(g) for g in found.groups()[:6])
    days = _days_from_civil(year, month, day)
    fraction = float("0." + found.group(7)) if found.group(7) else 0.0
    return days * 86400 + hour * 3600 + minute * 60 + second + fraction


def _days_from_civil(year: int, month: int, day: int) -> int:
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


class ModelClient(Client):
    """The script against a fresh one-member model; time passes only in sleep()."""

    def __init__(self, prefix: str, version: Version) -> None:
        super().__init__(prefix)
        self.cluster = Cluster(1, start=MODEL_START, version=version)
        self.now = MODEL_START

    def current_index(self) -> int:
        return self.cluster.members[0].store.index

    def send(self, method: str, target: str, body: Optional[str], wait: bool
             ) -> Tuple[int, int, List[bytes]]:
        reply = self.cluster.request(0, method, target, body, self.now).reply
        assert reply is not None
        if reply.watch is None:
            return reply.status, int(reply.headers["x-etcd-index"]), [reply.body]
        lines = reply.watch.take()
        if not lines:  # it would block: the client gives up, as RealClient does
            reply.watch.close()
            return NO_ANSWER, 0, []
        return reply.status, int(reply.headers["x-etcd-index"]), lines

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.cluster.advance(self.now)

    def clock(self) -> float:
        return self.now

    def stream(self, name: str) -> Any:
        target = f"/v2/keys{_quote(self.key(name), _PATH_QUOTING)}?wait=true&recursive=true" \
                 "&stream=true"
        reply = self.cluster.request(0, "GET", target, None, self.now).reply
        assert reply is not None and reply.watch is not None
        return reply

    def take(self, stream: Any, until: Optional[str] = None) -> Record:
        return self._record_stream(int(stream.headers["x-etcd-index"]), stream.watch.take())

    def _record_stream(self, index: int, lines: List[bytes]) -> Record:
        record = {"request": "stream", "status": 200, "index": self.relative(index),
                  "body": [self.normal(line, self.clock()) for line in lines]}
        self.transcript.append(record)
        return record


class RealClient(ModelClient):
    """The same script against a real member, through etcdq_v2's own wire layer."""

    def __init__(self, prefix: str, url: str) -> None:
        Client.__init__(self, prefix)
        self.member = Member(url, tls=None, username=None, password=None)
        self.url = url

    def current_index(self) -> int:
        response = self.member.request("GET", "/v2/keys/", None, 5.0)
        return int(response.headers["x-etcd-index"])

    def send(self, method: str, target: str, body: Optional[str], wait: bool
             ) -> Tuple[int, int, List[bytes]]:
        try:
            response = self.member.request(method, target, body, WAIT_GIVE_UP if wait else 5.0)
        except Lost as exc:
            if not (wait and exc.timed_out):
                raise
            return NO_ANSWER, 0, []
        return response.status, int(response.headers.get("x-etcd-index") or 0), \
            [line for line in response.body.splitlines(keepends=True) if line.strip()]

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def clock(self) -> float:
        return time.time()

    def stream(self, name: str) -> Any:
        return Transport(self.url).stream(self.key(name), idle_timeout=STREAM_IDLE)

    def take(self, stream: Any, until: Optional[str] = None) -> Record:
        assert isinstance(stream, EventStream)
        lines: List[bytes] = []
        last = f'"key":"{self.key(until)}"'.encode() if until is not None else None
        for block in stream.blocks():
            lines += [line for line in block.splitlines(keepends=True) if line.strip()]
            if last is not None and last in lines[-1]:
                stream.release()
                break
        return self._record_stream(stream.index, lines)

    def close(self) -> None:
        """Remove the script's keys: a TTL key left behind would expire during a later
        script on this member and shift its indexes."""
        self.member.request("DELETE", f"/v2/keys{self.prefix}?recursive=true", None, 5.0)
        self.member.close()


Script = Callable[[Client], None]
SCRIPTS: Dict[str, Script] = {}


def script(function: Script) -> Script:
    SCRIPTS[function.__name__] = function
    return function


def compare(model: List[Record], real: List[Record]) -> None:
    assert len(model) == len(real), (model, real)
    for mine, theirs in zip(model, real):
        where = mine["request"]
        _same(mine, theirs, where)


def _same(mine: Any, theirs: Any, where: str) -> None:
    if isinstance(mine, dict) and isinstance(theirs, dict):
        assert sorted(mine) == sorted(theirs), f"{where}: fields {sorted(mine)} != {sorted(theirs)}"
        assert list(mine) == list(theirs), f"{where}: field order {list(mine)} != {list(theirs)}"
        for name in mine:
            if name == "expiration":
                assert math.isclose(mine[name], theirs[name], abs_tol=1.0), \
                    f"{where}: expiration {mine[name]} != {theirs[name]}"
            elif name == "ttl":
                assert abs(mine[name] - theirs[name]) <= 1, f"{where}: ttl {mine} != {theirs}"
            else:
                _same(mine[name], theirs[name], f"{where}.{name}")
    elif isinstance(mine, list) and isinstance(theirs, list):
        assert len(mine) == len(theirs), f"{where}: {mine} != {theirs}"
        for a, b in zip(mine, theirs):
            _same(a, b, where)
    else:
        assert mine == theirs, f"{where}: model {mine!r} != etcd {theirs!r}"


def run_both(function: Script, etcd: Tuple[Version, str]) -> Tuple[ModelClient, RealClient]:
    prefix = f"/m{secrets.token_hex(4)}"
    version, url = etcd
    model, real = ModelClient(prefix, version), RealClient(prefix, url)
    try:
        for client in (model, real):
            client.start()
            function(client)
        compare(model.transcript, real.transcript)
    finally:
        real.close()
    return model, real


# -- the scripts: each edge case of ../shared/etcd-v2-notes.md the model implements --
@script
def in_order_keys_are_named_by_their_index(c: Client) -> None:
    c.post("q/work", value="a")
    c.post("q/work", value="b")
    c.put("elsewhere", value="x")
    c.post("q/work", value="c")
    c.post("q/work", value="d", ttl=30)
    c.get("q/work", sorted="true")
    c.get("q/work")
    c.put("file", value="f")
    c.post("file", value="under a file")
    c.post("q/work", value="shrunk", noValueOnSuccess="true")
    c.put("q/x", value="shrunk", noValueOnSuccess="true")
    c.delete("q/x")


@script
def listings_sort_by_key_and_hide_underscore_segments(c: Client) -> None:
    for name in ("d/b", "d/a", "d/_hidden", "d/c/x", "d/_h/y", "d/c/_z"):
        c.put(name, value=name)
    c.get("d", sorted="true")
    c.get("d", sorted="true", recursive="true")
    c.get("d/_hidden")
    c.get("d/_h", sorted="true")
    c.get("", sorted="true", recursive="true")
    c.get("d/a/below")
    c.get("missing")
    c.get("missing/deeper")


@script
def prev_exist_conditions(c: Client) -> None:
    c.put("k", value="a", prevExist="false")
    c.put("k", value="b", prevExist="false")
    c.put("missing", value="b", prevExist="true")
    c.put("k", value="c", prevExist="true")
    c.put("k", value="d", prevExist="false", prevValue="c")
    c.put("dir", dir="true", prevExist="false")
    c.put("dir", dir="true", prevExist="false")
    c.put("dir", value="v")
    c.put("dir/f", value="v", prevExist="false")


@script
def compare_and_swap_conditions(c: Client) -> None:
    first = c.put("k", value="nodeA")
    c.put("k", value="x", prevValue="nodeB")
    c.put("k", value="x", prevIndex=c.rel(first) + 1)
    c.put("k", value="x", prevValue="nodeB", prevIndex=c.rel(first) + 1)
    c.put("k", value="x", prevValue="nodeA", prevIndex=c.rel(first) + 1)
    swapped = c.put("k", value="nodeC", prevValue="nodeA", prevIndex=c.rel(first))
    c.put("k", value="nodeD", prevIndex=c.rel(swapped))
    c.put("k", value="nodeE", prevIndex=0)
    c.put("k", value="x", prevValue="")
    c.put("missing", value="x", prevValue="nodeA")
    c.put("missing", value="x", prevIndex=5)
    c.put("k", value="x", prevExist="true", prevValue="nope")
    c.put("k", value="nodeF", prevExist="true", prevValue="nodeE")
    c.put("k", value="x", prevIndex="abc")
    c.put("d/f", value="x")
    c.put("d", value="x", prevValue="y")
    c.put("d", prevExist="true")  # 3.5: 500/300 "nodePath ... : Not a file ()"; 3.4: update
    c.put("d", ttl=30, prevExist="true")
    c.get("d")


@script
def refresh_forms(c: Client) -> None:
    c.put("k", value="a", ttl=30)
    c.put("k", ttl=40, refresh="true")
    c.put("k", ttl=40, refresh="true", prevExist="true")
    c.put("k", ttl=40, refresh="true", prevValue="a")
    c.put("k", ttl=40, refresh="true", prevValue="b")
    c.put("k", value="a", ttl=40, refresh="true")
    c.put("k", refresh="true")
    c.put("missing", ttl=40, refresh="true")
    c.put("missing", ttl=40, refresh="true", prevExist="true")
    c.put("plain", value="p")
    c.put("plain", ttl=20, refresh="true")
    c.get("plain")
    c.put("plain", value="q")
    c.get("plain")


@script
def refresh_takes_an_index_and_wakes_no_watcher(c: Client) -> None:
    base = c.put("k", value="a", ttl=30)
    stream = c.stream("")
    c.put("k", ttl=30, refresh="true")
    c.put("k", ttl=30, refresh="true", prevExist="true")
    c.put("other", value="woke")
    c.take(stream)
    c.wait("k", waitIndex=c.rel(base) + 1)
    c.wait("", recursive="true", waitIndex=c.rel(base) + 1)


@script
def deletes_of_files_and_directories(c: Client) -> None:
    first = c.put("k", value="a")
    c.delete("k", prevValue="b")
    c.delete("k", prevIndex=c.rel(first) + 7)
    c.delete("k", prevValue="b", prevIndex=c.rel(first) + 7)
    c.delete("missing", prevValue="a")
    c.delete("missing")
    c.delete("k", prevValue="a", prevExist="false")
    c.put("k", value="b")
    c.delete("k", prevExist="true")
    c.put("d/e/f", value="x")
    c.delete("d")
    c.delete("d", dir="true")
    c.delete("d/e/f", dir="true")
    c.delete("d", dir="true")
    c.put("d/e/g", value="y")
    c.delete("d", prevValue="y")
    c.delete("d", recursive="true")
    c.put("h/_only", value="hidden")
    c.get("h")
    c.delete("h", dir="true")


@script
def ttl_values_and_errors(c: Client) -> None:
    c.put("a", value="x", ttl="1.5")
    c.put("a", value="x", ttl="-1")
    c.put("a", value="x", ttl="x")
    c.put("a", value="x", ttl="")
    c.get("a")
    c.put("b", value="x", ttl=30)
    c.get("b")
    c.put("b", value="y")
    c.get("b")
    c.put("c", value="x", ttl=30)
    c.put("c", value="y", prevValue="x")
    c.get("c")
    c.post("q", value="x", ttl="1.5")
    c.put("d", dir="true", ttl=30)
    c.get("d")


@script
def keys_expire_at_the_sweep_with_the_holder_in_prev_node(c: Client) -> None:
    stream = c.stream("")
    c.put("lock", value="holder", ttl=1)
    c.put("d", dir="true", ttl=1)
    c.put("d/child", value="inside")
    c.put("keep", value="k", ttl=30)
    c.get("lock")
    c.put("zero", value="z", ttl=0)  # the last write: whenever the sweep, its index is next
    c.sleep(2.2)
    c.take(stream)
    c.get("lock")
    c.get("zero")
    c.get("d")
    c.get("", sorted="true", recursive="true")


@script
def history_keeps_1000_events(c: Client) -> None:
    first = c.put("w/first", value="0")
    for n in range(1100):
        c.send("PUT", f"/v2/keys{c.key('w/many')}", f"value={n}", False)
    c.wait("w", recursive="true", waitIndex=c.rel(first))
    c.wait("w", recursive="true", waitIndex=c.rel(first) + 100)
    last = c.put("w/last", value="z")
    c.wait("w", recursive="true", waitIndex=c.rel(last) - 999)
    c.wait("w", recursive="true", waitIndex=c.rel(last) - 1000)
    c.wait("w/many", waitIndex=c.rel(last) - 2)


@script
def watches_from_an_index(c: Client) -> None:
    first = c.put("w/a", value="1")
    c.put("w/_hidden", value="h")
    c.put("w/b/c", value="2")
    c.delete("w/a")
    c.put("x", value="outside")
    c.wait("w", recursive="true", waitIndex=c.rel(first))
    c.wait("w", recursive="true", waitIndex=c.rel(first) + 1)
    c.wait("w", recursive="true", waitIndex=c.rel(first) + 2)
    c.wait("w/a", waitIndex=c.rel(first) + 1)
    c.wait("w", waitIndex=c.rel(first))
    c.delete("w", recursive="true")
    c.wait("w/b/c", waitIndex=c.rel(first) + 5)
    c.put("k", value="x", wait="true")
    c.wait("w", recursive="maybe")
    c.put("w/b/d", value="3")
    c.wait("w/b/d", quorum="true")  # a quorum wait is a quorum GET: answered at once


@script
def streams_see_later_events_but_not_hidden_ones(c: Client) -> None:
    c.put("s/before", value="0")
    stream = c.stream("s")
    c.put("s/a", value="1")
    c.put("s/_hidden", value="h")
    c.put("s/_dir/x", value="h")
    c.put("elsewhere", value="e")
    c.post("s/work", value="p")
    c.put("s/a", value="2", prevValue="1")
    c.delete("s/a", prevValue="2")
    c.take(stream)


@script
def a_stream_on_a_deleted_path_hears_the_delete_twice(c: Client) -> None:
    c.put("s/d/a", value="1")
    c.put("s/f", value="2")
    on_dir, on_child, on_file = c.stream("s/d"), c.stream("s/d/a"), c.stream("s/f")
    on_parent = c.stream("s")
    c.delete("s/d", recursive="true")
    c.delete("s/f", prevValue="2")
    for stream in (on_dir, on_child, on_file, on_parent):
        c.take(stream)


@script
def form_values_and_odd_fields(c: Client) -> None:
    c.put("v", value="a b&c=d+e%f<g>&\u00e9\u2028\"\\\t")
    c.get("v")
    c.put("empty", value="")
    c.get("empty")
    c.put("novalue")
    c.get("novalue")
    c.put("b", value="x", prevExist="maybe")
    c.put("b", value="x", dir="nope")
    c.get("b", sorted="1", recursive="T")
    c.put("big", value="x" * (10 << 20))  # past Go's 10 MiB form cap: 400/210
    c.put("/", value="root")
    c.delete("/", dir="true")
    c.post("/", value="at the root", prevExist="true", wait="true")
    c.wait("w", waitIndex=c.rel(c.put("w", value="now")) + 1)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_model_answers_as_etcd(name: str, real_etcd: Tuple[Version, str]) -> None:
    run_both(SCRIPTS[name], real_etcd)


# -- random sequences over a small alphabet ------------------------------------
_NAMES = ["a", "b", "d/x", "d"]
_VALUES = ["v1", "v2"]
_PUT = st.tuples(st.just("put"), st.sampled_from(_NAMES), st.sampled_from(_VALUES + [None]),
                st.sampled_from([None, "true", "false"]), st.sampled_from([None] + _VALUES),
                st.sampled_from([None, 0, 1, 2, 3]), st.sampled_from([None, 30]),
                st.booleans(), st.booleans())
_DELETE = st.tuples(st.just("delete"), st.sampled_from(_NAMES), st.sampled_from([None] + _VALUES),
                    st.sampled_from([None, 1, 2, 3]), st.booleans(), st.booleans())
_POST = st.tuples(st.just("post"), st.sampled_from(_NAMES), st.sampled_from(_VALUES))
_REFRESH = st.tuples(st.just("refresh"), st.sampled_from(_NAMES),
                     st.sampled_from([{}, {"prevExist": "true"}, {"prevValue": "v1"},
                                      {"prevIndex": 2}, {"prevExist": "false"}]))
_GET = st.tuples(st.just("get"), st.sampled_from(_NAMES + [""]), st.booleans())
#: Rarer than the others: a wait that blocks costs WAIT_GIVE_UP on the real server.
_WAIT = st.tuples(st.just("wait"), st.sampled_from(_NAMES + [""]), st.sampled_from([1, 2, 4]))
_STEP = st.one_of(_PUT, _PUT, _PUT, _REFRESH, _DELETE, _DELETE, _POST, _GET, _WAIT)


def _random_script(steps: List[Tuple[Any, ...]]) -> Script:
    """The steps, watched by a stream that must see what the model's sees."""
    def run(c: Client) -> None:
        stream = c.stream("")
        for name, ttl in (("a", None), ("b", 30), ("d/x", None)):  # keys for steps to find
            c.put(name, value="v1", **({"ttl": ttl} if ttl else {}))
        for step in steps:
            _random_step(c, step)
        c.put("zz/end", value="end")
        c.take(stream, until="zz/end")
    return run


def _random_step(c: Client, step: Tuple[Any, ...]) -> None:
    kind, name = step[0], step[1]
    if kind == "put":
        value, exist, prev_value, prev_index, ttl, refresh, is_dir = step[2:]
        form = {"value": value, "prevExist": exist, "prevValue": prev_value,
                "prevIndex": prev_index, "ttl": ttl, "refresh": "true" if refresh else None,
                "dir": "true" if is_dir else None}
        c.put(name, **{k: v for k, v in form.items() if v is not None})
    elif kind == "delete":
        prev_value, prev_index, is_dir, recursive = step[2:]
        query = {"prevValue": prev_value, "prevIndex": prev_index,
                 "dir": "true" if is_dir else None, "recursive": "true" if recursive else None}
        c.delete(name, **{k: v for k, v in query.items() if v is not None})
    elif kind == "post":
        c.post(name, value=step[2])
    elif kind == "refresh":
        c.put(name, ttl=30, refresh="true", **step[2])
    elif kind == "get":
        c.get(name, sorted="true", recursive="true" if step[2] else "false")
    else:
        c.wait(name, recursive="true", waitIndex=step[2])


@settings(max_examples=50, deadline=None, derandomize=True)
@given(steps=st.lists(_STEP, min_size=1, max_size=10))
def test_random_request_sequences_answer_as_etcd(real_etcd: Tuple[Version, str],
                                                  steps: List[Tuple[Any, ...]]) -> None:
    run_both(_random_script(steps), real_etcd)
