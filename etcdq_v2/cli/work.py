"""``etcdq work``: run a command once per item, or the tasks of a Python module.

A :class:`~etcdq_v2.worker.Worker` whose handler is a
:class:`~etcdq_v2.command.CommandHandler`: each command runs in a subprocess
of its own process group, because a process can be killed on a timeout or a
forced shutdown where a Python thread cannot.  With ``--tasks module:name``
the worker runs the registered functions of that :class:`~etcdq_v2.tasks.Tasks`
in its own threads instead.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, Dict, List

from ..command import CommandHandler, check_command
from ..keys import check_name
from ..queue import DEFAULT_COMPLETED_TTL, DEFAULT_MAX_ATTEMPTS, Queue, default_node_id
from ..tasks import Tasks
from ..worker import Worker, WorkerStats
from .exits import EXIT_FAILURE, EXIT_OK, PROG, UsageError
from .metrics import quiet_created_series
from .options import add_failed_ttl, number_or_none, open_queues, verb
from .output import print_json


def add_verbs(verbs: Any) -> None:
    parser = verb(
        verbs, "work", cmd_work, "run COMMAND once per item",
        after_dashes="command", log_level=logging.INFO,
        usage=f"{PROG} work QUEUE[,QUEUE...] [options] -- COMMAND [ARGS...]\n"
              f"       {PROG} work QUEUE[,QUEUE...] --tasks MODULE:NAME [options]",
        epilog="The payload goes to COMMAND's stdin (JSON; a bytes payload raw), with "
               "ETCDQ_QUEUE, ETCDQ_ITEM_ID and ETCDQ_ATTEMPT in its environment, which is "
               "etcdq's own without its secrets (ETCDQ_PASSWORD, ETCDQ_PASSWORD_FILE, "
               "ETCDQ_KEY, ETCDQ_DASHBOARD_TOKEN, ETCDQ_DASHBOARD_TOKEN_FILE) unless "
               "--pass-env names them. Exit status 0 completes the item with stdout as the "
               "result (parsed as JSON when it is JSON); anything else fails it with the "
               "end of stderr as the reason. A command that writes more than 1 MiB (the "
               "payload limit) to stdout or stderr is stopped and its item fails with "
               "'result too large'. Several queues (e.g. high,low): each item comes from the first "
               "one that has a free item. SIGTERM/SIGINT: no new items, running commands "
               "get --grace seconds, then are terminated and their items released; a "
               "second signal does that at once. The summary counts 'attempts failed' (the "
               "item is retried later) apart from 'dead-lettered' (it went to failed/). "
               "etcdq work exits with status 1 when any attempt it ran failed, else 0.")
    parser.add_argument("queue", metavar="QUEUE[,QUEUE...]",
                        help="queue name, or names in priority order separated by commas")
    parser.add_argument("command", nargs="*", metavar="COMMAND", help=argparse.SUPPRESS)
    parser.add_argument("--tasks", metavar="MODULE:NAME",
                        help="run the functions registered on this etcdq_v2.Tasks object "
                             "(imported from MODULE, the current directory first) instead "
                             "of a COMMAND; each item names its task")
    parser.add_argument("-c", "--concurrency", type=int, default=1, metavar="N",
                        help="commands run at once (default 1)")
    parser.add_argument("--max-items", type=int, metavar="N", help="stop after N items")
    parser.add_argument("--until-empty", action="store_true",
                        help="stop when there is nothing to claim")
    parser.add_argument("--timeout", type=float, metavar="S",
                        help="kill a command's process group after S seconds; the item fails")
    parser.add_argument("--grace", type=float, default=30.0, metavar="S",
                        help="on SIGTERM/SIGINT, how long running commands may finish "
                             "(default 30)")
    parser.add_argument("--lock-ttl", type=float, default=30.0, metavar="S",
                        help="lock TTL: a dead worker's items come back after this "
                             "(default 30)")
    parser.add_argument("--max-attempts", type=number_or_none(int), metavar="N",
                        default=DEFAULT_MAX_ATTEMPTS,
                        help="dead-letter an item after N attempts ('none': never; "
                             f"default {DEFAULT_MAX_ATTEMPTS})")
    parser.add_argument("--completed-ttl", type=number_or_none(float), metavar="S",
                        default=DEFAULT_COMPLETED_TTL,
                        help="keep completion records S seconds ('none': until purged; "
                             f"default {DEFAULT_COMPLETED_TTL})")
    add_failed_ttl(parser)
    parser.add_argument("--node-id", metavar="ID", help="this worker's name in locks and records")
    parser.add_argument("--pass-env", action="append", default=[], metavar="NAME",
                        help="give COMMAND this one of etcdq's secret variables too "
                             "(e.g. ETCDQ_PASSWORD, for a command that runs etcdq); "
                             "repeatable")
    parser.add_argument("--metrics-port", type=int, metavar="N",
                        help="serve this worker's Prometheus metrics on port N (0: any free "
                             "port; the URL is logged); needs the metrics extra")
    parser.add_argument("--metrics-bind", default="127.0.0.1", metavar="ADDR",
                        help="address of --metrics-port (default 127.0.0.1)")


def cmd_work(args: argparse.Namespace) -> int:
    """``etcdq work``: a Worker running a command or tasks; exit 1 if an attempt failed."""
    handler = _handler(args)
    names = queue_names(args.queue)
    # One node id for all the queues: the same worker in every lock and record.
    options = {"lock_ttl": args.lock_ttl, "node_id": args.node_id or default_node_id(),
               "max_attempts": args.max_attempts, "completed_ttl": args.completed_ttl,
               "failed_ttl": args.failed_ttl}
    with open_queues(args, names, **options) as queues:
        for queue in queues:
            queue.stats()  # fail now (exit 3/4) rather than retry a wrong endpoint forever
        worker = _worker(args, queues, handler)
        try:
            stats = worker.run(until_empty=args.until_empty, max_items=args.max_items)
        finally:
            worker.close()
    if args.json:
        print_json(summary(stats))
    else:
        print(stats)  # WorkerStats.__str__: "completed 1  attempts failed 0  dead-lettered 0 ..."
    return EXIT_FAILURE if stats.failed else EXIT_OK


def summary(stats: WorkerStats) -> Dict[str, int]:
    """What ``work`` prints: the counts of WorkerStats, failed attempts apart from
    dead-lettered items."""
    return {"completed": stats.completed, "attempts_failed": stats.attempts_failed,
            "dead_lettered": stats.dead_lettered, "lost": stats.lost,
            "released": stats.released}


def _handler(args: argparse.Namespace) -> Dict[str, Any]:
    """The Worker's handler or tasks, from COMMAND or --tasks (one of them)."""
    if args.tasks is not None:
        if args.command:
            raise UsageError("give either --tasks or a COMMAND after --, not both")
        return {"tasks": load_tasks(args.tasks)}
    if not args.command:
        raise UsageError("give the command to run after --, e.g. etcdq work QUEUE -- ./job.sh, "
                         "or --tasks MODULE:NAME")
    return {"handler": CommandHandler(check_command(args.command), pass_env=args.pass_env)}


