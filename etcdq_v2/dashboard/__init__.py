"""A web dashboard of the queues under a prefix: counts, throughput, running items,
dead letters, and (with ``allow_actions``) requeue and purge.

>>> from etcdq_v2.dashboard import Dashboard
>>> with Dashboard("http://127.0.0.1:2379", port=8080) as board:
...     board.serve_forever()          # http://127.0.0.1:8080/

The page (``static/``) is plain HTML, CSS and JavaScript shipped in the
package: no CDN, no build step, it works offline.  It polls the JSON API
every ``interval`` seconds; the server answers every page from one shared
snapshot of etcd (snapshots.py).  Who may read and act: guard.py.
"""
from .guard import is_local
from .server import DEFAULT_BIND, DEFAULT_PORT, Dashboard

__all__ = ["DEFAULT_BIND", "DEFAULT_PORT", "Dashboard", "is_local"]
