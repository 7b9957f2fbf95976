"""etcdq_v2: a reliable distributed work queue on the etcd v2 HTTP API.

>>> from etcdq_v2 import Queue
>>> q = Queue("http://127.0.0.1:2379", "emails")
>>> q.put({"to": "ada@example.com"})
>>> with q.claim(timeout=None) as claim:   # completes on exit, fails on exception
...     send(claim.payload)
"""
from .claim import Claim
from .errors import (AuthError, ClaimClosed, ConfigError, EtcdqError, EtcdRejected,
                     InvalidArgument, InvalidName, InvalidPayload, LockLost, NotFound,
                     PayloadTooLarge, QueueClosed, TaskFailed, Unavailable, WaitTimeout)
from .queue import Counts, ItemInfo, Queue, claim_first
from .tasks import Reject, Retry, TaskFunction, Tasks
from .transport import Transport, connect
from .worker import Worker, WorkerStats, current_task

from ._version import __version__

__all__ = [
    "AuthError", "Claim", "ClaimClosed", "ConfigError", "Counts", "EtcdRejected", "EtcdqError",
    "InvalidArgument", "InvalidName", "InvalidPayload",
    "ItemInfo", "LockLost", "NotFound", "PayloadTooLarge", "Queue", "QueueClosed", "Reject",
    "Retry", "TaskFailed", "TaskFunction", "Tasks", "Transport", "Unavailable", "WaitTimeout",
    "Worker", "WorkerStats", "claim_first", "connect", "current_task", "__version__",
]
