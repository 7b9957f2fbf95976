"""Bad input gets the library's own errors, before anything is written."""
from __future__ import annotations

import math
import string
import subprocess
import time
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from etcdq_v2 import (ConfigError, EtcdqError, InvalidName, InvalidPayload, PayloadTooLarge,
                      Queue, Unavailable, connect)
from etcdq_v2.errors import KeyMissing
from etcdq_v2.keys import Layout, check_item_id
from etcdq_v2.server import EtcdServer, free_port

from helpers import wait_until

NAME_CHARS = string.ascii_letters + string.digits + "._-"
SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a?b", "a#b", "a%2Fb", "sp ace",
                                  "ü", "x" * 129, "new\nline", None, 7])
def test_invalid_queue_names_fail_before_any_network_call(name: object) -> None:
    unreachable = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(InvalidName) as info:
        Queue(unreachable, name)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError) and isinstance(info.value, EtcdqError)
    assert time.monotonic() - started < 0.5


@given(st.text(min_size=1, max_size=130))
@SETTINGS
def test_any_name_is_accepted_exactly_when_it_is_a_safe_segment(name: str) -> None:
    safe = set(name) <= set(NAME_CHARS) and len(name) <= 128 and name not in (".", "..")
    try:
        layout = Layout("/etcdq", name)
    except InvalidName:
        assert not safe
        return
    assert safe
    assert layout.work == f"/etcdq/{name}/work"
    assert layout.split(f"{layout.work}/{'1' * 20}") == ("work", "1" * 20)


@given(st.text(max_size=25))
@SETTINGS
def test_item_ids_are_twenty_digits_or_refused(text: str) -> None:
    try:
        check_item_id(text)
    except InvalidName:
        assert not (len(text) == 20 and text.isascii() and text.isdigit())
    else:
        assert len(text) == 20 and text.isascii() and text.isdigit()


@pytest.mark.parametrize("prefix", ["", "etcdq", "/", "/a/../b", "/a b", "/_x?"])
def test_invalid_prefixes(prefix: str) -> None:
    with pytest.raises(InvalidName):
        Layout(prefix, "q")


def test_prefix_is_normalised() -> None:
    assert Layout("/apps//jobs/", "q").root == "/apps/jobs/q"


@pytest.fixture
def queue(etcd_url: str, queue_name: str):
    with Queue(etcd_url, queue_name, max_payload_bytes=4096) as q:
        yield q


@pytest.mark.parametrize("payload", [math.nan, math.inf, object(), {1j: 2}, "\ud800", {"s": {1, 2}}])
def test_unencodable_payloads_write_nothing(queue: Queue, payload: object) -> None:
    with pytest.raises(InvalidPayload):
        queue.put(payload)
    assert queue.stats()["pending"] == 0


def test_oversized_payloads_write_nothing(queue: Queue) -> None:
    queue.put("x" * 3000)
    with pytest.raises(PayloadTooLarge):
        queue.put("x" * 5000)
    with pytest.raises(PayloadTooLarge):
        queue.put(b"\x00" * 4000)  # base64 grows it past the limit
    with pytest.raises(PayloadTooLarge):
        queue.put_many(["ok", "y" * 5000])  # all checked before the first write
    assert queue.stats()["pending"] == 1


def nested(depth: int) -> object:
    payload: object = 0
    for _ in range(depth):
        payload = [payload]
    return payload


