"""The web dashboard against a real etcd: its JSON API over HTTP, and its page in Chromium.

The API tests speak HTTP with urllib, as any client would: the counts, the
running items and the dead letters the page shows must be what the queue
holds (checked through the Python API), the reads of etcd are shared by every
page, and every way a cross-site request or a request without the token can
arrive is refused before anything is written.

The browser tests load the page in a headless Chromium (Debian's
``chromium``), driven over the DevTools protocol (tests/cdp.py): the page
shows the queues and counts, updates live, asks for the token, and its
requeue button brings a dead letter back.  Without Chromium they are skipped
with the reason.  One of them takes the screenshot in the README,
docs/dashboard.png (written there with ETCDQ_SCREENSHOT=1).
"""
from __future__ import annotations

import json
import os
import re
import secrets
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from etcdq_v2 import ConfigError, InvalidName, Queue, connect
from etcdq_v2.dashboard import Dashboard
from etcdq_v2.dashboard.server import STATIC

from cdp import Chromium, Page, find_chromium
from crashes import commit_then_crash
from faultproxy import FaultProxy
from helpers import wait_until

ROOT = Path(__file__).resolve().parent.parent
#: The README's screenshot.  The test rewrites it only when asked
#: (ETCDQ_SCREENSHOT=1), so that a test run leaves the checkout unchanged.
SCREENSHOT = ROOT / "docs" / "dashboard.png"
BOUND = 15.0

Reply = Tuple[int, Dict[str, str], Any]
MakeQueue = Callable[..., Queue]
MakeDashboard = Callable[..., Dashboard]


# --------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------

@pytest.fixture
def prefix() -> str:
    """A prefix of this test's own, so that only its queues are under it."""
    return f"/t-dashboard-{secrets.token_hex(4)}"


@pytest.fixture
def make_queue(etcd_url: str, prefix: str) -> Iterator[MakeQueue]:
    queues: List[Queue] = []

    def make(name: str, **options: Any) -> Queue:
        options.setdefault("max_attempts", 1)
        queues.append(Queue(etcd_url, name, prefix=prefix, **options))
        return queues[-1]

    yield make
    for queue in queues:
        queue.close()


@pytest.fixture
def make_dashboard(etcd_url: str, prefix: str) -> Iterator[MakeDashboard]:
    """``make(**options)``: a started Dashboard on a free port of 127.0.0.1."""
    boards: List[Dashboard] = []

    def make(client: Any = None, **options: Any) -> Dashboard:
        options.setdefault("interval", 0.2)
        boards.append(Dashboard(client or etcd_url, prefix=prefix, port=0, **options).start())
        return boards[-1]

    yield make
    for board in boards:
        board.close()


def call(url: str, *, method: str = "GET", body: Optional[bytes] = None,
         headers: Optional[Dict[str, str]] = None) -> Reply:
    """``(status, headers, JSON or bytes)`` of one request; error statuses too."""
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=BOUND) as reply:
            status, found, data = reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as error:
        status, found, data = error.code, dict(error.headers), error.read()
    if found.get("Content-Type", "").startswith("application/json"):
        return status, found, json.loads(data)
    return status, found, data


def overview(board: Dashboard, token: Optional[str] = None) -> Dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    status, _, document = call(board.url + "api/overview", headers=headers)
    assert status == 200, document
    return document  # type: ignore[no-any-return]


def fresh_overview(board: Dashboard, check: Callable[[Dict[str, Any]], bool]
                   ) -> Dict[str, Any]:
    """The first overview ``check`` accepts (snapshots are up to ``interval`` old)."""
    return wait_until(lambda: (lambda doc: doc if check(doc) else None)(overview(board)),
                      BOUND, message="an overview showing the expected state")


def queue_doc(document: Dict[str, Any], name: str) -> Dict[str, Any]:
    return next(q for q in document["queues"] if q["name"] == name)


def csrf_of(board: Dashboard) -> str:
    """The CSRF token, read from the page as the page's script reads it."""
    page = call(board.url)[2].decode("utf-8")
    match = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert match, "the page carries no CSRF token"
    return match.group(1)


