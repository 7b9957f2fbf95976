"""Fast tests of the HTTP layer, with no etcd: wire.py's framing against h11,
and transport.py's retry branches against tiny local servers.

The framing tests feed generated replies to :class:`wire.Connection` through
a fake socket, split at arbitrary byte boundaries, and to h11 (the reference
parser); the two must agree on the status, the headers wire reads and the
body, and both must reject a reply cut short.  The server tests run a small
HTTP/1.1 (or TLS) server on loopback whose answers a test scripts: refuse,
reset, answer 500, hang, close an idle connection, answer late.
"""
from __future__ import annotations

import signal
import socket
import ssl
import struct
import threading
import time
import urllib.parse
from typing import Callable, Dict, List, Optional, Tuple, Union

import h11
import pytest
import trustme
from hypothesis import given, settings, strategies as st

from etcdq_v2 import ConfigError, Unavailable
from etcdq_v2.errors import AmbiguousWrite, CompareFailed
from etcdq_v2.transport import _FORM_QUOTING, _PATH_QUOTING, Transport, _path, _quote
from etcdq_v2.wire import Connection, Lost, Member, NotSent, Response, tls_context

from helpers import wait_until

FRAMINGS = ("length", "chunked", "close")
READ = ("content-length", "transfer-encoding", "connection", "x-etcd-index")
SETTINGS = settings(max_examples=150, deadline=None)


# -- generated replies -------------------------------------------------------------

TOKEN = st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-!#$%&'*+.^_`|~",
                min_size=1, max_size=12)
VCHAR = st.sampled_from([bytes([b]) for b in list(range(0x21, 0x7F)) + list(range(0x80, 0x100))])
OWS = st.sampled_from([b"", b" ", b"\t", b"  \t"])


@st.composite
def field_values(draw) -> bytes:
    words = draw(st.lists(st.lists(VCHAR, min_size=1, max_size=6).map(b"".join), max_size=4))
    return b" ".join(words)


@st.composite
def header_lines(draw, name: str, value: bytes) -> bytes:
    spelled = "".join(c.upper() if draw(st.booleans()) else c.lower() for c in name)
    return spelled.encode("ascii") + b":" + draw(OWS) + value + draw(OWS) + b"\r\n"


@st.composite
def chunked(draw, body: bytes) -> bytes:
    cuts = sorted(draw(st.sets(st.integers(1, max(len(body) - 1, 1)), max_size=5)))
    pieces = [body[a:b] for a, b in zip([0] + cuts, cuts + [len(body)]) if body[a:b]]
    out = b"".join(_chunk(draw, len(piece)) + piece + b"\r\n" for piece in pieces)
    out += _chunk(draw, 0)
    for _ in range(draw(st.integers(0, 2))):  # trailer fields
        out += draw(header_lines(draw(TOKEN), draw(field_values())))
    return out + b"\r\n"


def _chunk(draw, size: int) -> bytes:
    digits = draw(st.sampled_from([f"{size:x}", f"{size:X}", f"00{size:x}"]))
    extensions = draw(st.lists(st.sampled_from([";a=1", ";name", ';q="x y"', ";n=v;m"]),
                               max_size=2))
    return (digits + "".join(extensions)).encode("ascii") + draw(OWS) + b"\r\n"


@st.composite
def replies(draw, framing: Optional[str] = None) -> Tuple[bytes, dict]:
    """(the bytes of a reply, what it means: status, the headers wire reads, body)."""
    framing = framing or draw(st.sampled_from(FRAMINGS))
    status = draw(st.sampled_from([200, 201, 400, 401, 403, 404, 412, 500]))
    body = draw(st.binary(max_size=300))
    reason = draw(st.sampled_from([b" OK", b" Not Found", b" ", b""]))
    head = b"HTTP/1.1 %d%s\r\n" % (status, reason)
    fields: Dict[str, bytes] = {"x-etcd-index": str(draw(st.integers(0, 10 ** 9))).encode()}
    if framing == "length":
        fields["content-length"] = str(len(body)).encode()
    elif framing == "chunked":
        fields["transfer-encoding"] = draw(st.sampled_from([b"chunked", b"Chunked"]))
    if draw(st.booleans()):
        fields["connection"] = draw(st.sampled_from([b"close", b"keep-alive"]))
    others = draw(st.dictionaries(TOKEN.filter(lambda n: n.lower() not in READ),
                                  field_values(), max_size=4))
    lines = [draw(header_lines(name, value)) for name, value in list(fields.items())
             + list(others.items())]
    data = head + b"".join(draw(st.permutations(lines))) + b"\r\n"
    data += draw(chunked(body)) if framing == "chunked" else body
    meaning = {"status": status, "body": body, "framing": framing,
               "headers": {k: v.decode("latin-1") for k, v in fields.items()}}
    return data, meaning