def test_payloads_nested_deeper_than_the_limit_write_nothing(queue: Queue) -> None:
    """A payload a producer can encode may be too deep for a claimer to decode
    (json.loads recurses per level, deeper in its stack): put refuses one
    nested beyond MAX_DEPTH (lists and objects), whatever its size, and a
    claimer gets every payload put accepted."""
    from etcdq_v2.codec import MAX_DEPTH
    for payload in (nested(MAX_DEPTH + 1), {"k": nested(MAX_DEPTH)}, nested(951),
                    nested(100_000)):
        with pytest.raises(InvalidPayload, match="nested"):
            queue.put(payload)
    with pytest.raises(InvalidPayload, match="nested"):
        queue.put_many(["ok", nested(MAX_DEPTH + 1)])  # all checked before the first write
    assert queue.stats()["pending"] == 0
    item_id = queue.put(nested(MAX_DEPTH))
    claim = queue.claim()
    assert claim.id == item_id and claim.payload == nested(MAX_DEPTH)
    with pytest.raises(InvalidPayload, match="nested"):
        claim.complete(nested(MAX_DEPTH + 1))  # a result too: refused before F1
    claim.complete(nested(MAX_DEPTH))
    assert queue.get(item_id).result == nested(MAX_DEPTH)


def test_default_limit_is_one_mebibyte(etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name) as queue:
        item_id = queue.put(b"\x01" * 700_000)
        with pytest.raises(PayloadTooLarge):
            queue.put(b"\x01" * 800_000)
        claim = queue.claim()
        assert claim.id == item_id and claim.payload == b"\x01" * 700_000
        claim.complete()


@given(st.one_of(
    st.binary(max_size=300),
    st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                 allow_infinity=False) | st.text(max_size=40),
                 lambda children: st.lists(children, max_size=4)
                 | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=12)))
@SETTINGS
def test_payloads_round_trip_or_are_refused(queue: Queue, payload: object) -> None:
    try:
        item_id = queue.put(payload)
    except InvalidPayload:
        assert queue.stats()["pending"] == 0
        return
    info = queue.get(item_id)
    assert info.payload == payload and type(info.payload) is type(payload)
    queue.etcd.delete(queue.layout.key("work", item_id))


def test_bad_endpoints_and_options_are_config_errors() -> None:
    for endpoints in ["", "127.0.0.1:2379", "ftp://a:1", "http://a", "http://a:1/path"]:
        with pytest.raises(ConfigError):
            connect(endpoints)
    with pytest.raises(ConfigError):
        connect("https://127.0.0.1:2379", ca_cert="/nonexistent/ca.pem")
    with pytest.raises(ConfigError):
        connect("http://127.0.0.1:2379", username="only-a-user")
    with pytest.raises(ConfigError):
        Queue("http://127.0.0.1:2379", "q", lock_ttl=0)


def test_unreachable_etcd_raises_unavailable_in_bounded_time(queue_name: str) -> None:
    client = connect(f"http://127.0.0.1:{free_port()},http://127.0.0.1:{free_port()}",
                     timeout=0.5, deadline=2)
    queue = Queue(client, queue_name)
    for call in (lambda: queue.put("x"), queue.claim, queue.stats):
        started = time.monotonic()
        with pytest.raises(Unavailable):
            call()
        assert time.monotonic() - started < 4
    queue.close()


def test_etcd_without_the_v2_api_is_a_clear_config_error(tmp_path, etcd_binary: str) -> None:
    server = EtcdServer(tmp_path / "v3only", binary=etcd_binary)
    command = [arg for arg in server.command() if arg != "--enable-v2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: urllib.request.urlopen(server.url + "/health", timeout=1), 20,
                   ignore=(OSError,), message="etcd without v2 to start")
        with pytest.raises(ConfigError, match="--enable-v2"):
            Queue(server.url, "q").put("x")
    finally:
        process.kill()
        process.wait()


@given(st.text(max_size=40))
@SETTINGS
def test_any_item_id_given_to_show_or_requeue_is_refused_or_not_found(
        queue: Queue, text: str) -> None:
    from etcdq_v2 import NotFound
    for call in (queue.get, queue.requeue):
        with pytest.raises((InvalidName, NotFound)):
            call(text)
    # Nothing was written: the queue's directory was never even created.
    with pytest.raises(KeyMissing):
        queue.etcd.get(queue.layout.root)
