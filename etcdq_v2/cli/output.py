"""What the verbs print: ``--json`` documents, tables, item fields, counts, status lines,
progress.

Bytes (payloads, results) appear as ``{"base64": ...}`` in JSON and as
``base64:...`` in text.  :class:`StatusLine` redraws one line in place on a
terminal (``etcdq stats --watch``, the demo) and writes plain lines
elsewhere, so a log file gets a readable trace instead of carriage returns.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import sys
import time
from typing import IO, Any, Callable, Dict, List, Optional, Tuple

from ..codec import strict_json
from ..queue import ItemInfo


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"base64": base64.b64encode(value).decode("ascii")}
    return str(value)


def print_json(value: Any) -> None:
    """One JSON document on stdout; bytes appear as ``{"base64": ...}``, and a
    stored NaN or Infinity as null (codec.strict_json: jq must read it)."""
    try:
        text = json.dumps(value, default=_json_default, ensure_ascii=False, allow_nan=False)
    except ValueError:  # rare: a stored value holds NaN or Infinity
        plain = json.loads(json.dumps(value, default=_json_default))
        text = json.dumps(strict_json(plain), ensure_ascii=False, allow_nan=False)
    print(text)


def format_value(value: Any, width: Optional[int] = None) -> str:
    if isinstance(value, bytes):
        text = "base64:" + base64.b64encode(value).decode("ascii")
    elif isinstance(value, str):
        text = value
    else:
        text = json.dumps(value, ensure_ascii=False, default=_json_default)
    text = " ".join(text.split()) if width else text
    return text if width is None or len(text) <= width else text[:width - 1] + "…"


def format_time(seconds: Optional[float]) -> str:
    if not seconds:
        return "-"
    try:  # a time another writer stored may be NaN, infinite or out of range
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))
    except (ValueError, OverflowError, OSError):
        return "-"


def format_counts(counts: Dict[str, int]) -> str:
    """``pending 3  running 1  ...`` in the dict's order."""
    return "  ".join(f"{name} {count}" for name, count in counts.items())


_TIME_FIELDS = ("created", "finished", "due")


def info_fields(info: ItemInfo) -> List[Tuple[str, str]]:
    """(name, text) for every field of ``info`` that has a value; a traceback last,
    its lines indented below its name."""
    shown = []
    for name, value in dataclasses.asdict(info).items():
        if (value is None and name not in ("payload", "result")) or value == [] \
                or name == "traceback":
            continue
        if name == "requeued_from":
            text = " -> ".join(value + [info.id]) + "  (a requeued dead letter, followed)"
        else:
            text = format_time(value) if name in _TIME_FIELDS else format_value(value)
        shown.append((name, text))
    if info.traceback:
        shown.append(("traceback", "\n" + "\n".join(
            "  " + line for line in info.traceback.rstrip("\n").splitlines())))
    return shown


_DETAIL_BY_STATE = {"pending": "payload", "running": "payload",
                    "completed": "result", "failed": "reason"}


def print_table(items: List[ItemInfo], state: str) -> None:
    detail = _DETAIL_BY_STATE[state]
    rows = [("ID", "ATTEMPTS", "NODE", "CREATED", detail.upper())]
    for info in items:
        rows.append((info.id, str(info.attempts), info.node_id or "-",
                     format_time(info.created), format_value(getattr(info, detail), 60)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])


class StatusLine:
    """One line redrawn in place on a terminal; elsewhere, a line per update at most every
    ``every`` seconds, so a log file gets a readable trace instead of carriage returns."""

    def __init__(self, out: IO[str], every: float = 0.0) -> None:
        self.out = out
        self.tty = out.isatty()
        self.every = every
        self._last = 0.0
        self._drawn = False

    def update(self, text: str, *, final: bool = False) -> None:
        if self.tty:
            self.out.write(f"\r{text}\x1b[K")
            self._drawn = True
        elif final or time.monotonic() - self._last >= self.every:
            self.out.write(text + "\n")
            self._last = time.monotonic()
        self.out.flush()

    def event(self, text: str) -> None:
        """A line that stays, printed above the status line."""
        if self._drawn:
            self.out.write("\r\x1b[K")
            self._drawn = False
        self.out.write(text + "\n")
        self.out.flush()

    def close(self) -> None:
        if self._drawn:
            self.out.write("\n")
            self._drawn = False
        self.out.flush()


#: Seconds an operation runs before :class:`Progress` shows anything: a quick one shows nothing.
PROGRESS_AFTER = 1.0


class Progress:
    """A count and a rate (``1200 items put  850 items/s``) on stderr while a long operation runs.

    Only on a terminal: a log or a pipe gets nothing (the result on stdout
    says what was done), and only once the operation has run ``after``
    seconds; redrawn at most every ``every`` seconds, and once more, final,
    by :meth:`close`.  For ``put -``, ``purge`` and other verbs that handle
    items by the thousand: call :meth:`advance` per item (it is cheap)::

        with Progress("put") as progress:
            queue.put_many(payloads, progress=progress.advance)
    """

    def __init__(self, done: str, out: Optional[IO[str]] = None, *,
                 after: float = PROGRESS_AFTER, every: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.done = done
        self.count = 0
        self._line = StatusLine(out if out is not None else sys.stderr)
        self._clock = clock
        self._began = clock()
        self._next = self._began + after
        self._every = every
        self._shown = False

    def advance(self, count: int = 1) -> None:
        """``count`` more items done; redraw if it is time."""
        self.count += count
        if self._line.tty and self._clock() >= self._next:
            self._draw()
            self._next = self._clock() + self._every

    def close(self) -> None:
        """The final count, and the line ends; nothing if nothing was shown."""
        if self._shown:
            self._draw()
            self._line.close()

    def _draw(self) -> None:
        rate = self.count / max(self._clock() - self._began, 1e-6)
        noun = "item" if self.count == 1 else "items"
        self._line.update(f"{self.count} {noun} {self.done}  {rate:.0f} items/s")
        self._shown = True

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