def segments_of(draw, data: bytes) -> List[bytes]:
    cuts = sorted(draw(st.sets(st.integers(1, max(len(data) - 1, 1)), max_size=8)))
    return [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)]) if data[a:b]]


class FakeSocket:
    """Hands out the given segments, one per recv, then end of file."""

    def __init__(self, segments: List[bytes]) -> None:
        self._segments = list(segments)

    def recv(self, size: int) -> bytes:
        if not self._segments:
            return b""
        segment = self._segments.pop(0)
        if len(segment) > size:
            self._segments.insert(0, segment[size:])
        return segment[:size]

    def gettimeout(self) -> None:
        return None

    def settimeout(self, timeout: Optional[float]) -> None:
        pass

    def shutdown(self, how: int) -> None:
        pass

    def close(self) -> None:
        pass


def wire_parse(segments: List[bytes]) -> Tuple[int, Dict[str, str], bytes]:
    response = Connection(FakeSocket(segments)).receive()  # type: ignore[arg-type]
    return response.status, response.headers, response.body


def h11_parse(segments: List[bytes]) -> Tuple[int, Dict[str, str], bytes]:
    """The reference: h11 as the client of one GET, fed the same segments."""
    client = h11.Connection(our_role=h11.CLIENT)
    client.send(h11.Request(method="GET", target="/v2/keys/x", headers=[("Host", "etcd")]))
    client.send(h11.EndOfMessage())
    status, headers, body = 0, {}, b""
    for segment in segments + [b""]:
        client.receive_data(segment)
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                break
            if isinstance(event, h11.Response):
                status = event.status_code
                headers = {name.decode(): value.decode("latin-1")
                           for name, value in event.headers if name.decode() in READ}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, body
    raise h11.RemoteProtocolError("no complete reply")


@given(st.data())
@SETTINGS
def test_wire_and_h11_agree_on_every_reply(data: st.DataObject) -> None:
    raw, meaning = data.draw(replies())
    segments = segments_of(data.draw, raw)
    got = folded(wire_parse(segments))
    assert got == folded(h11_parse(segments))
    assert got == folded((meaning["status"], meaning["headers"], meaning["body"]))


def folded(reply: Tuple[int, Dict[str, str], bytes]) -> Tuple[int, Dict[str, str], bytes]:
    """Transfer-Encoding is a case-insensitive token, and h11 lower-cases it."""
    status, headers, body = reply
    encoding = {"transfer-encoding": headers["transfer-encoding"].lower()} \
        if "transfer-encoding" in headers else {}
    return status, {**headers, **encoding}, body


@given(st.data())
@SETTINGS
def test_a_reply_cut_short_is_rejected_by_both(data: st.DataObject) -> None:
    raw, meaning = data.draw(replies(data.draw(st.sampled_from(["length", "chunked"]))))
    cut = data.draw(st.integers(0, len(raw) - 1))
    segments = segments_of(data.draw, raw[:cut]) if cut else []
    with pytest.raises(Lost):
        wire_parse(segments)
    with pytest.raises(h11.RemoteProtocolError):
        h11_parse(segments)


@given(st.data())
@SETTINGS
def test_a_body_ended_by_close_is_read_until_close_by_both(data: st.DataObject) -> None:
    raw, meaning = data.draw(replies("close"))
    body_at = raw.index(b"\r\n\r\n") + 4
    cut = data.draw(st.integers(body_at, len(raw)))  # the close may come anywhere in the body
    segments = segments_of(data.draw, raw[:cut])
    got = wire_parse(segments)
    assert got == h11_parse(segments)
    assert got[2] == raw[body_at:cut]


