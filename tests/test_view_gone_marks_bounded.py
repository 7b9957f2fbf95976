"""The view's memory of gone locks (ViewState.gone) holds entries only for
items the view holds: it does not grow with the items other consumers process.

As it went before the rule: a watching view added an entry to ``_gone`` for
the lock of every item it heard of being unlocked, including items already
forgotten (finished by anyone: F3's delete or the record event ran _forget
first, then the finisher's lock expires -- F4 is skipped while lock_ttl <=
60 s -- or is deleted by F4 after F3's event).  ``_gone`` was pruned only by
a listing of work/ (_take_listing), which a watching view makes only when
its stream ends, so it grew by one entry per item processed by ANY consumer
of the queue for as long as the queue stayed busy.
"""
from __future__ import annotations

from etcdq_v2 import Queue

from helpers import wait_until

LOCK_TTL = 2  # <= LINGER_MAX: F4 skipped, each finished item's lock expires


def _drain_one_by_one(producer: Queue, consumer: Queue, count: int) -> None:
    """A producer puts items one at a time; a consumer that keeps up (so its
    view watches the whole directory) claims and completes each."""
    for n in range(count):
        producer.put(n)
        claim = consumer.claim(timeout=5)
        assert claim is not None
        claim.complete()


def _leaked(consumer: Queue) -> int:
    view = consumer._view
    assert view is not None
    with view._cond:
        return len([i for i in view.state.gone if i not in view.state.items])


def test_watching_view_gone_grows_with_every_item_processed(
        etcd_url: str, queue_name: str) -> None:
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as consumer, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer:
        assert consumer.claim(timeout=0) is None  # starved: watch everything
        view = consumer._view
        assert view is not None
        wait_until(lambda: view.watching_locks, 5, message="the view watches the queue")
        relists = view.relists

        sizes = []
        for _ in range(2):
            _drain_one_by_one(producer, consumer, 30)
            # the finishers' lingering locks expire (etcd sweeps every 0.5 s)
            wait_until(lambda: not consumer._protocol.list("locks")[1], LOCK_TTL + 5,
                       message="the finished items' locks expired")
            wait_until(lambda: not view.state.locks, 2, message="the view heard the locks expire")
            sizes.append(_leaked(consumer))

        assert view.watching_locks and view.relists == relists, "the view listed again"
        assert not view.state.items, "every item was finished"
        assert sizes[-1] <= 5, (
            f"the watching view keeps _gone entries for items it forgot: {sizes} "
            "after 30 and 60 items processed (never pruned while its stream is busy)")


def test_an_idle_watching_view_leaks_for_items_other_consumers_process(
        etcd_url: str, queue_name: str) -> None:
    """The same leak in a process that claims nothing meanwhile: its view,
    left watching after a claim found nothing, hears every other consumer's
    items and keeps a _gone entry for each."""
    with Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as idle, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as worker, \
            Queue(etcd_url, queue_name, lock_ttl=LOCK_TTL) as producer:
        assert idle.claim(timeout=0) is None
        view = idle._view
        assert view is not None
        wait_until(lambda: view.watching_locks, 5, message="the idle view watches the queue")
        assert worker.claim(timeout=0) is None  # the worker keeps up: it watches too
        _drain_one_by_one(producer, worker, 30)
        wait_until(lambda: not worker._protocol.list("locks")[1], LOCK_TTL + 5,
                   message="the finished items' locks expired")
        wait_until(lambda: not view.state.locks, 2, message="the view heard the locks expire")
        assert not view.state.items
        assert _leaked(idle) <= 5, f"{_leaked(idle)} _gone entries for forgotten items"