def load_tasks(spec: str) -> Tasks:
    """``module:name`` as a Tasks object; a usage error (exit 2) saying what is wrong.

    The current directory comes first on the import path, as for ``python -m``:
    a worker started beside its tasks module finds it.
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"--tasks takes MODULE:NAME (e.g. myapp.tasks:tasks), not {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # its own code may raise anything: report it, not a traceback
        raise UsageError(f"--tasks: cannot import {module_name}: "
                         f"{type(exc).__name__}: {exc}") from None
    found = getattr(module, attribute, None)
    if not isinstance(found, Tasks):
        raise UsageError(f"--tasks: {module_name}.{attribute} is not an etcdq_v2.Tasks "
                         f"object (found {type(found).__name__})")
    return found


def _worker(args: argparse.Namespace, queues: List[Queue], handler: Dict[str, Any]) -> Worker:
    if args.metrics_port is not None:
        quiet_created_series()
    return Worker(queues, concurrency=args.concurrency, item_timeout=args.timeout,
                  grace_period=args.grace, metrics_port=args.metrics_port,
                  metrics_addr=args.metrics_bind, **handler)


def queue_names(text: str) -> List[str]:
    """``work``'s QUEUE argument: names in priority order, separated by commas.

    Unambiguous, since a queue name cannot contain a comma.  Each name is
    checked (InvalidName, exit 2); a name given twice is a usage error.
    """
    names = [check_name(name) for name in text.split(",")]
    if len(set(names)) != len(names):
        raise UsageError(f"a queue is named twice in {text!r}")
    return names