@given(st.data())
@SETTINGS
def test_the_next_reply_on_a_kept_alive_connection_is_read_in_step(data: st.DataObject) -> None:
    first, _ = data.draw(replies(data.draw(st.sampled_from(["length", "chunked"]))))
    second, meaning = data.draw(replies("length"))
    connection = Connection(FakeSocket(segments_of(data.draw, first + second)))  # type: ignore
    connection.receive()
    response = connection.receive()
    assert (response.status, response.body) == (meaning["status"], meaning["body"])


def test_a_body_ended_by_close_through_a_socketpair() -> None:
    ours, theirs = socket.socketpair()
    theirs.sendall(b'HTTP/1.1 200 OK\r\nX-Etcd-Index: 7\r\n\r\n{"node": {"value": ')
    theirs.sendall(b'"all of it"}}')
    theirs.close()
    connection = Connection(ours, kernel_timeouts=True)
    response = connection.receive()
    assert response.body == b'{"node": {"value": "all of it"}}'
    assert not connection.reusable  # it ended with the connection
    connection.close()


@pytest.mark.parametrize("status", [204, 304])
def test_replies_that_never_have_a_body(status: int) -> None:
    reply = b"HTTP/1.1 %d No Content\r\nContent-Length: 5\r\n\r\n" % status
    assert wire_parse([reply + b"HTTP/1.1 200 OK\r\n"]) == (status, {"content-length": "5"}, b"")


def test_an_interim_reply_is_skipped() -> None:
    replies = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    assert wire_parse([replies]) == (200, {"content-length": "2"}, b"ok")


@pytest.mark.parametrize("reply", [
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nxx",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
])
def test_a_malformed_reply_is_an_error_never_a_success(reply: bytes) -> None:
    with pytest.raises((ValueError, Lost)):
        wire_parse([reply])


# -- key quoting --------------------------------------------------------------------

@given(st.text())
def test_key_quoting_is_what_urllib_quote_does(key: str) -> None:
    assert _quote(key, _PATH_QUOTING) == urllib.parse.quote(key, safe="/")
    assert _quote(key, _FORM_QUOTING) == urllib.parse.quote_plus(key, safe="")


def test_a_path_quotes_the_key_and_spells_the_query_like_etcd() -> None:
    path = _path("/q/a b?c#d/é", {"prevValue": "x y&z", "wait": True, "sorted": False,
                                 "prevIndex": None})
    assert path == "/v2/keys/q/a%20b%3Fc%23d/%C3%A9?prevValue=x+y%26z&wait=true"


# -- a tiny scripted server ---------------------------------------------------------

class Request:
    def __init__(self, connection: int, number: int, head: bytes, body: bytes) -> None:
        self.connection, self.number, self.head, self.body = connection, number, head, body
        self.method, self.path = head.split(b" ")[:2]

    def header(self, name: str) -> str:
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name.lower().encode():
                return value.strip().decode()
        return ""


RESET, CLOSE = object(), object()
#: Bytes to send; RESET; CLOSE; or (bytes, CLOSE): send them, then close.
Answer = Union[bytes, object, Tuple[bytes, object]]


def ok(body: bytes = b'{"action":"get","node":{"key":"/k","value":"v"}}', index: int = 5,
       extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Etcd-Index: %d\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (index, len(body), extra, body))


def error(status: int, code: int, message: str = "") -> bytes:
    body = b'{"errorCode":%d,"message":"%s","cause":"","index":9}' % (code, message.encode())
    return b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)