def action(board: Dashboard, path: str, request: Dict[str, Any], **headers: str) -> Reply:
    """A POST as the page sends it: JSON, the CSRF token, the page's own Origin."""
    host = board.url.split("/")[2]
    sent = {"Content-Type": "application/json", "X-CSRF-Token": csrf_of(board),
            "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"}
    sent.update({name.replace("_", "-"): value for name, value in headers.items()})
    sent = {name: value for name, value in sent.items() if value != "-"}  # "-": leave out
    return call(board.url + path.lstrip("/"), method="POST",
                body=json.dumps(request).encode(), headers=sent)


def dead_letter(queue: Queue, payload: Any, reason: str) -> str:
    """An item failed at its only attempt: a dead letter with ``reason``."""
    item_id = queue.put(payload)
    claim = queue.claim(timeout=BOUND)
    assert claim is not None and claim.id == item_id
    claim.fail(reason)
    return item_id


def complete(queue: Queue, count: int) -> None:
    for n in range(count):
        queue.put({"done": n})
        claim = queue.claim(timeout=BOUND)
        assert claim is not None
        claim.complete()


# --------------------------------------------------------------------------
# The JSON API
# --------------------------------------------------------------------------

def test_overview_lists_the_queues_under_the_prefix_with_their_counts(
        make_queue: MakeQueue, make_dashboard: MakeDashboard, prefix: str) -> None:
    alpha, beta = make_queue("alpha"), make_queue("beta")
    dead_letter(alpha, "bad", "boom")
    complete(alpha, 2)
    alpha.put_many(["a1", "a2", "a3"])
    held = alpha.claim(timeout=BOUND)
    alpha.put("later", delay=60)  # held by a delay lock: pending, not running
    beta.put("b1")
    # A key that is not a queue directory is not a queue.
    alpha.etcd.put(f"{prefix}/notes", "not a queue")
    document = overview(make_dashboard())
    assert [q["name"] for q in document["queues"]] == ["alpha", "beta"]
    assert queue_doc(document, "alpha")["counts"] == alpha.stats() == \
        {"pending": 3, "running": 1, "completed": 2, "failed": 1}
    assert queue_doc(document, "beta")["counts"] == beta.stats()
    assert document["prefix"] == prefix and document["actions"] is False
    assert held is not None


def test_a_crashed_finishers_commit_counts_as_finished(make_queue: MakeQueue,
                                                      make_dashboard: MakeDashboard) -> None:
    """Items whose finisher died after F1 (or F2): finished, as stats() counts them."""
    jobs = make_queue("jobs")
    jobs.put_many(["recorded", "committed"])
    commit_then_crash(jobs, "completed", record=True)    # in work/ and completed/: once
    failed = commit_then_crash(jobs, "failed", record=False)  # in work/ only, "o": failed
    document = queue_doc(overview(make_dashboard()), "jobs")
    assert document["counts"] == jobs.stats() == \
        {"pending": 0, "running": 0, "completed": 1, "failed": 1}
    assert document["running"] == []
    assert [(d["id"], d["reason"]) for d in document["dead_letters"]] == [(failed, "boom")]


def test_finished_items_whose_locks_linger_are_not_shown_running(
        make_queue: MakeQueue, make_dashboard: MakeDashboard) -> None:
    """F4 is skipped (lock_ttl 30 s): the locks of a completed item and
    of a dead letter are still in locks/, for items no longer in work/."""
    jobs = make_queue("jobs")
    complete(jobs, 1)
    dead = dead_letter(jobs, "bad", "boom")
    jobs.put("waiting")
    assert len(jobs._protocol.list("locks")[1]) == 2  # both finishers' locks linger
    document = queue_doc(overview(make_dashboard()), "jobs")
    assert document["running"] == []
    assert document["counts"] == jobs.stats() == \
        {"pending": 1, "running": 0, "completed": 1, "failed": 1}
    assert [d["id"] for d in document["dead_letters"]] == [dead]


def test_an_empty_prefix_has_no_queues(make_dashboard: MakeDashboard) -> None:
    document = overview(make_dashboard())
    assert document["queues"] == [] and document["error"] is None


