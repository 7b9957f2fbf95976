"""Tasks as functions: register a function, put calls of it, run them in workers.

A producer and a worker import the same module of tasks::

    # tasks.py
    from etcdq_v2 import Queue, Tasks
    tasks = Tasks(Queue("http://127.0.0.1:2379", "emails"))

    @tasks.task
    def send_email(to, subject):
        ...
        return "sent"

    # producer.py
    from tasks import send_email
    item_id = send_email.delay("ada@example.com", subject="hello")
    print(send_email.wait(item_id, timeout=60))

    # the worker:  etcdq work emails --tasks tasks:tasks

A call is an item whose payload is ``{"task": name, "args": [...], "kwargs":
{...}}``: any producer can put one, and any worker that registered ``name``
runs it.  The name is the function's module and qualified name
(``tasks.send_email``) unless ``name=`` says otherwise, so the producer and the
worker must import the function from the same module (not ``__main__``).

What a worker does with a call (:meth:`Tasks.run`, as a
:class:`~etcdq_v2.worker.Worker`'s handler):

* an unknown task name, a payload that is not a call, or arguments that do
  not bind to the function's signature (``inspect.signature(f).bind``): the
  item is dead-lettered at once with that reason (:class:`Reject`), not
  retried, since no retry could make it succeed;
* the function returns: its result (JSON) completes the item;
* it raises :class:`Retry`: the attempt fails and the item is retried after
  ``Retry.delay`` seconds (an attempt counted: ``max_attempts`` still bounds it);
* it raises anything else: the attempt fails with the traceback stored, and
  the item is retried after the task's ``backoff`` (or the queue's), or
  dead-lettered after the task's ``max_attempts`` (or the queue's).

``Retry`` and ``Reject`` are control flow a handler raises for its worker,
not errors the library reports, so they are not :class:`EtcdqError`\\ s.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Dict, Iterable, Optional, Tuple, TypeVar, Union, overload

from .backoff import BackoffOption, make_backoff
from .errors import ConfigError, InvalidArgument, InvalidPayload, TaskFailed, WaitTimeout
from .protocol import delay_ttl
from .queue import ItemInfo, Queue

__all__ = ["Reject", "Retry", "TaskFunction", "Tasks", "task_name"]

F = TypeVar("F", bound=Callable[..., Any])


class Retry(Exception):
    """Raised by a handler or task: fail this attempt and retry after ``delay`` seconds.

    The attempt counts, so the queue's (or the task's) ``max_attempts``
    still dead-letters an item that keeps asking.  ``reason`` is stored as
    the attempt's reason (default: "retry requested").
    """

    def __init__(self, delay: float = 0, reason: str = "") -> None:
        delay_ttl(delay)  # InvalidArgument now, in the task, not at the worker
        super().__init__(reason or f"retry requested in {delay:g} s")
        self.delay = delay
        self.reason = reason or f"retry requested in {delay:g} s"


class Reject(Exception):
    """Raised by a handler or task: dead-letter the item now with this reason.

    For an item no retry can help (bad input): it is not retried whatever
    attempts it has left.
    """


def task_name(function: Callable[..., Any]) -> str:
    """The name a function is registered under: ``module.qualname``."""
    return f"{function.__module__}.{function.__qualname__}"


class TaskFunction:
    """A registered function: call it as before, or ``.delay(...)`` it to a worker."""

    def __init__(self, tasks: "Tasks", function: Callable[..., Any], name: str, *,
                 delay: Optional[float], max_attempts: Optional[int],
                 backoff: BackoffOption) -> None:
        self.tasks = tasks
        self.function = function
        self.name = name
        self.signature = inspect.signature(function)
        self.default_delay = delay
        self.max_attempts = max_attempts
        #: None: the queue's backoff applies.
        self.backoff = None if backoff is None else make_backoff(backoff, name,
                                                                 tasks.queue.runtime.random)
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function here and now, as if it were not registered."""
        return self.function(*args, **kwargs)

    def delay(self, *args: Any, **kwargs: Any) -> str:
        """Put a call of this task with these arguments; the item's id.

        InvalidPayload, before anything is stored, if an argument cannot be
        JSON; InvalidArgument if they do not fit the function's signature.
        """
        return self.send(args, kwargs)

    def send(self, args: Iterable[Any] = (), kwargs: Optional[Dict[str, Any]] = None, *,
             delay: Optional[float] = None) -> str:
        """Put a call with ``args`` and ``kwargs``; ``delay`` (seconds) overrides the
        task's.  The item's id."""
        args, kwargs = tuple(args), dict(kwargs or {})
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"arguments do not fit task {self.name}"
                                  f"{self.signature}: {exc}") from None
        payload = {"task": self.name, "args": list(args), "kwargs": kwargs}
        try:
            return self.tasks.queue.put(payload, delay=self.default_delay if delay is None
                                        else delay)
        except InvalidPayload as exc:
            raise type(exc)(f"arguments of task {self.name} cannot be stored: {exc}") from None

    def wait(self, item_id: str, timeout: Optional[float] = None) -> Any:
        """The result of call ``item_id`` once it completed (see :meth:`Tasks.wait`)."""
        return self.tasks.wait(item_id, timeout)

    def __repr__(self) -> str:
        return f"<task {self.name}>"