class Server:
    """HTTP/1.1 (or HTTPS) on loopback; ``answer(request)`` says what each request
    gets: bytes to send, RESET (a TCP reset) or CLOSE (close without a word)."""

    def __init__(self, answer: Callable[[Request], Answer] = lambda request: ok(), *,
                 host: str = "127.0.0.1", tls: Optional[ssl.SSLContext] = None) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        self.listener.bind((host, 0))
        self.listener.listen(64)
        port = self.listener.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://{f'[{host}]' if ':' in host else host}:{port}"
        self.answer, self.tls = answer, tls
        self.requests: List[Request] = []
        self.connections = 0
        self.ended: List[int] = []  # connections the client closed, in order
        self.hung_up: List[int] = []  # connections this server closed
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(sock, self.connections),
                             daemon=True).start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        try:
            if self.tls is not None:
                sock = self._handshake(sock, self.tls)
            self._answer_all(sock, number)
        except OSError:
            pass
        finally:
            sock.close()

    @staticmethod
    def _handshake(sock: socket.socket, tls: ssl.SSLContext) -> ssl.SSLSocket:
        wrapped = tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        try:
            wrapped.do_handshake()
        except OSError:
            # Closed with the client's request unread, the socket would send a
            # reset, which can overtake the TLS alert just sent: drain it first.
            with socket.socket(fileno=wrapped.detach()) as raw:
                raw.settimeout(2)
                raw.shutdown(socket.SHUT_WR)
                while raw.recv(4096):
                    pass
            raise
        return wrapped

    def _answer_all(self, sock: socket.socket, number: int) -> None:
        reader = sock.makefile("rb")
        for count in range(1, 10 ** 6):
            request = _read_request(reader, number, count)
            if request is None:
                self.ended.append(number)
                return
            self.requests.append(request)
            answer = self.answer(request)
            if isinstance(answer, tuple):
                sock.sendall(answer[0])
                answer = answer[1]
            if answer is RESET:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if answer in (RESET, CLOSE):
                sock.shutdown(socket.SHUT_RDWR)
                self.hung_up.append(number)
                return
            sock.sendall(answer)  # type: ignore[arg-type]


def _read_request(reader, connection: int, number: int) -> Optional[Request]:
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = reader.readline()
        if not line:
            return None
        head += line
    request = Request(connection, number, head[:-4], b"")
    request.body = reader.read(int(request.header("content-length") or 0))
    return request


@pytest.fixture
def servers():
    made: List[Server] = []

    def make(*args, **kwargs) -> Server:
        made.append(Server(*args, **kwargs))
        return made[-1]
    yield make
    for server in made:
        server.close()


