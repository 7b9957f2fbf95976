"""put_many(in_flight=N), the pipelined put, under network faults.

Every test runs against a real etcd (tests/conftest.py), with network faults
through tests/faultproxy.py or a frozen (SIGSTOPped) member of a real cluster.
Tests named ``test_finding_*`` each reproduce a way the pipeline once missed
its deadline or held too much memory, and check the rule that prevents it:
new connections are probed together, within one shared timeout; nothing is
sent after a failure, and each lane's wait is timed from its own send; each
POST is form-encoded just before it is sent.  Their docstrings describe the
code as it was.  ``test_held_*`` are faults the pipeline always survived
(they pass), kept for what they cover.
"""
from __future__ import annotations

import contextlib
import random
import re
import socket
import ssl
import threading
import time
import tracemalloc
from collections import Counter
from typing import Any, Dict, List, Optional

import h11
import pytest
import trustme

from etcdq_v2 import Queue, Unavailable, connect
from etcdq_v2.errors import EtcdqError
from etcdq_v2.server import EtcdCluster, EtcdServer
from etcdq_v2.wire import Member, Response

import test_security
from faultproxy import FaultProxy
from helpers import in_background, wait_until

ca, tls_files, tls_etcd = test_security.ca, test_security.tls_files, test_security.tls_etcd

_POST = re.compile(rb"^POST ")


def posts(proxy: FaultProxy) -> int:
    return sum(1 for line in list(proxy.requests) if _POST.match(line))


def stored(queue: Queue, state: str = "pending") -> Dict[str, Any]:
    return {info.id: info.payload for info in queue.items(state)}


# -- a frozen endpoint: new lanes are probed together, within one timeout, then failover ----