def test_running_items_show_their_node_attempt_and_age(make_queue: MakeQueue,
                                                       make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs", node_id="worker-7", max_attempts=3, backoff=[0])
    first, second = jobs.put_many(["first", "second"])
    before = jobs.claim(timeout=BOUND)
    assert before is not None and before.id == first
    board = make_dashboard()
    running = queue_doc(overview(board), "jobs")["running"]
    assert [(r["id"], r["node"], r["attempt"]) for r in running] == [(first, "worker-7", 1)]
    # Running before the dashboard's first look: its age is a lower bound.
    assert running[0]["age_is_minimum"] is True and 0 < running[0]["lock_ttl"] <= 30
    # A second attempt, claimed while the dashboard watches: a true age, which grows.
    again = jobs.claim(timeout=BOUND)
    assert again is not None and again.id == second
    again.fail("retry me")
    third = jobs.claim(timeout=BOUND)
    assert third is not None and third.id == second and third.attempt == 2
    seen = fresh_overview(board, lambda doc: any(
        r["id"] == second and r["attempt"] == 2 and r["age"] >= 0.6
        for r in queue_doc(doc, "jobs")["running"]))
    now = {r["id"]: r for r in queue_doc(seen, "jobs")["running"]}
    assert now[second]["age_is_minimum"] is False and now[second]["node"] == "worker-7"
    assert now[first]["age"] >= now[second]["age"]
    before.complete()
    third.complete()
    assert fresh_overview(board, lambda doc: queue_doc(doc, "jobs")["running"] == [])


def test_dead_letters_carry_their_reasons(make_queue: MakeQueue,
                                          make_dashboard: MakeDashboard) -> None:
    mail = make_queue("mail", node_id="mailer-1")
    older = dead_letter(mail, {"to": "ada@example.com"}, "SMTP 550: no such user")
    newer = dead_letter(mail, b"\x00\x01\x02", "binary junk")
    cancelled = mail.put({"to": "bob@example.com"})
    assert mail.cancel(cancelled)
    dead = queue_doc(overview(make_dashboard()), "mail")["dead_letters"]
    # Newest first, each with its reason, attempts, node and a payload preview.
    assert [(d["id"], d["reason"]) for d in dead] == [
        (cancelled, "cancelled"), (newer, "binary junk"), (older, "SMTP 550: no such user")]
    assert dead[2]["attempts"] == 1 and dead[2]["node"] == "mailer-1"
    assert dead[2]["payload"] == '{"to": "ada@example.com"}'
    assert dead[1]["payload"] == "<3 bytes>"
    assert all(d["finished"] and abs(d["finished"] - time.time()) < 60 for d in dead)


def test_dead_letters_carry_the_traceback_of_their_handler(make_queue: MakeQueue,
                                                          make_dashboard: MakeDashboard) -> None:
    mail = make_queue("mail")
    item_id = mail.put({"to": "ada@example.com"})
    claim = mail.claim(timeout=BOUND)
    assert claim is not None
    claim.fail("ValueError: no such user", traceback="Traceback (most recent call last):\n"
               '  File "send.py", line 3, in send\nValueError: no such user\n')
    plain = dead_letter(mail, "x", "no traceback")
    dead = {d["id"]: d for d in queue_doc(overview(make_dashboard()), "mail")["dead_letters"]}
    assert dead[item_id]["traceback"].endswith("ValueError: no such user\n")
    assert dead[plain]["traceback"] is None
    script = (STATIC / "app.js").read_text()
    assert "dead.traceback" in script and "pre.textContent = text" in script  # shown as text


def test_an_item_looked_up_by_a_requeued_id_is_followed(make_queue: MakeQueue,
                                                        make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs")
    old = dead_letter(jobs, {"n": 1}, "boom")
    new = jobs.requeue(old)
    board = make_dashboard()
    status, _, item = call(f"{board.url}api/item?queue=jobs&id={old}")
    assert status == 200, item
    assert (item["id"], item["state"], item["requeued_from"]) == (new, "pending", [old])
    assert item["payload"] == '{"n": 1}'
    status, _, answer = call(f"{board.url}api/item?queue=jobs&id={'9' * 20}")
    assert status == 404 and "no item" in answer["error"]
    status, _, answer = call(f"{board.url}api/item?queue=jobs")
    assert status == 400 and "?queue=Q&id=ID" in answer["error"]


def test_throughput_counts_records_by_their_finish_time(make_queue: MakeQueue,
                                                        make_dashboard: MakeDashboard) -> None:
    a, b = make_queue("a"), make_queue("b")
    complete(a, 3)
    complete(b, 2)
    dead_letter(b, "x", "no")
    board = make_dashboard(window=60, bucket=10)
    document = overview(board)
    throughput = document["throughput"]
    assert len(throughput["completed"]) == len(throughput["failed"]) == 6
    assert throughput["bucket"] == 10
    # Everything finished moments ago: in the newest buckets, summed over the queues.
    assert sum(throughput["completed"][-2:]) == sum(throughput["completed"]) == 5
    assert sum(throughput["failed"]) == 1
    assert sum(queue_doc(document, "a")["throughput"]["completed"]) == 3
    assert throughput["start"] <= time.time() - 50


def test_many_pages_share_one_read_of_etcd(etcd_url: str, make_queue: MakeQueue,
                                           make_dashboard: MakeDashboard) -> None:
    make_queue("one").put(1)
    make_queue("two").put(2)
    transport = connect(etcd_url)
    try:
        board = make_dashboard(transport, interval=30)
        results: List[int] = []
        threads = [threading.Thread(target=lambda: results.append(call(
            board.url + "api/overview")[0])) for _ in range(20)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(BOUND)
        assert results == [200] * 20
        # One round: the prefix, then one GET of each of the 2 queues.
        assert board.snapshots.rounds == 1
        assert sum(transport.requests.values()) == 1 + 2
    finally:
        transport.close()


def test_an_etcd_outage_is_shown_and_survived(etcd_url: str, make_queue: MakeQueue,
                                              make_dashboard: MakeDashboard,
                                              proxy: FaultProxy) -> None:
    make_queue("jobs").put(1)
    transport = connect(proxy.url, timeout=0.5, deadline=1.0)
    try:
        board = make_dashboard(transport)
        assert queue_doc(overview(board), "jobs")["counts"]["pending"] == 1
        proxy.refuse()
        status, _, document = wait_until(
            lambda: (lambda reply: reply if reply[0] == 503 else None)(
                call(board.url + "api/overview")), BOUND, message="a 503")
        # The last good numbers stay, with etcd's error beside them.
        assert document["error"] and queue_doc(document, "jobs")["counts"]["pending"] == 1
        proxy.restart()
        assert wait_until(lambda: call(board.url + "api/overview")[0] == 200, BOUND)
    finally:
        transport.close()


# --------------------------------------------------------------------------
# Actions and their protection
# --------------------------------------------------------------------------

def test_actions_are_refused_unless_allowed(make_queue: MakeQueue,
                                            make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs")
    item = dead_letter(jobs, "x", "boom")
    board = make_dashboard()
    status, _, answer = action(board, "api/requeue", {"queue": "jobs", "id": item})
    assert status == 403 and "--allow-actions" in answer["error"]
    status, _, answer = action(board, "api/purge", {"queue": "jobs", "kind": "failed"})
    assert status == 403
    assert jobs.stats()["failed"] == 1 and overview(board)["actions"] is False


def test_requeue_and_purge_with_actions_allowed(make_queue: MakeQueue,
                                                make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs")
    item = dead_letter(jobs, {"n": 1}, "boom")
    complete(jobs, 2)
    board = make_dashboard(allow_actions=True)
    status, _, answer = action(board, "api/requeue", {"queue": "jobs", "id": item})
    assert status == 200, answer
    assert jobs.get(answer["new_id"]).state == "pending"
    assert [i.payload for i in jobs.items("pending")] == [{"n": 1}]
    status, _, answer = action(board, "api/purge", {"queue": "jobs", "kind": "completed"})
    assert (status, answer["removed"]) == (200, 2) and jobs.stats()["completed"] == 0
    # The next overview shows it at once: an action drops the cached snapshot.
    assert queue_doc(overview(board), "jobs")["counts"]["pending"] == 1


@pytest.mark.parametrize("request_, status", [
    ({"queue": "jobs", "id": "00000000000000000001"}, 404),
    ({"queue": "jobs"}, 400),
    ({"queue": "../jobs", "id": "00000000000000000001"}, 400),
    ({"queue": "jobs", "kind": "everything"}, 400),
], ids=["unknown item", "no id", "bad queue name", "bad purge kind"])
def test_bad_actions_get_a_clear_error(make_queue: MakeQueue, make_dashboard: MakeDashboard,
                                       request_: Dict[str, Any], status: int) -> None:
    make_queue("jobs").put(1)
    board = make_dashboard(allow_actions=True)
    path = "api/purge" if "kind" in request_ else "api/requeue"
    got, _, answer = action(board, path, request_)
    assert got == status and answer["error"], answer


CROSS_SITE = {
    # What another site's page (or a DNS-rebound name) could send.
    "no CSRF header": ({"X_CSRF_Token": "-"}, 403),
    "wrong CSRF token": ({"X_CSRF_Token": "guessed"}, 403),
    "form-encoded body": ({"Content_Type": "application/x-www-form-urlencoded"}, 415),
    "text/plain body": ({"Content_Type": "text/plain"}, 415),
    "foreign Origin": ({"Origin": "http://evil.example"}, 403),
    "https Origin of another host": ({"Origin": "https://evil.example"}, 403),
    "null Origin": ({"Origin": "null"}, 403),
    "cross-site fetch": ({"Sec_Fetch_Site": "cross-site"}, 403),
    "rebound Host": ({"Host": "evil.example", "Origin": "http://evil.example"}, 403),
}


@pytest.mark.parametrize("case", sorted(CROSS_SITE))
def test_cross_site_requests_change_nothing(case: str, make_queue: MakeQueue,
                                            make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs")
    item = dead_letter(jobs, "x", "boom")
    board = make_dashboard(allow_actions=True)
    headers, expected = CROSS_SITE[case]
    status, _, answer = action(board, "api/requeue", {"queue": "jobs", "id": item}, **headers)
    assert status == expected, answer
    assert jobs.stats() == {"pending": 0, "running": 0, "completed": 0, "failed": 1}


def test_a_form_post_from_another_site_is_refused(make_queue: MakeQueue,
                                                  make_dashboard: MakeDashboard) -> None:
    """What an HTML form on another site sends: form-encoded, its own Origin, no header."""
    jobs = make_queue("jobs")
    item = dead_letter(jobs, "x", "boom")
    board = make_dashboard(allow_actions=True)
    status, _, _ = call(board.url + "api/requeue", method="POST",
                        body=f"queue=jobs&id={item}".encode(),
                        headers={"Origin": "http://evil.example"})
    assert status == 403 and jobs.stats()["failed"] == 1


def raw_exchange(port: int, data: bytes, wait: float = 3.0) -> bytes:
    """Send ``data`` on one connection; all the server sends back until it closes the
    connection or goes quiet for ``wait`` seconds."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as sock:
        sock.sendall(data)
        received = b""
        while True:
            try:
                block = sock.recv(65536)
            except socket.timeout:
                break
            if not block:
                return received
            received += block
    return received


def refused_with_a_body(case: str, port: int, hidden: bytes) -> bytes:
    """A request the dashboard refuses before reading its body, whose body is ``hidden``."""
    if case == "Host refused":
        return (f"POST /api/requeue HTTP/1.1\r\nHost: rebound.example:{port}\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(hidden)}\r\n\r\n"
                ).encode() + hidden
    if case == "413":  # what a cross-site text/plain POST can send without a preflight
        return (f"POST /api/requeue HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Origin: http://evil.example\r\nContent-Type: text/plain\r\n"
                f"Content-Length: 70000\r\n\r\n").encode() + hidden + b"x" * (70_000 - len(hidden))
    return (f"POST /api/requeue HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Transfer-Encoding: chunked\r\n\r\n").encode() + hidden


@pytest.mark.parametrize("case", ["Host refused", "413", "chunked"])
def test_a_request_hidden_in_a_refused_requests_body_is_not_served(
        case: str, make_queue: MakeQueue, make_dashboard: MakeDashboard) -> None:
    """A request refused before its body is read ends its connection: the unread body,
    here a request for the overview without any browser header, is never parsed as the
    next request."""
    dead_letter(make_queue("jobs"), {"secret": "s3cr3t"}, "boom")
    board = make_dashboard(allow_actions=True)
    port = int(board.url.rsplit(":", 1)[1].strip("/"))
    hidden = f"GET /api/overview HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode()
    received = raw_exchange(port, refused_with_a_body(case, port, hidden))
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", received)
    assert b"s3cr3t" not in received and len(statuses) == 1, (statuses, received[-300:])
    assert b"Connection: close" in received


# --------------------------------------------------------------------------
# Binding and the token
# --------------------------------------------------------------------------

def test_it_binds_loopback_without_a_token_by_default(etcd_url: str) -> None:
    with Dashboard(etcd_url, port=0) as board:
        assert board.url.startswith("http://127.0.0.1:") and board.token is None


def test_a_dashboard_bound_to_another_loopback_address_serves_its_own_url(
        make_queue: MakeQueue, etcd_url: str, prefix: str) -> None:
    """127.0.0.2 is loopback (no token): the Host check accepts the URL the dashboard
    itself gives, not only 127.0.0.1 and localhost."""
    make_queue("jobs").put("x")
    with Dashboard(etcd_url, prefix=prefix, bind="127.0.0.2", port=0).start() as board:
        assert board.token is None and board.url.startswith("http://127.0.0.2:")
        status, _, document = call(board.url + "api/overview")
    assert status == 200, document


def test_a_non_local_bind_requires_the_token(make_queue: MakeQueue,
                                            make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs")
    item = dead_letter(jobs, "x", "boom")
    board = make_dashboard(bind="0.0.0.0", allow_actions=True)
    token = board.token
    assert token and len(token) >= 16 and board.token_generated
    status, headers, _ = call(board.url + "api/overview")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert call(board.url + "api/overview", headers={"Authorization": "Bearer nope"})[0] == 401
    # The page itself holds no data: it is served, and asks for the token.
    status, _, page = call(board.url)
    assert status == 200 and b'id="login"' in page
    # No Host check off loopback: any name of this host, with the token.
    assert call(board.url + "api/overview",
                headers={"Authorization": f"Bearer {token}", "Host": "dash.example"})[0] == 200
    status, _, _ = action(board, "api/requeue", {"queue": "jobs", "id": item})
    assert status == 401 and jobs.stats()["failed"] == 1
    status, _, _ = action(board, "api/requeue", {"queue": "jobs", "id": item},
                          Authorization=f"Bearer {token}")
    assert status == 200 and jobs.stats()["pending"] == 1


def test_a_given_token_is_required_on_loopback_too(make_queue: MakeQueue,
                                                  make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs")
    item = dead_letter(jobs, "x", "boom")
    token = "correct-horse-battery-staple"
    board = make_dashboard(token=token, allow_actions=True)
    assert not board.token_generated
    assert call(board.url + "api/overview")[0] == 401
    assert overview(board, token=token)["queues"][0]["name"] == "jobs"
    # With a token the Host is not checked: a TLS proxy in front may pass its own
    # name, and the page's https Origin on that name is its own.
    status, _, answer = action(board, "api/requeue", {"queue": "jobs", "id": item},
                               Authorization=f"Bearer {token}", Host="dash.example",
                               Origin="https://dash.example")
    assert status == 200, answer
    assert jobs.stats()["pending"] == 1


@pytest.mark.parametrize("options, message", [
    ({"token": "short"}, "at least 16"),
    ({"token": "has spaces in the middle"}, "at least 16"),
    ({"interval": 0}, "interval"),
    ({"window": 5, "bucket": 10}, "bucket"),
    ({"prefix": "no-slash"}, "prefix"),
    ({"port": 70000}, "cannot listen"),
], ids=["short token", "token with spaces", "zero interval", "bucket > window",
        "bad prefix", "bad port"])
def test_bad_options_are_refused(etcd_url: str, options: Dict[str, Any], message: str) -> None:
    with pytest.raises((ConfigError, InvalidName), match=message):
        Dashboard(etcd_url, **{"port": 0, **options})


def test_a_port_in_use_is_a_clear_error(etcd_url: str, make_dashboard: MakeDashboard) -> None:
    port = int(make_dashboard().url.rsplit(":", 1)[1].strip("/"))
    with pytest.raises(ConfigError, match=f"port {port}"):
        Dashboard(etcd_url, port=port)


def test_the_page_loads_nothing_from_elsewhere(make_dashboard: MakeDashboard) -> None:
    board = make_dashboard()
    for path, kind in (("", "text/html"), ("static/app.js", "text/javascript"),
                       ("static/app.css", "text/css")):
        status, headers, body = call(board.url + path)
        assert status == 200 and headers["Content-Type"].startswith(kind)
        assert "default-src 'none'" in headers["Content-Security-Policy"]
        assert headers["X-Frame-Options"] == "DENY"
        # The only absolute URL is the SVG namespace's name, which is never fetched.
        urls = set(re.findall(rb"(?:https?:)?//[\w.-]+\.\w+[^\s\"')]*", body))
        assert urls <= {b"http://www.w3.org/2000/svg"}, (path, urls)
    page = call(board.url)[2]
    assert board.guard.csrf.encode() in page and b"{{csrf}}" not in page
    assert call(board.url + "static/../server.py")[0] == 404
    assert {p.name for p in STATIC.iterdir()} == {"index.html", "app.js", "app.css"}


# --------------------------------------------------------------------------
# In a real browser
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chromium]:
    binary = find_chromium()
    if binary is None:
        pytest.skip("Chromium is not installed (Debian: apt-get install chromium; or set "
                    "ETCDQ_CHROMIUM to a Chromium binary): the browser tests need it")
    browser = Chromium(binary, tmp_path_factory.mktemp("chromium") / "profile")
    try:
        yield browser
    finally:
        browser.stop()


@pytest.fixture
def page(chromium: Chromium) -> Iterator[Page]:
    tab = chromium.page()
    try:
        yield tab
    finally:
        tab.close()


def text(page: Page, selector: str) -> Optional[str]:
    """The text of the first element matching ``selector``; None if there is none."""
    value = page.evaluate(f"document.querySelector({json.dumps(selector)})?.textContent")
    return value if isinstance(value, str) else None


def shows(page: Page, selector: str, expected: str) -> None:
    wait_until(lambda: text(page, selector) == expected, BOUND,
               message=f"{selector} to show {expected!r} (it shows {text(page, selector)!r})")


def count_cell(queue: str, state: str) -> str:
    return f'#queues tr[data-queue="{queue}"] td[data-count="{state}"]'


def test_browser_shows_the_queues_and_their_counts_live(
        page: Page, make_queue: MakeQueue, make_dashboard: MakeDashboard) -> None:
    alpha, beta = make_queue("alpha"), make_queue("beta")
    alpha.put_many([1, 2, 3])
    complete(beta, 2)
    dead_letter(beta, "x", "boom")
    board = make_dashboard()
    page.open(board.url)
    for queue in (alpha, beta):
        for state, count in queue.stats().items():
            shows(page, count_cell(queue.name, state), str(count))
    # Live: a put shows up without a reload (the page's own variable survives).
    page.evaluate("window.sameDocument = true")
    alpha.put(4)
    shows(page, count_cell("alpha", "pending"), "4")
    assert page.evaluate("window.sameDocument") is True
    # Without --allow-actions there are no buttons to press.
    assert page.evaluate("[...document.querySelectorAll('button[data-action]')]"
                         ".every(b => b.offsetParent === null)") is True


def test_browser_requeue_brings_a_dead_letter_back(
        page: Page, make_queue: MakeQueue, make_dashboard: MakeDashboard) -> None:
    jobs = make_queue("jobs")
    item = dead_letter(jobs, {"to": "ada@example.com"}, "SMTP 451: try later")
    board = make_dashboard(allow_actions=True)
    page.open(board.url)
    shows(page, f'#dead tr[data-item="{item}"] td.reason', "SMTP 451: try later")
    shows(page, count_cell("jobs", "pending"), "0")
    page.click(f'#dead tr[data-item="{item}"] button[data-action="requeue"]')
    shows(page, count_cell("jobs", "pending"), "1")
    shows(page, count_cell("jobs", "failed"), "0")
    assert text(page, f'#dead tr[data-item="{item}"]') is None
    assert [i.payload for i in jobs.items("pending")] == [{"to": "ada@example.com"}]
    assert "Requeued" in (text(page, "#flash") or "")


def test_browser_asks_for_the_token(page: Page, make_queue: MakeQueue,
                                    make_dashboard: MakeDashboard) -> None:
    make_queue("jobs").put(1)
    board = make_dashboard(bind="0.0.0.0")
    page.open(board.url)
    wait_until(lambda: page.evaluate("!document.querySelector('#login').hidden"), BOUND,
               message="the sign-in form")
    assert text(page, count_cell("jobs", "pending")) is None
    for attempt in ("not-the-token", board.token or ""):
        page.evaluate("document.querySelector('#token').focus()")
        page.type_text(attempt)
        page.click('#login button[type="submit"]')
        if attempt != board.token:
            shows(page, "#login-error", "That token was refused.")
    shows(page, count_cell("jobs", "pending"), "1")
    assert page.evaluate("document.querySelector('#login').hidden") is True


def test_browser_screenshot_for_the_readme(page: Page, make_queue: MakeQueue,
                                           make_dashboard: MakeDashboard, tmp_path: Path) -> None:
    """A dashboard with some life in it, saved as docs/dashboard.png with
    ETCDQ_SCREENSHOT=1 (else in the test's temporary directory)."""
    emails = make_queue("emails", node_id="worker-a-41f2")
    thumbs = make_queue("thumbnails", node_id="worker-b-9c07")
    reports = make_queue("reports", node_id="worker-a-41f2")
    board = make_dashboard(allow_actions=True, window=60, bucket=1, interval=0.5)
    page.open(board.url)  # before the work: the running items' ages are then exact
    shows(page, "#queues td.empty", "No queues under " + board.prefix + " yet.")
    _some_work(emails, thumbs, reports)
    shows(page, count_cell("emails", "running"), "2")
    shows(page, count_cell("reports", "failed"), "1")
    wait_until(lambda: text(page, "#running tbody tr:last-child td:nth-child(5)") == "1 s",
               BOUND, message="a running item aged 1 s")
    png = page.screenshot(1200, 1600)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, tall = struct.unpack("!II", png[16:24])  # the IHDR chunk
    assert width == 1200 and tall >= 600
    target = SCREENSHOT if os.environ.get("ETCDQ_SCREENSHOT") == "1" else tmp_path / SCREENSHOT.name
    target.write_bytes(png)


def _some_work(emails: Queue, thumbs: Queue, reports: Queue) -> None:
    """Four seconds of a small system: bursts of completions, a few dead letters,
    claims left running, and a backlog."""
    thumbs.put_many([{"image": f"img/{n:04}.jpg"} for n in range(37)])
    emails.put_many([{"to": f"user{n}@example.com"} for n in range(14)])
    for second, burst in enumerate((5, 9, 3, 7)):
        deadline = time.monotonic() + 1.0
        for n in range(burst):
            claim = (emails if n % 2 else thumbs).claim(timeout=BOUND)
            assert claim is not None
            if second == 1 and n == 3:
                claim.fail("SMTP 550 5.1.1: mailbox unavailable")
            elif second == 3 and n == 5:
                claim.fail("TimeoutError: upstream did not answer in 30 s")
            else:
                claim.complete()
        time.sleep(max(0.0, deadline - time.monotonic()))  # pacing, not an assertion
    for queue, count in ((emails, 2), (thumbs, 1)):
        for _ in range(count):
            assert queue.claim(timeout=BOUND) is not None  # left running
    complete(reports, 3)
    cancelled = reports.put({"report": "weekly", "week": 47})
    assert reports.cancel(cancelled)