def dead_url() -> str:
    """A loopback port nothing listens on: connections are refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def transport(*urls: str, **options) -> Transport:
    """A Transport; tests that wait for a timeout give short ones, the others
    leave room for a loaded machine."""
    options.setdefault("timeout", 2)
    options.setdefault("deadline", 5)
    return Transport(list(urls), **options)


# -- retry branches -----------------------------------------------------------------

def test_a_refused_member_is_skipped_for_any_method(servers) -> None:
    live = servers()
    client = transport(dead_url(), live.url)
    assert client.post("/q", "v").index == 5  # a POST that never left is resent
    assert [r.method for r in live.requests] == [b"GET", b"POST"]  # GET /version: see below


def test_a_reset_get_is_resent_and_its_error_marked_retried(servers) -> None:
    live = servers(lambda r: RESET if r.number == 1 and r.connection == 1
                   else error(412, 101, "Compare failed"))
    with pytest.raises(CompareFailed) as raised:
        transport(live.url).put("/k", "v", prev_value="old")
    assert raised.value.retried  # the protocol may read it as its own first attempt
    assert len(live.requests) == 2


def test_a_reset_post_is_ambiguous_never_resent(servers) -> None:
    resetting, other = servers(lambda r: RESET if r.method == b"POST" else ok()), servers()
    with pytest.raises(AmbiguousWrite):
        transport(resetting.url, other.url).post("/q", "v")
    assert [r.method for r in resetting.requests] == [b"GET", b"POST"]
    assert other.requests == []


def test_a_post_goes_only_on_a_connection_the_member_answered_on(servers) -> None:
    """A member that accepts and never answers gets a probe, never the POST,
    which then goes to the next member: it is not ambiguous."""
    silent, live = servers(lambda r: b""), servers()
    client = transport(silent.url, live.url, timeout=0.3)
    assert client.post("/q", "v").index == 5
    assert [r.path for r in silent.requests] == [b"/version"]
    assert [r.path for r in live.requests] == [b"/version", b"/v2/keys/q"]
    client.post("/q", "w")  # a pooled connection has answered: no probe
    assert [r.path for r in live.requests][2:] == [b"/v2/keys/q"]


def test_a_raft_timeout_is_retried_then_unavailable_at_the_deadline(servers) -> None:
    busy = servers(lambda r: error(500, 300, "Raft Internal Error"))
    client = transport(busy.url, timeout=0.2, deadline=0.8)
    started = time.monotonic()
    with pytest.raises(Unavailable, match="Raft Internal Error"):
        client.get("/k")
    assert time.monotonic() - started < 1.5
    assert len(busy.requests) >= 2


def test_a_member_that_never_answers_times_out_then_the_next_answers(servers) -> None:
    hung, live = servers(lambda r: b""), servers()
    client = transport(hung.url, live.url, timeout=0.3, deadline=2)
    assert client.get("/k").node["value"] == "v"
    assert len(hung.requests) == 1 and len(live.requests) == 1


@pytest.mark.parametrize("reply", [
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nnot-hex\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ntoo short",  # then the server closes
    b"HTTP/1.1 200 OK\r\nX-Etcd-Index: twelve\r\nContent-Length: 2\r\n\r\n{}",
])
def test_a_malformed_or_truncated_reply_is_never_a_success(servers, reply: bytes) -> None:
    bad = servers(lambda r: (reply, CLOSE))
    with pytest.raises(Unavailable):
        transport(bad.url, timeout=0.3, deadline=0.6).get("/k")


def test_a_reply_that_is_not_json_is_unavailable_when_read(servers) -> None:
    reply = transport(servers(lambda r: ok(b"<html>proxy error</html>")).url).get("/k")
    with pytest.raises(Unavailable, match="not etcd's JSON"):
        reply.node.get("value")


def test_a_body_ended_by_close_reaches_the_caller(servers) -> None:
    body = b'{"action":"get","node":{"key":"/k","value":"to the end"}}'
    live = servers(lambda r: (b"HTTP/1.1 200 OK\r\nX-Etcd-Index: 3\r\n\r\n" + body, CLOSE))
    client = transport(live.url)
    assert client.get("/k").node["value"] == "to the end"
    assert client.get("/k").node["value"] == "to the end"  # on a new connection
    assert live.connections == 2


# -- item 2: a stream fails over like a request -------------------------------------

WATCH = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENT = b'{"action":"set","node":{"key":"/d/a","value":"1","modifiedIndex":7}}\n'


def watch_then_event(request: Request) -> bytes:
    return WATCH + b"%x\r\n%s\r\n" % (len(EVENT), EVENT)


@pytest.mark.parametrize("first", ["refused", "500"])
def test_a_stream_moves_on_to_the_next_member(servers, first: str) -> None:
    bad = dead_url() if first == "refused" else servers(
        lambda r: error(500, 300, "Raft Internal Error")).url
    stream = transport(bad, servers(watch_then_event).url).stream("/d")
    try:
        assert next(stream.blocks()) == EVENT
    finally:
        stream.release()


def test_a_stream_gives_unavailable_at_the_deadline(servers) -> None:
    started = time.monotonic()
    with pytest.raises(Unavailable):
        transport(dead_url(), dead_url(), timeout=0.5, deadline=0.5).stream("/d")
    assert time.monotonic() - started < 1.5


# -- item 3: TLS ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict:
    ca, folder = trustme.CA(), tmp_path_factory.mktemp("pki")
    files = {name: str(folder / f"{name}.pem") for name in ("ca", "other_ca", "cert", "key")}
    ca.cert_pem.write_to_path(files["ca"])
    trustme.CA().cert_pem.write_to_path(files["other_ca"])
    client = ca.issue_cert("client")
    client.cert_chain_pems[0].write_to_path(files["cert"])
    client.private_key_pem.write_to_path(files["key"])
    return {"authority": ca, **files}


def server_tls(pki: dict, require_client_cert: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    pki["authority"].issue_cert("127.0.0.1").configure_cert(context)
    if require_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        pki["authority"].configure_trust(context)
    return context


def silent_listener() -> Tuple[socket.socket, str]:
    """Accepts connections (the kernel does) and never says a word: a frozen member."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    return listener, f"https://127.0.0.1:{listener.getsockname()[1]}"


