"""A 3-member cluster loses its leader while consumers drain and a producer puts."""
from __future__ import annotations

import threading
from collections import Counter

from etcdq_v2 import Queue, Unavailable, connect

from helpers import wait_until
from test_drain import run_consumers


def test_leader_sigkill_while_draining_loses_nothing(cluster, queue_name: str) -> None:
    client = connect(cluster.endpoints, timeout=2.0, deadline=20)
    with Queue(client, queue_name, lock_ttl=10) as queue:
        ids = queue.put_many(range(300))
        acknowledged = []
        stop_producing = threading.Event()

        def produce() -> None:
            # Puts during the failover: each acknowledged one must land exactly once.
            n = 0
            while not stop_producing.is_set():
                try:
                    acknowledged.append(queue.put({"late": n}))
                except Unavailable:
                    pass
                n += 1

        producer = threading.Thread(target=produce)
        producer.start()
        executed: Counter = Counter()
        drain = threading.Thread(target=lambda: executed.update(
            run_consumers(cluster.endpoints, queue_name, 3, idle=8.0)[0]))
        drain.start()
        wait_until(lambda: queue.stats()["completed"] >= 50, 60, message="draining to start",
                   ignore=(Unavailable,))
        leader = cluster.leader_index()
        cluster.kill(leader)
        before = len(acknowledged)
        wait_until(lambda: len(acknowledged) >= before + 20, 60,
                   message="puts acknowledged after the leader died")
        stop_producing.set()
        producer.join(30)
        drain.join(300)

        expected = sorted(ids + acknowledged)
        assert len(set(acknowledged)) == len(acknowledged)
        assert sorted(executed) == expected  # nothing lost ...
        completed = queue.items("completed")
        assert [info.id for info in completed] == expected  # ... one record each
        assert queue.stats()["pending"] == 0
        late = [info.payload["late"] for info in completed if isinstance(info.payload, dict)]
        assert len(late) == len(set(late)), "a put was applied twice"


def test_everything_survives_a_full_cluster_restart(cluster, queue_name: str) -> None:
    with Queue(connect(cluster.endpoints, timeout=2.0, deadline=30), queue_name,
               max_attempts=1) as queue:
        done, dead, waiting = queue.put_many(["done", "dead", "waiting"])
        queue.claim().complete("result")
        queue.claim().fail("broken")
        before = {state: queue.items(state) for state in ("pending", "completed", "failed")}
        cluster.stop()
        for member in cluster.members:
            member.start(wait=False)
        for member in cluster.members:
            member.wait_ready(60)
        after = wait_until(lambda: {state: queue.items(state)
                                    for state in ("pending", "completed", "failed")},
                           30, ignore=(Unavailable,), message="the cluster to serve again")
        assert after == before
        assert [i.id for i in after["completed"]] == [done]
        assert [(i.id, i.reason) for i in after["failed"]] == [(dead, "broken")]
        assert queue.claim(timeout=5).id == waiting