def test_finding_a_black_holed_first_endpoint_makes_put_many_miss_its_deadline_and_never_fail_over(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """Endpoints [A, B] where A accepts connections but never answers (a frozen
    host; here the proxy's black hole) and B is healthy.

    put() fails over to B within one timeout.  put_many(in_flight=16) opens 16
    new connections to A and probes them ONE AFTER THE OTHER (_probe_all reads
    each probe's reply with its own full timeout): 16 x timeout = 16 s, past the
    3 s deadline, so _retrying then raises Unavailable without ever trying B.
    """
    timeout = 1.0
    with Queue(connect([proxy.url, etcd_url], timeout=timeout), queue_name) as queue:
        proxy.black_hole()
        started = time.monotonic()
        queue.put("single")  # P1: one probe times out, then B
        single = time.monotonic() - started
        assert single < 2 * timeout + 1
        # put() moved the transport on to B; move it back to A, as a fresh
        # transport (or any request that failed over from B) would have it.
        queue.etcd._current = 0
        thread, outcome = in_background(lambda: queue.put_many(range(16), in_flight=16))
        began = time.monotonic()
        thread.join(queue.etcd.deadline + timeout + 2)  # P1's bound, and some slack
        alive = thread.is_alive()
        thread.join(60)
        took = time.monotonic() - began
        assert not alive, (f"put_many took {took:.1f} s (deadline {queue.etcd.deadline:g} s, "
                           f"put() took {single:.1f} s); it ended with {outcome}")
        assert "raised" not in outcome, outcome["raised"]  # B was healthy all along
        assert sorted(stored(queue).values(), key=str) == sorted(["single", *range(16)], key=str)


def test_finding_a_frozen_cluster_member_makes_put_many_miss_its_deadline(
        cluster: EtcdCluster, queue_name: str) -> None:
    """The same with a real 3-member cluster whose first endpoint is SIGSTOPped
    (its kernel still accepts connections): the other two are a healthy majority."""
    timeout = 1.0
    follower = 0 if cluster.leader_index() != 0 else 1  # freeze a follower: no election
    order = [cluster.members[follower]] + [m for i, m in enumerate(cluster.members)
                                           if i != follower]
    with Queue(connect([m.url for m in order], timeout=timeout), queue_name) as queue:
        cluster.pause(follower)
        try:
            started = time.monotonic()
            thread, outcome = in_background(lambda: queue.put_many(range(16), in_flight=16))
            thread.join(queue.etcd.deadline + timeout + 2)
            alive = thread.is_alive()
            thread.join(60)
            took = time.monotonic() - started
            assert not alive, (f"put_many took {took:.1f} s (deadline {queue.etcd.deadline:g} s)"
                               f" with a healthy majority; it ended with {outcome}")
            assert "raised" not in outcome, outcome["raised"]
        finally:
            cluster.resume(follower)



def test_finding_a_slow_endpoint_passes_the_lanes_probe_so_put_many_puts_into_it_and_raises(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """Endpoint A delays what the client sends by 1.5 s (a congested path), B is
    direct; timeout 1 s.  put() probes its new connection to A, gets no answer
    within 1 s, and fails over to B: stored, no doubt.

    put_many(in_flight=16) sends 16 probes at once and reads them one after the
    other: the first times out at 1 s, but by then the others' answers are on
    their way, and the second waits a full timeout of its own from there, so
    15 probes "answer".  15 POSTs then go to A, time out (1 s), are looked
    for on B at once, not found: Unavailable "may or may not be stored" -- and
    half a second later A applies all 15.  The probe was meant to keep POSTs
    off a member that does not answer within the timeout."""
    timeout = 1.0
    with Queue(connect([proxy.url, etcd_url], timeout=timeout, deadline=10), queue_name) as queue:
        proxy.delay(1500, "up")
        queue.put("single")  # P1: the probe of A times out, B stores it
        assert posts(proxy) == 0
        queue.etcd._current = 0  # back to A, as a fresh transport would start
        thread, outcome = in_background(lambda: queue.put_many(range(16), in_flight=16))
        thread.join(30)
        assert not thread.is_alive()
        sent_to_a = posts(proxy)
        if sent_to_a:  # for the message: what A applies after put_many said "not found"
            with contextlib.suppress(AssertionError):
                wait_until(lambda: len(stored(queue)) > 1, 5)
        assert "raised" not in outcome and sent_to_a == 0, (
            f"{sent_to_a} POSTs went to the endpoint that failed put()'s probe; put_many "
            f"ended with {outcome}; stored now: {sorted(map(str, stored(queue).values()))}")


# -- after a send fails, nothing more is sent; each lane's wait is timed from its send -----

@pytest.mark.alone  # timing: a busy machine stretches its fault's window past its bounds
def test_finding_big_puts_on_pooled_lanes_to_a_frozen_member_wait_in_flight_times_the_timeout(
        cluster: EtcdCluster, queue_name: str) -> None:
    """The pool holds connections to member A (a first put_many left them).  A
    freezes (SIGSTOP).  A put() of one big payload (3 MB of '!', 9 MB
    form-encoded, under etcd's 10 MiB form limit; max_payload_bytes raised to
    4 MiB) fills the socket buffers, its sendall times out, and it raises
    Unavailable ("may or may not") after about one send timeout.

    put_many of 8 such payloads, in_flight=8: the first lane's sendall times
    out the same way (Lost), and the pipeline is "halted" -- but
    _Pipeline._send's loop over the lanes does not look at _halted, so it goes
    on to lane 2, whose sendall times out too, and so on: 8 sends' timeouts in
    a row before the POSTs in doubt are even looked for (the doc: "At the
    first failure of any kind ... nothing more is sent")."""
    timeout, lanes = 1.0, 8
    follower = 0 if cluster.leader_index() != 0 else 1
    order = [cluster.members[follower]] + [m for i, m in enumerate(cluster.members)
                                           if i != follower]
    big = ["!" * 3_000_000 for _ in range(lanes)]
    with Queue(connect([m.url for m in order], timeout=timeout), queue_name,
               max_payload_bytes=4 << 20) as queue:
        queue.put_many(range(lanes + 1), in_flight=lanes + 1)  # lanes to A stay pooled
        assert len(queue.etcd._members[0]._idle) == lanes + 1
        cluster.pause(follower)
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="may or may not"):
                queue.put(big[0])  # on a pooled connection to A
            single = time.monotonic() - started
            queue.etcd._current = 0  # back to A, with `lanes` pooled connections to it
            assert len(queue.etcd._members[0]._idle) == lanes
            started = time.monotonic()
            thread, outcome = in_background(lambda: queue.put_many(big, in_flight=lanes))
            thread.join(2 * single + 2)
            alive = thread.is_alive()
            thread.join(120)
            took = time.monotonic() - started
            # Unavailable ("may or may not be stored") is what the doc says a frozen
            # member gives; the time it takes to say so is the finding.
            assert not alive, (f"put_many took {took:.1f} s, put() {single:.1f} s; "
                               f"it ended with {outcome}")
            assert isinstance(outcome.get("raised"), Unavailable)
        finally:
            cluster.resume(follower)


# -- each POST is form-encoded just before it is sent, not a whole round up front ---------

@pytest.mark.alone  # timing: a busy machine stretches its fault's window past its bounds
def test_finding_put_many_holds_every_form_encoded_body_of_a_chunk_at_once(
        etcd_binary: str, tmp_path: Any, queue_name: str) -> None:
    """Transport.post_many builds the request of every value of the round up front
    (``requests = [... _quote(value) ... for value in values]``), and again for
    what is left after each failure: for a chunk of 1,000 1-MiB payloads that
    form-encode to 3 MB each, some 3 GB at once, where in_flight=1 holds one
    request (and in_flight=N needs N).  Measured with tracemalloc: 30 payloads
    of 1 MB of '!' ('%21' on the wire)."""
    server = EtcdServer(tmp_path / "etcd", binary=etcd_binary).start()
    payloads = ["!" * 1_000_000 for _ in range(30)]
    peaks = {}
    try:
        for in_flight in (1, 2):
            with Queue(connect(server.url, timeout=5), f"{queue_name}-{in_flight}") as queue:
                tracemalloc.start()
                try:
                    base = tracemalloc.get_traced_memory()[0]
                    queue.put_many(payloads, in_flight=in_flight)
                    peaks[in_flight] = tracemalloc.get_traced_memory()[1] - base
                finally:
                    tracemalloc.stop()
    finally:
        server.stop()
    one_request = 3_000_000
    assert peaks[2] <= peaks[1] + 2 * 2 * one_request, \
        {n: f"{peak / 1e6:.0f} MB" for n, peak in peaks.items()}


# -- attacks that held -------------------------------------------------------------------

def _all_payloads(queue: Queue) -> Counter:
    """Each payload stored, however far it got (pending, running, completed, failed)."""
    counts: Counter = Counter()
    for state in ("pending", "running", "completed", "failed"):
        counts.update(info.payload for info in queue.items(state))
    return counts


def _by_id(queue: Queue) -> Dict[str, Any]:
    found: Dict[str, Any] = {}
    for state in ("pending", "running", "completed", "failed"):
        found.update((info.id, info.payload) for info in queue.items(state))
    return found


def _order_bound_holds(ids: List[str], in_flight: int) -> bool:
    """No item stored before one given in_flight or more places earlier."""
    newest = ""
    for j in range(in_flight, len(ids)):
        newest = max(newest, ids[j - in_flight])
        if ids[j] < newest:
            return False
    return True


def test_held_cuts_while_another_consumer_claims_and_completes_the_items(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """Replies cut mid-batch (five times) while a consumer elsewhere claims and
    completes the items as fast as it can: the POSTs in doubt are found in
    completed/ too; every payload once, each id names its payload, order bound."""
    given = [f"c-{n}" for n in range(1500)]
    in_flight = 16
    done: List[str] = []
    with Queue(connect(proxy.url, timeout=2, deadline=20), queue_name) as producer, \
            Queue(connect(etcd_url), queue_name) as consumer:
        thread, outcome = in_background(lambda: producer.put_many(given, in_flight=in_flight))

        def consume() -> None:
            # stats() (a GET of the whole queue) only when nothing was free: at
            # each claim it made the drain quadratic, over a minute on a busy
            # machine, and the counts below then raced the consumer still running
            while True:
                claim = consumer.claim(timeout=0.2)
                if claim is not None:
                    claim.complete()
                    done.append(claim.payload)
                elif not thread.is_alive() and not consumer.stats()["pending"]:
                    return
        worker, worked = in_background(consume, "consumer")
        for cut in range(1, 6):
            wait_until(lambda n=cut * 200: posts(proxy) >= n or not thread.is_alive(), 30,
                       interval=0.002, message=f"{cut * 200} POSTs")
            proxy.cut(60)
            time.sleep(0.05)
            proxy.pass_through()
        thread.join(60)
        worker.join(120)
        assert not thread.is_alive() and not worker.is_alive()
        assert "raised" not in outcome, outcome.get("raised")
        assert "raised" not in worked, worked.get("raised")
        ids: List[str] = outcome["returned"]
        assert _all_payloads(producer) == Counter(given)
        assert _by_id(producer) == dict(zip(ids, given))
        assert _order_bound_holds(ids, in_flight)
    assert posts(proxy) == len(given)
    assert Counter(done) == Counter(given)


def test_held_replies_delayed_past_the_timeout_land_later_and_the_next_endpoint_takes_over(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """Endpoint A delays every reply past the timeout (they land later, on
    connections the client closed); B is direct.  All POSTs of the first round
    are in doubt, found (on B), then the rest goes to B."""
    given = [f"d-{n}" for n in range(200)]
    in_flight = 16
    with Queue(connect([proxy.url, etcd_url], timeout=1, deadline=6), queue_name) as queue:
        proxy.delay(1500, "down")
        ids = queue.put_many(given, in_flight=in_flight)
        assert _all_payloads(queue) == Counter(given)
        assert _by_id(queue) == dict(zip(ids, given))
        assert _order_bound_holds(ids, in_flight)
    assert posts(proxy) <= in_flight  # one round on A, each POST sent once


def test_held_an_error_reply_in_the_middle_of_a_window(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """Item 20 is too large for etcd's form parser (400 "POST too large"): the
    items before it are stored once, it is not, at most in_flight - 1 after it
    are, nothing more is sent, and the error is one of etcdq_v2.errors."""
    in_flight, bad = 8, 20
    given: List[Any] = [f"e-{n}" for n in range(60)]
    given[bad] = "!" * 3_800_000  # 11.4 MB form-encoded: over Go's 10 MiB form cap
    with Queue(connect(proxy.url, timeout=5), queue_name, max_payload_bytes=8 << 20) as queue:
        with pytest.raises(EtcdqError) as raised:
            queue.put_many(given, in_flight=in_flight)
        counts = _all_payloads(queue)
        assert all(counts[p] == 1 for p in given[:bad]), raised.value
        assert counts[given[bad]] == 0
        after = [p for p in given[bad + 1:] if counts[p]]
        assert len(after) <= in_flight - 1 and max(counts.values()) == 1
    assert posts(proxy) <= bad + in_flight


def test_held_a_consumer_in_the_same_process_gets_every_item_of_a_put_many_that_raised(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """put_many raises mid-chunk (a request held until it times out: not found,
    Unavailable) so none of the chunk's stored items were offered to the view:
    a consumer of the same Queue still gets each stored item, once."""
    in_flight, held = 8, 30
    given = [f"s-{n:03d}" for n in range(100)]
    with Queue(connect(proxy.url, timeout=1, deadline=3), queue_name) as queue:
        assert queue.claim() is None  # the view is up
        proxy.hold("up", match=given[held].encode())
        with pytest.raises(Unavailable, match="may or may not"):
            queue.put_many(given, in_flight=in_flight)
        proxy.release()
        wait_until(lambda: sum(_all_payloads(queue).values()) >= held + 1, 10,
                   message="the held POST to land")
        stored_now = _all_payloads(queue)
        got = []
        while True:
            claim = queue.claim(timeout=3)
            if claim is None:
                break
            got.append(claim.payload)
            claim.complete()
        assert Counter(got) == stored_now and max(stored_now.values()) == 1


def test_held_no_connection_is_left_open_by_put_many_whatever_fails(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """Twenty put_many calls with cut replies: connections through the proxy stay
    within the pool's bound, and none is left once the Queue is closed."""
    in_flight = 8
    etcd = connect(proxy.url, timeout=1, deadline=5)
    with Queue(etcd, queue_name) as queue:
        for round_ in range(20):
            if round_ % 2:
                proxy.cut(60)
            thread, outcome = in_background(
                lambda r=round_: queue.put_many([f"l-{r}-{n}" for n in range(40)],
                                                in_flight=in_flight))
            time.sleep(0.01)
            proxy.pass_through()
            thread.join(30)
            assert not thread.is_alive()
            assert proxy.open_connections <= in_flight + 2, proxy.open_connections
    etcd.close()  # Queue.close() leaves a transport it was given open
    wait_until(lambda: proxy.open_connections == 0, 5, message="every connection closed")


# -- wire: the pipeline's reading of real etcd replies, split and joined, against h11 ------

def _raw_exchange(url: str, request: bytes) -> bytes:
    """One request to the real etcd on a fresh socket: the reply's exact bytes
    (h11 says where it ends)."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    client = h11.Connection(h11.CLIENT)
    raw = b""
    try:
        sock.sendall(request)
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                data = sock.recv(65536)
                raw += data
                client.receive_data(data)
                continue
            if isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return raw
    finally:
        sock.close()


def _h11_reply(raw: bytes) -> Dict[str, Any]:
    client = h11.Connection(h11.CLIENT)
    client.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    client.send(h11.EndOfMessage())
    client.receive_data(raw)
    body, head = b"", None
    while True:
        event = client.next_event()
        if isinstance(event, h11.Response):
            head = event
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            break
        else:
            raise AssertionError(f"h11: {event!r}")
    assert head is not None
    headers = {k.decode().lower(): v.decode("latin-1") for k, v in head.headers}
    return {"status": head.status_code, "index": headers.get("x-etcd-index"), "body": body}


def _etcd_replies(etcd_url: str, queue_name: str) -> List[bytes]:
    """Real etcd replies: a POST's (noValueOnSuccess), errors, small and chunked listings."""
    root = f"/v2/keys/etcdq/{queue_name}"
    host = etcd_url.split("//")[1]

    def request(method: str, path: str, body: str = "") -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
        if body:
            head += ("Content-Type: application/x-www-form-urlencoded\r\n"
                     f"Content-Length: {len(body)}\r\n")
        return (head + "\r\n" + body).encode()
    replies = [_raw_exchange(etcd_url, request("POST", f"{root}/work",
                                               "value=x&noValueOnSuccess=true"))]
    for n in range(40):
        _raw_exchange(etcd_url, request("POST", f"{root}/big", "value=" + "y" * 400 + str(n)))
    _raw_exchange(etcd_url, request("PUT", f"{root}/file", "value=f"))
    replies += [
        _raw_exchange(etcd_url, request("POST", f"{root}/file", "value=z")),  # not a dir
        _raw_exchange(etcd_url, request("GET", f"{root}/missing")),  # 404
        _raw_exchange(etcd_url, request("PUT", f"{root}/file?prevValue=no", "value=g")),  # 412
        _raw_exchange(etcd_url, request("GET", f"{root}/work?sorted=true&quorum=true")),
        _raw_exchange(etcd_url, request("GET", f"{root}/big?sorted=true")),  # chunked
        _raw_exchange(etcd_url, request("GET", "/version")),
    ]
    assert any(b"chunked" in r.split(b"\r\n\r\n")[0].lower() for r in replies)
    return replies


class _Replayer:
    """Answers request ``POST /r/<k>`` with reply k, and GET /version (the probe)
    with etcd's own; each time it writes what is owed on a connection (several
    replies when several requests came together), cut at random places, with
    short pauses in between."""

    def __init__(self, replies: List[bytes], version: bytes, seed: int,
                 tls: Optional[ssl.SSLContext]) -> None:
        self.replies, self.version, self.random = replies, version, random.Random(seed)
        self.tls = tls
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.listener.getsockname()[1]}"
        self.threads: List[threading.Thread] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, sock: socket.socket) -> None:
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            buffer = b""
            while True:
                data = sock.recv(65536)
                if not data:
                    return
                buffer += data
                owed = b""
                while b"\r\n\r\n" in buffer:
                    head, rest = buffer.split(b"\r\n\r\n", 1)
                    length = 0
                    for line in head.split(b"\r\n")[1:]:
                        name, _, value = line.partition(b":")
                        if name.strip().lower() == b"content-length":
                            length = int(value)
                    if len(rest) < length:
                        break
                    buffer = rest[length:]
                    path = head.split(b" ")[1]
                    owed += self.version if path == b"/version" else \
                        self.replies[int(path.rsplit(b"/", 1)[1])]
                self._write(sock, owed)
        except OSError:
            return
        finally:
            sock.close()

    def _write(self, sock: socket.socket, data: bytes) -> None:
        cuts = sorted(self.random.sample(range(1, len(data)), min(3, len(data) - 1))) \
            if len(data) > 1 else []
        for a, b in zip([0] + cuts, cuts + [len(data)]):
            sock.sendall(data[a:b])
            time.sleep(self.random.choice([0, 0, 0.001, 0.005]))

    def close(self) -> None:
        self.closed = True
        self.listener.close()


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_held_the_pipeline_reads_real_etcd_replies_split_and_joined_as_h11_does(
        etcd_url: str, queue_name: str, scheme: str) -> None:
    replies = _etcd_replies(etcd_url, queue_name)
    version, replies = replies[-1], replies[:-1]
    expected = [_h11_reply(raw) for raw in replies]
    tls_server = tls_client = None
    if scheme == "https":
        authority = trustme.CA()
        tls_server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        authority.issue_cert("127.0.0.1").configure_cert(tls_server)
        tls_client = ssl.create_default_context()
        authority.configure_trust(tls_client)
    for seed in range(12):
        server = _Replayer(replies, version, seed, tls_server)
        try:
            rng = random.Random(seed)
            order = [rng.randrange(len(replies)) for _ in range(30)]
            member = Member(server.url, tls=tls_client, username=None, password=None)
            # Only successes: the pipeline stops at the first error reply, by design.
            order = [k for k in order if expected[k]["status"] < 300] + \
                [k for k in order if expected[k]["status"] >= 300][:1]
            piped = member.pipeline([("POST", f"/r/{k}", "v=1") for k in order], 2.0,
                                    lanes=rng.choice([1, 2, 3]), depth=rng.choice([1, 2, 3]))
            for k, (outcome, _) in zip(order, piped):
                assert isinstance(outcome, Response), (seed, k, outcome)
                got = {"status": outcome.status, "index": outcome.headers.get("x-etcd-index"),
                       "body": outcome.body}
                assert got == expected[k], (seed, k)
            member.close()
        finally:
            server.close()


def test_held_threads_sharing_a_queue_put_many_through_cuts_with_junk_in_work(
        etcd_url: str, proxy: FaultProxy, queue_name: str) -> None:
    """Three threads put_many on one Queue (one pool) while replies are cut, with
    junk in work/ (not JSON, JSON of another shape, a directory) that the
    look-ups by token must step over: each payload once, under its id."""
    in_flight = 8
    with Queue(connect(proxy.url, timeout=2, deadline=20), queue_name) as queue:
        work = queue.layout.work
        queue.etcd.post(work, "not json")
        queue.etcd.post(work, '["x", 1]')
        queue.etcd.put(f"{work}/zz-dir/child", "x")
        lost: List[str] = []
        queue.etcd.add_observer(lambda method, seconds, error: error and method == "POST"
                                and lost.append(error))
        batches = [[f"t{t}-{n}" for n in range(400)] for t in range(3)]
        runs = [in_background(lambda b=b: queue.put_many(b, in_flight=in_flight), f"p{t}")
                for t, b in enumerate(batches)]
        for cut in range(1, 4):
            wait_until(lambda n=cut * 250: posts(proxy) >= n
                       or not any(t.is_alive() for t, _ in runs), 30, interval=0.002,
                       message=f"{cut * 250} POSTs")
            proxy.cut(60)
            time.sleep(0.05)
            proxy.pass_through()
        for thread, _ in runs:
            thread.join(60)
        by_id = _by_id(queue)
        for (_, outcome), batch in zip(runs, batches):
            assert "raised" not in outcome, outcome.get("raised")
            ids = outcome["returned"]
            assert {i: by_id.get(i) for i in ids} == dict(zip(ids, batch))
            assert _order_bound_holds(ids, in_flight)
        assert _all_payloads(queue) == Counter(p for b in batches for p in b)
    assert posts(proxy) == 2 + sum(map(len, batches))  # the two junk POSTs, then each once
    assert "Lost" in lost  # the cuts did leave POSTs in doubt


def test_held_cuts_mid_batch_over_tls(tls_etcd: EtcdServer, tls_files: Dict[str, str],
                                      proxy_factory: Any, queue_name: str) -> None:
    """The same cuts through TLS (a TLS record cut short): every item once, under its id."""
    files = tls_files
    proxy = proxy_factory(tls_etcd.url)
    given = [f"tls-{n}" for n in range(1500)]
    in_flight = 16
    etcd = connect(proxy.url, ca_cert=files["ca"], cert=files["client_cert"],
                   key=files["client_key"], timeout=2, deadline=20)
    lost: List[str] = []
    failed: List[str] = []  # any request: a cut may land while put_many reads back a doubt
    etcd.add_observer(lambda method, seconds, error: error and method == "POST"
                      and lost.append(error))
    etcd.add_observer(lambda method, seconds, error: error and failed.append(error))
    with Queue(etcd, queue_name) as queue:
        thread, outcome = in_background(lambda: queue.put_many(given, in_flight=in_flight))
        for cut in range(1, 4):
            seen = len(failed)
            # The proxy cannot read TLS: count bytes (a POST is some 300 of them).
            wait_until(lambda n=cut * 150 * 300: proxy.bytes_up >= n
                       or not thread.is_alive(), 30, interval=0.002, message=f"{cut * 150} POSTs")
            proxy.cut(40)
            wait_until(lambda seen=seen: len(failed) > seen or not thread.is_alive(), 10,
                       message="a request to fail on the cut")
            proxy.pass_through()
        thread.join(60)
        assert "raised" not in outcome, outcome.get("raised")
        ids = outcome["returned"]
        assert _by_id(queue) == dict(zip(ids, given))
        assert _order_bound_holds(ids, in_flight)
        assert queue.etcd.requests["POST"] == len(given)  # none resent
    etcd.close()
    assert "Lost" in lost