def test_a_handshake_that_times_out_moves_on_to_the_next_member(servers, pki: dict) -> None:
    listener, frozen = silent_listener()
    with listener:
        live = servers(tls=server_tls(pki))
        client = transport(frozen, live.url, ca_cert=pki["ca"], timeout=0.3, deadline=2)
        assert client.post("/q", "v").index == 5  # not sent: even a POST moves on
        with pytest.raises(Unavailable, match="(?i)handshake"):
            transport(frozen, ca_cert=pki["ca"], timeout=0.2, deadline=0.5).get("/k")


def test_a_handshake_reset_moves_on_to_the_next_member(servers, pki: dict) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    threading.Thread(target=_reset_all, args=(listener,), daemon=True).start()
    with listener:
        urls = (f"https://127.0.0.1:{listener.getsockname()[1]}",
                servers(tls=server_tls(pki)).url)
        assert transport(*urls, ca_cert=pki["ca"]).post("/q", "v").index == 5


def _reset_all(listener: socket.socket) -> None:
    while True:
        try:
            sock, _ = listener.accept()
        except OSError:
            return
        sock.recv(1)  # the ClientHello: the handshake has begun
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def test_a_wrong_ca_is_a_config_error_on_every_path(servers, pki: dict) -> None:
    live = servers(tls=server_tls(pki))
    client = transport(live.url, ca_cert=pki["other_ca"])
    for call in (lambda: client.get("/k"), lambda: client.stream("/d")):
        with pytest.raises(ConfigError, match="certificate verify failed"):
            call()
    [outcome] = client.delete_all([("/k", {"prevIndex": 3})])
    assert isinstance(outcome, ConfigError)  # never a raw TLSFailed


def test_a_missing_client_certificate_is_a_config_error(servers, pki: dict) -> None:
    live = servers(tls=server_tls(pki, require_client_cert=True))
    with pytest.raises(ConfigError, match="(?i)alert"):
        transport(live.url, ca_cert=pki["ca"]).get("/k")
    client = transport(live.url, ca_cert=pki["ca"], cert=pki["cert"], key=pki["key"])
    assert client.get("/k").node["value"] == "v"


# -- item 4: an interrupted request drops its connection -----------------------------

def test_an_interrupted_request_never_leaves_its_reply_for_the_next(servers) -> None:
    def answer(request: Request) -> bytes:
        if request.path == b"/v2/keys/slow":
            time.sleep(0.5)
            return ok(b'{"node":{"value":"slow"}}')
        return ok(b'{"node":{"value":"fast"}}')
    client = transport(servers(answer).url, timeout=2, deadline=4)
    client.get("/fast")  # a kept-alive connection to reuse

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            client.get("/slow")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert client.get("/fast").node["value"] == "fast"


# -- item 5: an idle connection the member closed is never sent on ---------------------

@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_post_after_the_member_closed_the_idle_connection_is_sent_anew(
        servers, pki: dict, scheme: str) -> None:
    # The first connection answers one request, then the member closes it (a restart does).
    live = servers(lambda r: (ok(), CLOSE) if r.connection == 1 else ok(),
                   tls=server_tls(pki) if scheme == "https" else None)
    client = transport(live.url, ca_cert=pki["ca"] if scheme == "https" else None)
    client.get("/k")
    wait_until(lambda: live.hung_up == [1], 5, message="the member to close the connection")
    assert client.post("/q", "v").index == 5  # not AmbiguousWrite
    assert [(r.connection, r.method) for r in live.requests] == [
        (1, b"GET"), (2, b"GET"), (2, b"POST")]  # a probe on the new connection, then the POST


def test_an_idle_connection_with_bytes_nobody_asked_for_is_not_reused(servers) -> None:
    stray = ok(b'{"node":{"value":"stray"}}')
    live = servers(lambda r: ok() + stray if r.connection == 1 else ok(b'{"node":{"value":"own"}}'))
    client = transport(live.url)
    client.get("/k")  # the stray reply came in the same send
    assert client.get("/k").node["value"] == "own"