class Tasks:
    """The tasks of one queue: functions registered by name, called by workers.

    ``queue`` is where ``.delay()`` puts calls and ``.wait()`` waits for them.
    Give the same object to ``Worker(queues, tasks=tasks)`` or ``etcdq work
    QUEUE --tasks module:tasks`` to run them.
    """

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self._registered: Dict[str, TaskFunction] = {}

    @overload
    def task(self, function: F) -> TaskFunction: ...

    @overload
    def task(self, *, name: Optional[str] = None, delay: Optional[float] = None,
             max_attempts: Optional[int] = None,
             backoff: BackoffOption = None) -> Callable[[F], TaskFunction]: ...

    def task(self, function: Optional[F] = None, *, name: Optional[str] = None,
             delay: Optional[float] = None, max_attempts: Optional[int] = None,
             backoff: BackoffOption = None
             ) -> Union[TaskFunction, Callable[[F], TaskFunction]]:
        """Register a function: ``@tasks.task`` or ``@tasks.task(...)`` with options.

        ``name``: what calls name it by (default ``module.qualname``).
        ``delay``: seconds before each call can run (as ``Queue.put``'s).
        ``max_attempts``: dead-letter a call after this many failed attempts
        (at most the queue's, which dead-letters first).  ``backoff``: the
        wait before a retry, as ``Queue(backoff=...)`` takes it (None: the
        queue's).  ConfigError for a bad option or a name registered twice
        (InvalidArgument for a bad ``delay``, as Queue.put says).
        """
        delay_ttl(delay)
        _check_attempts(max_attempts)

        def register(f: F) -> TaskFunction:
            registered = TaskFunction(self, f, name or task_name(f), delay=delay,
                                      max_attempts=max_attempts, backoff=backoff)
            if registered.name in self._registered:
                raise ConfigError(f"a task named {registered.name} is registered already")
            self._registered[registered.name] = registered
            return registered

        return register if function is None else register(function)

    @property
    def names(self) -> Tuple[str, ...]:
        """The registered names, sorted."""
        return tuple(sorted(self._registered))

    def __getitem__(self, name: str) -> TaskFunction:
        return self._registered[name]

    def __contains__(self, name: object) -> bool:
        return name in self._registered

    def enqueue(self, function: Union[str, Callable[..., Any]], *args: Any,
                **kwargs: Any) -> str:
        """Put a call of a registered task (the function or its name); the id."""
        name = function if isinstance(function, str) else getattr(
            function, "name", None) or task_name(function)
        if name not in self._registered:
            raise InvalidArgument(f"no task {name} is registered here; "
                                  f"known: {', '.join(self.names) or 'none'}")
        return self._registered[name].send(args, kwargs)

    def wait(self, item_id: str, timeout: Optional[float] = None) -> Any:
        """The result of call ``item_id`` once completed; TaskFailed (with the
        dead letter's reason and traceback) once dead-lettered; WaitTimeout if
        ``timeout`` seconds pass first.  A requeued call is followed."""
        info = self.queue.wait(item_id, timeout)
        if info is None:
            raise WaitTimeout(f"item {item_id} of queue {self.queue.name} did not finish "
                              f"within {timeout:g} s")
        return result_of(info)

    # -- the worker's side ---------------------------------------------------------
    def run(self, payload: Any, attempt: int = 1) -> Any:
        """Run the call ``payload`` names; its result.  A worker's handler.

        Reject for a call that cannot run (see the module docstring).  On an
        exception of the task's own, with the task's retry settings: Reject
        (from it) once ``attempt`` reaches its ``max_attempts``, Retry after
        its ``backoff``; without them, the exception itself.
        """
        task, args, kwargs = self._call(payload)
        try:
            return task.function(*args, **kwargs)
        except (Retry, Reject):
            raise
        except Exception as exc:
            if task.max_attempts is not None and attempt >= task.max_attempts:
                raise Reject(f"{describe(exc)} (attempt {attempt} of the task's "
                             f"{task.max_attempts})") from exc
            if task.backoff is not None:
                raise Retry(task.backoff(attempt), describe(exc)) from exc
            raise

    def _call(self, payload: Any) -> Tuple[TaskFunction, Tuple[Any, ...], Dict[str, Any]]:
        """The task and arguments of a call; Reject if it cannot run here."""
        if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
            raise Reject(f"not a task call (no \"task\" name): {str(payload)[:200]}")
        name, args, kwargs = payload["task"], payload.get("args", []), payload.get("kwargs", {})
        task = self._registered.get(name)
        if task is None:
            raise Reject(f"unknown task {name}: this worker has "
                         f"{', '.join(self.names) or 'no tasks'}")
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise Reject(f"task {name}: \"args\" must be a list and \"kwargs\" an object")
        try:
            task.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise Reject(f"arguments do not fit task {name}{task.signature}: {exc}") from None
        return task, tuple(args), kwargs

    def __repr__(self) -> str:
        return f"<Tasks of {self.queue.name}: {', '.join(self.names)}>"


def result_of(info: ItemInfo) -> Any:
    """A finished call's result, or TaskFailed for a dead letter."""
    if info.state == "failed":
        raise TaskFailed(info.id, info.reason, info.traceback)
    return info.result


def describe(error: BaseException) -> str:
    """``"ExceptionType: message"``: the reason a failed attempt is stored with."""
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _check_attempts(max_attempts: Optional[int]) -> None:
    if max_attempts is None:
        return
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) \
            or max_attempts < 1 or not math.isfinite(max_attempts):
        raise ConfigError(f"max_attempts must be a whole number >= 1 or None, "
                          f"not {max_attempts!r}")
