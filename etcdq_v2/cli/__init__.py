"""The ``etcdq`` command line (also ``python -m etcdq_v2``).

A thin layer: every verb parses its arguments, opens a :class:`Queue` and
calls one or two of its methods (``work`` wraps a :class:`Worker` around a
:class:`~etcdq_v2.command.CommandHandler`, ``server`` and ``demo`` run etcd
through :mod:`etcdq_v2.testing`).  What is
particular to the shell lives here:

* user errors print one line ``etcdq: error: ...`` and exit with a distinct
  code (:data:`EXIT_CODES`, shown in ``--help``); never a traceback for an
  :class:`EtcdqError`;
* global options may come before or after the verb (``etcdq stats q --json``),
  and take their defaults from ``ETCDQ_*`` environment variables;
* ``work`` runs a command per item in a subprocess of its own process group
  (:mod:`etcdq_v2.command`), because a process can be killed on a timeout or
  a forced shutdown where a Python thread cannot.

One module per verb or group of verbs, each parser beside its handler:

=============  ================================================================
app            the parser, :func:`main` and the registry of verb modules
exits          exit statuses, :class:`UsageError`
options        the global options (and ``ETCDQ_*``), options verbs share, open_queue
output         --json, tables, item fields, counts, status lines, :class:`Progress`
items          put, ls, show, wait, cancel
work           work
ops            stats, requeue, purge, drop
metrics        metrics (a Prometheus exporter; work --metrics-port is in work)
dashboard      dashboard (the web page of :mod:`etcdq_v2.dashboard`)
transfer       export, import
server         server
demo           demo
completion     completion (a bash or zsh script, by shtab, from this parser)
=============  ================================================================

A new verb is a module with ``add_verbs(verbs)`` (each verb's parser from
:func:`.options.verb`, which adds the global options and sets the handler) and
one line in :data:`etcdq_v2.cli.app.VERB_MODULES`.  Import optional
dependencies in the handler, as ``completion`` does, so that ``etcdq``
starts without them.  Layers: this package sits on top; nothing in the
library imports it.
"""
from .app import VERB_MODULES, build_parser, main, parse_args
from .exits import (EXIT_AUTH, EXIT_CODES, EXIT_FAILURE, EXIT_INTERRUPTED, EXIT_NOT_FOUND,
                    EXIT_OK, EXIT_TIMEOUT, EXIT_UNAVAILABLE, EXIT_USAGE, PROG, UsageError,
                    exit_code_for)
from .items import STATES, parse_payload
from .options import DEFAULT_ENDPOINTS, DEFAULT_PREFIX, open_queue, open_queues
from .output import print_json
from .work import queue_names

__all__ = [
    "DEFAULT_ENDPOINTS", "DEFAULT_PREFIX", "EXIT_AUTH", "EXIT_CODES", "EXIT_FAILURE",
    "EXIT_INTERRUPTED", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_TIMEOUT", "EXIT_UNAVAILABLE",
    "EXIT_USAGE", "PROG", "STATES", "UsageError", "VERB_MODULES", "build_parser",
    "exit_code_for", "main", "open_queue", "open_queues", "parse_args", "parse_payload",
    "print_json", "queue_names",
]