# -- item 8: one pool of connections for all threads ----------------------------------

@pytest.mark.parametrize("scheme", ["http", "https"])
def test_short_lived_threads_reuse_one_connection(servers, pki: dict, scheme: str) -> None:
    live = servers(tls=server_tls(pki) if scheme == "https" else None)
    client = transport(live.url, ca_cert=pki["ca"] if scheme == "https" else None)
    for _ in range(30):
        thread = threading.Thread(target=client.get, args=("/k",))
        thread.start()
        thread.join()
    assert len(live.requests) == 30
    assert live.connections == 1


def test_connections_are_bounded_by_the_requests_in_flight_and_close_ends_them(
        servers) -> None:
    live = servers(lambda r: (time.sleep(0.01), ok())[1])
    client = transport(live.url, timeout=2, deadline=4)
    done, stay = threading.Barrier(7), threading.Event()

    def work() -> None:
        for _ in range(15):
            client.get("/k")
        done.wait()
        stay.wait(10)  # the thread lives on: its connections are not its own
    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    done.wait()
    assert len(live.requests) == 90
    assert live.connections <= 6
    client.close()  # closes every pooled connection, whichever thread opened it
    wait_until(lambda: len(live.ended) == live.connections, 5, message="every connection closed")
    stay.set()
    for thread in threads:
        thread.join()


def test_parallel_deletes_take_several_connections_and_give_them_back(servers) -> None:
    live = servers(lambda r: ok(b'{"action":"compareAndDelete"}'))
    client = transport(live.url)
    for _ in range(3):
        outcomes = client.delete_all([("/a", {"prevIndex": 1}), ("/b", {"prevValue": "x"})])
        assert [o.index for o in outcomes] == [5, 5]  # type: ignore[union-attr]
    assert live.connections == 2


def test_a_connection_in_use_when_the_transport_closes_is_closed_after_its_reply(
        servers) -> None:
    release = threading.Event()
    live = servers(lambda r: (release.wait(5), ok())[1])
    client = transport(live.url, timeout=5, deadline=5)
    thread = threading.Thread(target=client.get, args=("/k",))
    thread.start()
    wait_until(lambda: live.requests, 5, message="the request to arrive")
    client.close()
    release.set()
    thread.join()
    wait_until(lambda: live.ended == [1], 5, message="the connection to be closed")


# -- pipelines: many requests in flight (put_many's in_flight) -----------------------

def _posts(count: int) -> List[Tuple[str, str, Optional[str]]]:
    return [("POST", "/v2/keys/q", f"value={n}") for n in range(count)]


def _member(url: str) -> Member:
    return Member(url, tls=None, username=None, password=None)


def test_a_pipeline_answers_each_request_in_order_on_its_lanes(servers) -> None:
    echo = servers(lambda r: ok(r.body) if r.method == b"POST" else ok())
    member = _member(echo.url)
    first = member.pipeline(_posts(20), 2.0, lanes=3, depth=2)
    for lane in range(1, 4):  # each lane carried its requests in the order given
        sent = [int(r.body[6:]) for r in echo.requests if r.connection == lane and r.body]
        assert sent and sent == sorted(sent)
    second = member.pipeline(_posts(20), 2.0, lanes=3, depth=2)
    for piped in (first, second):
        assert [reply.body for reply, _ in piped] == [b"value=%d" % n for n in range(20)]
        assert all(seconds >= 0 for _, seconds in piped)
    assert echo.connections == 3  # kept alive, and used again by the second pipeline
    assert [r.path for r in echo.requests if r.method == b"GET"] == [b"/version"] * 3


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_pipeline_reads_replies_that_came_in_one_piece(
        servers, pki: dict, scheme: str) -> None:
    """Two replies in one write come in one read: a poll of the socket then shows
    nothing for the second, which the lane must take from its buffer."""
    def answer(request: Request) -> bytes:
        if request.method != b"POST":
            return ok()
        number = int(request.body[6:])
        return b"" if number % 2 == 0 else ok(b"%d" % (number - 1)) + ok(b"%d" % number)
    tls = scheme == "https"
    echo = servers(answer, tls=server_tls(pki) if tls else None)
    member = Member(echo.url, tls=tls_context(pki["ca"], None, None) if tls else None,
                    username=None, password=None)
    piped = member.pipeline(_posts(10), 2.0, lanes=1, depth=2)
    assert [reply.body for reply, _ in piped] == [b"%d" % n for n in range(10)]


