"""How long a failed item waits before it is claimable again (``Queue(backoff=...)``).

The default is exponential with "equal jitter": after attempt *n* fails,
``d = min(300, 5 * 2**(n-1))`` and the item waits ``d/2 + uniform(0, d/2)``
seconds.  Half of each wait is fixed, so an item never comes back at once
after a failure; the other half is random, so items that failed together
(a downstream outage) do not all come back together.  With the default
``max_attempts`` of 10 the nine retries span 608-1215 s: 10-20 minutes of
outage before an item is dead-lettered.

A queue's own ``backoff`` is a non-empty sequence of seconds (indexed by
attempt - 1, the last one repeating) or a callable ``f(attempt) -> seconds``.
A sequence is checked when the Queue is made (:class:`ConfigError`); a
callable can only be checked when an item fails, so one that raises or
returns something that is not a number of seconds >= 0 is logged and the
default used for that attempt: an item must never stay locked because its
backoff could not be computed.  A delay longer than ``MAX_TTL`` (68 years,
the longest TTL etcdq writes) is a ConfigError in a sequence, and is cut to
``MAX_TTL`` (with a warning) from a callable: etcd refuses such a TTL, or
never expires the lock.
"""
from __future__ import annotations

import collections.abc
import functools
import logging
import math
import numbers
from typing import Any, Callable, List, Sequence, Union

from .errors import ConfigError
from .protocol import MAX_TTL
from .runtime import SYSTEM, Randomness

log = logging.getLogger("etcdq_v2.backoff")

#: The default backoff's first ceiling and its cap, in seconds.
BASE, CAP = 5.0, 300.0

BackoffOption = Union[None, Sequence[float], Callable[[int], float]]


def default_backoff(attempt: int, rng: Randomness = SYSTEM.random) -> float:
    """Equal jitter: half of ``min(300, 5 * 2**(attempt-1))``, plus up to as much
    again, drawn from ``rng`` (the queue's runtime's)."""
    ceiling = min(CAP, BASE * 2.0 ** min(max(attempt, 1) - 1, 16))
    return ceiling / 2 + rng.uniform(0, ceiling / 2)


def make_backoff(option: BackoffOption, queue: str,
                 rng: Randomness = SYSTEM.random) -> Callable[[int], float]:
    """The backoff function for ``Queue(backoff=option)``; ConfigError if it cannot be one.
    ``rng``: the jitter of the default backoff (a user's that fails falls back to it)."""
    if option is None:
        return functools.partial(default_backoff, rng=rng)
    if callable(option):
        return _Guarded(option, queue, rng)
    if isinstance(option, (str, bytes)) or not isinstance(option, collections.abc.Sequence) \
            or not option:
        raise ConfigError(f"backoff must be None, a non-empty sequence of seconds or a "
                          f"callable(attempt) -> seconds, not {option!r}")
    try:
        delays = [seconds(value) for value in option]
    except ValueError as exc:
        raise ConfigError(f"backoff: {exc}") from None
    if max(delays) > MAX_TTL:
        raise ConfigError(f"backoff: a delay must be at most {MAX_TTL} s (68 years), "
                          f"not {max(delays)!r}")
    return _Schedule(delays)


def seconds(value: Any) -> float:
    """``value`` as a delay: a finite real number >= 0 (not a bool), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not math.isfinite(value) or value < 0:
        raise ValueError(f"a delay must be a number of seconds >= 0, not {value!r}")
    return float(value)


class _Schedule:
    """A fixed list of delays: attempt n waits ``delays[n-1]``, the last one repeating."""

    def __init__(self, delays: List[float]) -> None:
        self.delays = delays

    def __call__(self, attempt: int) -> float:
        return self.delays[min(max(attempt, 1), len(self.delays)) - 1]

    def __repr__(self) -> str:
        return f"<backoff {self.delays}>"


class _Guarded:
    """A user's backoff function, never allowed to keep an item locked by failing."""

    def __init__(self, function: Callable[[int], float], queue: str,
                 rng: Randomness = SYSTEM.random) -> None:
        self.function = function
        self.queue = queue
        self._rng = rng

    def __call__(self, attempt: int) -> float:
        try:
            delay = seconds(self.function(attempt))
        except Exception as exc:
            log.warning("the backoff of queue %s failed for attempt %d (%r); using the "
                        "default backoff for it", self.queue, attempt, exc)
            return default_backoff(attempt, self._rng)
        if delay > MAX_TTL:  # etcd would refuse it, or never expire the lock
            log.warning("the backoff of queue %s gave %r s for attempt %d, more than the "
                        "longest TTL; waiting %d s", self.queue, delay, attempt, MAX_TTL)
            return float(MAX_TTL)
        return delay

    def __repr__(self) -> str:
        return f"<backoff {self.function!r}>"
