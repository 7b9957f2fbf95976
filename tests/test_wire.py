"""Fast tests of the HTTP layer, with no etcd: wire.py's framing against h11.

The framing tests feed generated replies to :class:`wire.Connection` through
a fake socket, split at arbitrary byte boundaries, and to h11 (the reference
parser); the two must agree on the status, the headers wire reads and the
body, and both must reject a reply cut short.
"""
from __future__ import annotations

import socket
import urllib.parse
from typing import Dict, List, Optional, Tuple

import h11
import pytest
from hypothesis import given, settings, strategies as st

from etcdq_v2.transport import _FORM_QUOTING, _PATH_QUOTING, _path, _quote
from etcdq_v2.wire import Connection, Lost

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