def test_a_pipeline_sends_nothing_more_after_a_connection_fails(servers) -> None:
    resetting = servers(lambda r: RESET if r.body == b"value=4" else ok())
    piped = _member(resetting.url).pipeline(_posts(12), 2.0, lanes=2, depth=1)
    outcomes = [outcome for outcome, _ in piped]
    assert all(isinstance(o, Response) for o in outcomes[:4])
    assert isinstance(outcomes[4], Lost)  # it may have applied
    # The window (2) let value=5 go out with value=4; nothing after them went.
    assert all(isinstance(o, NotSent) for o in outcomes[6:])
    assert {r.body for r in resetting.requests} <= {b"", *(b"value=%d" % n for n in range(6))}


def test_a_pipeline_sends_nothing_more_after_an_error_reply(servers) -> None:
    busy = servers(lambda r: error(500, 300, "Raft Internal Error") if r.body == b"value=3"
                   else ok())
    outcomes = [o for o, _ in _member(busy.url).pipeline(_posts(10), 2.0, lanes=2, depth=1)]
    assert isinstance(outcomes[3], Response) and outcomes[3].status == 500
    assert all(isinstance(o, NotSent) for o in outcomes[5:])


def test_a_pipeline_lane_whose_reply_never_comes_times_out(servers) -> None:
    silent = servers(lambda r: b"" if r.body == b"value=1" else ok())
    started = time.monotonic()
    outcomes = [o for o, _ in _member(silent.url).pipeline(_posts(4), 0.3, lanes=2, depth=1)]
    assert isinstance(outcomes[1], Lost) and outcomes[1].timed_out
    assert time.monotonic() - started < 2


def test_post_many_never_resends_a_post_whose_reply_was_lost(servers) -> None:
    resetting = servers(lambda r: RESET if r.body.startswith(b"value=2&") else ok())
    results = transport(resetting.url).post_many("/q", [str(n) for n in range(8)],
                                                 lanes=2, depth=1)
    assert [getattr(result, "index", None) for result in results[:2]] == [5, 5]
    assert isinstance(results[2], AmbiguousWrite)
    assert results[-1] is None  # not sent: the caller settles value=2 first
    assert [r.body for r in resetting.requests].count(b"value=2&noValueOnSuccess=true") == 1


def test_post_many_moves_on_to_the_next_member_when_none_can_be_reached(servers) -> None:
    live = servers()
    results = transport(dead_url(), live.url).post_many("/q", ["a", "b", "c"], lanes=2,
                                                        depth=1)
    assert [getattr(result, "index", None) for result in results] == [5, 5, 5]
    assert sorted(r.body for r in live.requests if r.method == b"POST") == \
        [b"value=%s&noValueOnSuccess=true" % v for v in (b"a", b"b", b"c")]


# -- item 9: endpoints --------------------------------------------------------------

def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_endpoint_connects_and_sends_a_bracketed_host(servers) -> None:
    live = servers(host="::1")
    assert transport(live.url).get("/k").node["value"] == "v"
    port = live.url.rsplit(":", 1)[1]
    assert live.requests[0].header("host") == f"[::1]:{port}"


def test_a_non_ascii_host_is_sent_in_its_idna_form() -> None:
    member = Member("http://bücher.example:2379", tls=None, username=None, password=None)
    assert member._encode("GET", "/v2/keys/", None).startswith(
        b"GET /v2/keys/ HTTP/1.1\r\nHost: xn--bcher-kva.example:2379\r\n")


@pytest.mark.parametrize("host", ["ü" * 64 + ".example", "a" * 64 + ".example", "a..b"])
def test_a_host_name_idna_cannot_encode_is_a_config_error(host: str) -> None:
    with pytest.raises(ConfigError):
        transport(f"http://{host}:2379").get("/k")
