"""One member's v2 store: the key tree, the global index, the event history and the watchers.

A transcription of etcd's ``server/etcdserver/api/v2store`` (store.go,
node.go, event_history.go, watcher_hub.go, watcher.go in 3.4.23 and 3.5.1,
whose v2 stores are the same), restricted to what one member's state
machine does once a request is committed.  Keys here are the user's keys
(``/q/work/x``): etcd stores them under ``/1`` and strips that prefix from
replies, which changes nothing but the root's own key (absent in replies).

Time is an argument in integer nanoseconds of the member's wall clock:
``expire`` is when a key expires (etcd computes it where the request
arrived), ``now`` is what the member's clock says while it applies, used
only to report ``ttl``.  Nothing here reads a clock.

Rules that are easy to get wrong, all as etcd has them:

* every write, refresh and expiry takes the next index and a slot in the
  1,000-event history; a read takes neither;
* a refresh notifies no watcher, but a watch from an index it covers scans
  past it (refresh events are skipped by the scan);
* a PUT or CAS without ``ttl`` makes the key permanent again;
* a live watcher sees no event under a hidden (``_``) segment below the
  watched path, but a watch answered from history does;
* a watcher with ``buffer`` events not yet taken is dropped from the hub on
  the next one: it gets no more events, and its stream stays open, silent
  (``watcher.notify`` removes it without closing its channel; live on
  3.4.23 and 3.5.1: a stream not read while 20,000 events were written
  delivered 5,738 of them, then nothing, and stayed open);
* a watch whose index is in history gets that one event and is never
  registered: a stream opened so stays silent after it.
"""
from __future__ import annotations

import heapq
from collections import deque
from functools import lru_cache
from datetime import datetime, timedelta, timezone
from enum import Enum
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Tuple

from . import gojson

SECOND = 1_000_000_000
HISTORY = 1000
WATCHER_BUFFER = 100
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class Version(str, Enum):
    """The etcd release whose v2 store is modelled: they differ in error handling only."""

    V3_4 = "3.4"
    V3_5 = "3.5"


class Code(int, Enum):
    """etcd v2 error codes the model answers with (v2error/error.go)."""

    KEY_NOT_FOUND = 100
    TEST_FAILED = 101
    NOT_FILE = 102
    NOT_DIR = 104
    NODE_EXIST = 105
    ROOT_READ_ONLY = 107
    DIR_NOT_EMPTY = 108
    PREV_VALUE_REQUIRED = 201
    TTL_NAN = 202
    INDEX_NAN = 203
    INVALID_FIELD = 209
    INVALID_FORM = 210
    REFRESH_VALUE = 211
    REFRESH_TTL_REQUIRED = 212
    RAFT_INTERNAL = 300
    EVENT_INDEX_CLEARED = 401


MESSAGES = {
    Code.KEY_NOT_FOUND: "Key not found",
    Code.TEST_FAILED: "Compare failed",
    Code.NOT_FILE: "Not a file",
    Code.NOT_DIR: "Not a directory",
    Code.NODE_EXIST: "Key already exists",
    Code.ROOT_READ_ONLY: "Root is read only",
    Code.DIR_NOT_EMPTY: "Directory not empty",
    Code.PREV_VALUE_REQUIRED: "PrevValue is Required in POST form",
    Code.TTL_NAN: "The given TTL in POST form is not a number",
    Code.INDEX_NAN: "The given index in POST form is not a number",
    Code.INVALID_FIELD: "Invalid field",
    Code.INVALID_FORM: "Invalid POST form",
    Code.REFRESH_VALUE: "Value provided on refresh",
    Code.REFRESH_TTL_REQUIRED: "A TTL must be provided on refresh",
    Code.RAFT_INTERNAL: "Raft Internal Error",
    Code.EVENT_INDEX_CLEARED: "The event in requested index is outdated and cleared",
}

#: HTTP status of each code; every other code is 400 (v2error errorStatus).
STATUS = {Code.KEY_NOT_FOUND: 404, Code.NOT_FILE: 403, Code.DIR_NOT_EMPTY: 403,
          Code.TEST_FAILED: 412, Code.NODE_EXIST: 412, Code.RAFT_INTERNAL: 500}


class V2Error(Exception):
    """An error reply of etcd's: code, cause and the index it reports."""

    def __init__(self, code: Code, cause: str, index: int) -> None:
        super().__init__(f"{int(code)} {cause}")
        self.code, self.cause, self.index = code, cause, index

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 400)

    def json(self) -> str:
        fields: Dict[str, Any] = {"errorCode": int(self.code), "message": MESSAGES[self.code]}
        if self.cause:
            fields["cause"] = self.cause
        fields["index"] = self.index
        return gojson.encode(fields)


class Action(str, Enum):
    GET = "get"
    CREATE = "create"
    SET = "set"
    UPDATE = "update"
    DELETE = "delete"
    COMPARE_AND_SWAP = "compareAndSwap"
    COMPARE_AND_DELETE = "compareAndDelete"
    EXPIRE = "expire"


class Node:
    """A key: a file (``value``) or a directory (``children``, in insertion order)."""

    __slots__ = ("path", "value", "children", "created", "modified", "expire", "alive")

    def __init__(self, path: str, value: Optional[str], index: int,
                 expire: Optional[int]) -> None:
        self.path = path
        self.value = value
        self.children: Optional[Dict[str, Node]] = {} if value is None else None
        self.created = self.modified = index
        self.expire = expire
        self.alive = True

    @property
    def is_dir(self) -> bool:
        return self.children is not None

    def copy(self) -> "Node":
        twin = Node(self.path, self.value, self.created, self.expire)
        twin.modified = self.modified
        if self.children is not None:
            twin.children = {name: child.copy() for name, child in self.children.items()}
        return twin


class Event:
    """One event: the reply to a write, an entry of history, a watch's delivery."""

    __slots__ = ("action", "key", "index", "node", "prev", "refresh", "etcd_index", "_line")

    def __init__(self, action: Action, key: str, index: int, node: Optional[Dict[str, Any]],
                 prev: Optional[Dict[str, Any]] = None, refresh: bool = False) -> None:
        self.action, self.key, self.index = action, key, index
        self.node, self.prev, self.refresh = node, prev, refresh
        self.etcd_index = index
        self._line: Optional[bytes] = None

    @property
    def prev_is_dir(self) -> bool:
        return bool(self.prev and self.prev.get("dir"))

    def json(self, without_nodes: bool = False) -> str:
        fields: Dict[str, Any] = {"action": self.action.value}
        if self.node is not None and not without_nodes:
            fields["node"] = self.node
        if self.prev is not None and not without_nodes:
            fields["prevNode"] = self.prev
        return gojson.encode(fields)  # etcd's replies never show Event.Refresh (live, 3.4, 3.5)

    def line(self) -> bytes:
        """The event as etcd writes it on a watch: its JSON and a newline."""
        if self._line is None:
            self._line = (self.json() + "\n").encode("utf-8", "surrogateescape")
        return self._line


def clean(path: str) -> str:
    """Go's ``path.Clean`` of ``"/" + path``."""
    parts: List[str] = []
    for part in path.split("/"):
        if part == "..":
            if parts:
                parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/" + "/".join(parts)


def shown(path: str) -> str:
    """A path as replies show it: etcd's root is ``/1``, shown as nothing."""
    return "" if path == "/" else path


def expiration(expire: int) -> str:
    """An expiry time as Go's JSON writes a UTC time.Time (RFC 3339, nanoseconds trimmed)."""
    seconds, nanos = divmod(expire, SECOND)
    text = _civil(seconds)
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{text}.{fraction}Z" if fraction else f"{text}Z"


@lru_cache(maxsize=4096)
def _civil(seconds: int) -> str:
    return (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")


def ttl_left(expire: int, now: int) -> int:
    """etcd's reported ttl: the seconds left rounded up, toward zero once past."""
    left = expire - now
    if left >= 0:
        return left // SECOND + (1 if left % SECOND else 0)
    return -((-left) // SECOND)


def is_hidden(watch_path: str, key: str) -> bool:
    """Whether ``key`` is hidden from a watcher at ``watch_path`` (watcher_hub.isHidden)."""
    if len(watch_path) > len(key):
        return False
    return "/_" in clean("/" + key[len(watch_path):])


class Watcher:
    """One watch request: the events it has for its client, until it ends.

    The client takes events with :meth:`take`.  A watch that is not a
    stream ends after its one event; a stream ends only when its member
    restarts or the client closes it (:meth:`close`).
    """

    def __init__(self, hub: "Store", key: str, recursive: bool, stream: bool, since: int,
                 start_index: int, buffer: int) -> None:
        self._hub = hub
        self.key, self.recursive, self.stream = key, recursive, stream
        self.since = since
        #: etcd's index when the watch was made: the reply's X-Etcd-Index.
        self.start_index = start_index
        self.pending: Deque[Event] = deque()
        self._buffer = buffer
        self.registered = False
        #: Dropped for falling ``buffer`` events behind: silent from then on.
        self.dropped = False
        self.closed = False

    @property
    def ended(self) -> bool:
        """Whether the reply is over: nothing more will ever come."""
        if self.closed:
            return True
        return not self.stream and not self.pending and not self.registered

    def take(self) -> List[bytes]:
        """The events that came since the last take, as etcd's JSON lines."""
        lines = [event.line() for event in self.pending]
        if not self.stream and lines:
            lines = lines[:1]
            self.closed = True
        self.pending.clear()
        return lines

    def close(self) -> None:
        """The connection is gone (client closed it, member restarted)."""
        self.closed = True
        self.pending.clear()
        self._hub.unregister(self)

    def notify(self, event: Event, original: bool, deleted: bool) -> bool:
        if not (self.recursive or original or deleted) or event.index < self.since:
            return False
        if len(self.pending) >= self._buffer:
            self.dropped = True
            self._hub.unregister(self)
        else:
            self.pending.append(event)
        return True


class History:
    """The last ``capacity`` events of the whole store, indexes contiguous."""

    def __init__(self, capacity: int) -> None:
        self.events: Deque[Event] = deque(maxlen=capacity)

    @property
    def start(self) -> int:
        return self.events[0].index if self.events else 0

    @property
    def last(self) -> int:
        return self.events[-1].index if self.events else 0

    def copy(self) -> "History":
        twin = History(self.events.maxlen or HISTORY)
        twin.events.extend(self.events)
        return twin

    def scan(self, key: str, recursive: bool, index: int, current: int) -> Optional[Event]:
        """The first event from ``index`` on that a watch of ``key`` sees, None if none yet."""
        start = self.start
        if index < start:
            raise V2Error(Code.EVENT_INDEX_CLEARED,
                          f"the requested history has been cleared [{start}/{index}]", current)
        if index > self.last:
            return None
        prefix = key if key.endswith("/") else key + "/"
        for position in range(index - start, len(self.events)):
            event = self.events[position]
            if event.refresh:
                continue
            seen = event.key == key or (recursive and event.key.startswith(prefix))
            if event.action in (Action.DELETE, Action.EXPIRE) and event.prev_is_dir:
                seen = seen or key.startswith(event.prev["key"] if event.prev else "")
            if seen:
                return event
        return None


Shuffle = Callable[[List[Any]], None]


class Store:
    """The key tree, its index, history and watchers, as one member applies them."""

    def __init__(self, *, version: Version = Version.V3_5, history: int = HISTORY,
                 watcher_buffer: int = WATCHER_BUFFER, shuffle: Optional[Shuffle] = None) -> None:
        self.version = version
        self.root = Node("/", None, 0, None)
        self.index = 0
        self.history = History(history)
        self.watchers: Dict[str, List[Watcher]] = {}
        self.watcher_buffer = watcher_buffer
        #: Orders an unsorted listing (etcd: Go's random map order); None: insertion order.
        self.shuffle = shuffle
        self._ttl: List[Tuple[int, int, Node]] = []
        self._pushed = 0

    # -- state transfer (raft snapshots) -------------------------------------
    def restore(self, other: "Store") -> None:
        """Take ``other``'s tree, index and history, keeping this store's watchers.

        As etcd's store.Recovery does: the watchers stay registered, and
        miss every event between their last one and the snapshot.
        """
        self.root = other.root.copy()
        self.index = other.index
        self.history = other.history.copy()
        self._ttl, self._pushed = [], 0
        for node in self._walk_all(self.root):
            if node.expire is not None:
                self._track(node)

    def snapshot(self) -> "Store":
        """A detached copy of the tree, index and history, without watchers: a raft snapshot."""
        image = Store(version=self.version, history=self.history.events.maxlen or HISTORY,
                      watcher_buffer=self.watcher_buffer, shuffle=self.shuffle)
        image.restore(self)
        return image

    def drop_watchers(self) -> None:
        """A restart: every watch connection ends."""
        for watchers in list(self.watchers.values()):
            for watcher in list(watchers):
                watcher.close()

    def unregister(self, watcher: Watcher) -> None:
        if not watcher.registered:
            return
        watcher.registered = False
        watchers = self.watchers[watcher.key]
        watchers.remove(watcher)
        if not watchers:
            del self.watchers[watcher.key]

    # -- reads ----------------------------------------------------------------
    def get(self, key: str, recursive: bool, sorted_: bool, now: int) -> Event:
        node = self._lookup(key)
        body = self._listing(node, sorted_, recursive, now) if node.is_dir else None
        event = Event(Action.GET, key, node.modified,
                      self._repr(node, now, listing=body))
        event.etcd_index = self.index
        return event

    def watch(self, key: str, recursive: bool, stream: bool, since: int) -> Watcher:
        key = clean(key)
        if since == 0:
            since = self.index + 1
        found = self.history.scan(key, recursive, since, self.index)
        watcher = Watcher(self, key, recursive, stream, since, self.index, self.watcher_buffer)
        if found is not None:
            watcher.pending.append(found)
            return watcher
        watcher.registered = True
        self.watchers.setdefault(key, []).append(watcher)
        return watcher

    def has_ttl_keys(self) -> bool:
        while self._ttl and not self._valid(self._ttl[0]):
            heapq.heappop(self._ttl)
        return bool(self._ttl)

    # -- writes ---------------------------------------------------------------
    def set(self, key: str, dir_: bool, value: str, expire: Optional[int], refresh: bool,
            now: int) -> Event:
        try:
            old: Optional[Node] = self._lookup(key)
        except V2Error as exc:
            if exc.code != Code.KEY_NOT_FOUND or refresh:
                raise
            old = None
        if refresh and old is not None:
            value = old.value or ""
        event = self._create(key, dir_, value, False, True, expire, Action.SET, now)
        event.refresh = refresh
        self._publish(event)
        return event

    def create(self, key: str, dir_: bool, value: str, unique: bool, expire: Optional[int],
               now: int) -> Event:
        event = self._create(key, dir_, value, unique, False, expire, Action.CREATE, now)
        self._publish(event)
        return event

    def update(self, key: str, value: str, expire: Optional[int], refresh: bool,
               now: int) -> Event:
        self._writable(key)
        node = self._lookup(key)
        if node.is_dir and value:
            raise V2Error(Code.NOT_FILE, key, self.index)
        if refresh:
            value = node.value or ""
        index = self.index + 1
        prev = self._repr(node, now)
        if node.is_dir and self.version is not Version.V3_4:
            # 3.5 checks node.Write's error, 3.4 drops it: a fmt error, so 500/300,
            # its cause untrimmed (live: "nodePath /1/q/d : Not a file ()").
            raise V2Error(Code.RAFT_INTERNAL, f"nodePath /1{key} : Not a file ()", 0)
        if not node.is_dir:
            node.value, node.modified = value, index
        self._set_expire(node, expire)
        event = Event(Action.UPDATE, key, index, self._written(node, key, index, now), prev,
                      refresh)
        self.index = index
        self._publish(event)
        return event

    def compare_and_swap(self, key: str, prev_value: str, prev_index: int, value: str,
                         expire: Optional[int], refresh: bool, now: int) -> Event:
        self._writable(key)
        node = self._compared(key, prev_value, prev_index)
        if refresh:
            value = node.value or ""
        self.index += 1
        prev = self._repr(node, now)
        node.value, node.modified = value, self.index
        self._set_expire(node, expire)
        event = Event(Action.COMPARE_AND_SWAP, key, self.index,
                      self._written(node, key, self.index, now), prev, refresh)
        self._publish(event)
        return event

    def delete(self, key: str, dir_: bool, recursive: bool, now: int) -> Event:
        self._writable(key)
        node = self._lookup(key)
        index = self.index + 1
        event = Event(Action.DELETE, key, index, self._bare(node, key, index),
                      self._repr(node, now))
        self._remove(node, dir_ or recursive, recursive, event)
        self.index = index
        self._publish(event)
        return event

    def compare_and_delete(self, key: str, prev_value: str, prev_index: int,
                           now: int) -> Event:
        node = self._compared(key, prev_value, prev_index)
        self.index += 1
        event = Event(Action.COMPARE_AND_DELETE, key, self.index,
                      self._bare(node, key, self.index), self._repr(node, now))
        self._remove(node, False, False, event)
        self._publish(event)
        return event

    def expire_keys(self, cutoff: int, now: int) -> List[Event]:
        """The leader's sweep: every key whose expiry is at or before ``cutoff``."""
        events = []
        while self.has_ttl_keys() and self._ttl[0][0] <= cutoff:
            node = heapq.heappop(self._ttl)[2]
            self.index += 1
            event = Event(Action.EXPIRE, node.path, self.index,
                          self._bare(node, node.path, self.index), self._repr(node, now))
            self._remove(node, True, True, event)
            self._publish(event)
            events.append(event)
        return events

    # -- the tree -------------------------------------------------------------
    def _writable(self, key: str) -> None:
        if key == "/":
            raise V2Error(Code.ROOT_READ_ONLY, "/", self.index)

    def _lookup(self, key: str) -> Node:
        node = self.root
        for name in key.split("/")[1:]:
            if not name:
                break
            if node.children is None:
                raise V2Error(Code.NOT_DIR, shown(node.path), self.index)
            child = node.children.get(name)
            if child is None:
                raise V2Error(Code.KEY_NOT_FOUND, clean(node.path + "/" + name), self.index)
            node = child
        return node

    def _compared(self, key: str, prev_value: str, prev_index: int) -> Node:
        """The file at ``key`` if both conditions hold (node.Compare), else etcd's error."""
        node = self._lookup(key)
        if node.is_dir:
            raise V2Error(Code.NOT_FILE, shown(key), self.index)
        index_ok = prev_index == 0 or node.modified == prev_index
        value_ok = prev_value == "" or node.value == prev_value
        if index_ok and value_ok:
            return node
        if index_ok:
            cause = f"[{prev_value} != {node.value}]"
        elif value_ok:
            cause = f"[{prev_index} != {node.modified}]"
        else:
            cause = f"[{prev_value} != {node.value}] [{prev_index} != {node.modified}]"
        raise V2Error(Code.TEST_FAILED, cause, self.index)

    def _create(self, key: str, dir_: bool, value: str, unique: bool, replace: bool,
                expire: Optional[int], action: Action, now: int) -> Event:
        index = self.index + 1
        if unique:
            key = clean(f"{key}/{index:020d}")
        self._writable(key)
        parent_path, name = key.rsplit("/", 1)
        parent = self._parent(parent_path or "/", index)
        old = parent.children.get(name) if parent.children is not None else None
        prev = None
        if old is not None:
            if not replace:
                raise V2Error(Code.NODE_EXIST, key, self.index)
            if old.is_dir:
                raise V2Error(Code.NOT_FILE, key, self.index)
            prev = self._repr(old, now)
            self._detach(old)
        node = Node(key, None if dir_ else value, index, expire)
        assert parent.children is not None
        parent.children[name] = node
        if expire is not None:
            self._track(node)
        self.index = index
        return Event(action, key, index, self._written(node, key, index, now), prev)

    def _parent(self, path: str, index: int) -> Node:
        """The directory ``path``, made with its missing ancestors (store.checkDir)."""
        node = self.root
        for name in path.split("/")[1:]:
            if not name:
                break
            assert node.children is not None
            child = node.children.get(name)
            if child is None:
                child = Node(clean(node.path + "/" + name), None, index, None)
                node.children[name] = child
            elif not child.is_dir:
                raise V2Error(Code.NOT_DIR, child.path, self.index)
            node = child
        return node

    def _remove(self, node: Node, dir_: bool, recursive: bool, event: Event) -> None:
        """node.Remove: the watchers of every removed path hear of ``event``."""
        if node.is_dir:
            if not dir_:
                raise V2Error(Code.NOT_FILE, node.path, self.index)
            if node.children and not recursive:
                raise V2Error(Code.DIR_NOT_EMPTY, node.path, self.index)
        for removed in self._walk_all(node):
            removed.alive = False
        self._detach(node)
        for removed in self._walk_all(node):
            self._notify_path(event, removed.path, True)

    def _detach(self, node: Node) -> None:
        node.alive = False
        parent_path, name = node.path.rsplit("/", 1)
        parent = self._lookup(parent_path or "/")
        if parent.children is not None and parent.children.get(name) is node:
            del parent.children[name]

    def _walk_all(self, node: Node) -> Iterator[Node]:
        """``node`` and everything under it, children before their directory."""
        for child in list((node.children or {}).values()):
            yield from self._walk_all(child)
        yield node

    # -- TTLs -----------------------------------------------------------------
    def _set_expire(self, node: Node, expire: Optional[int]) -> None:
        """node.UpdateTTL: no expiry given makes the key permanent again."""
        node.expire = expire
        if expire is not None:
            self._track(node)

    def _track(self, node: Node) -> None:
        """Into the TTL heap; ties expire in the order the keys got their TTL."""
        assert node.expire is not None
        self._pushed += 1
        heapq.heappush(self._ttl, (node.expire, self._pushed, node))

    @staticmethod
    def _valid(entry: Tuple[int, int, Node]) -> bool:
        expire, _, node = entry
        return node.alive and node.expire == expire

    # -- watchers -------------------------------------------------------------
    def _publish(self, event: Event) -> None:
        """Into history; a refresh notifies nobody (store.go: WatcherHub.add)."""
        self.history.events.append(event)
        if event.refresh:
            return
        if not self.watchers:
            return
        self._notify_path(event, "/", False)
        path = ""
        for segment in event.key.split("/")[1:]:  # the key is clean: no empty segment
            path += "/" + segment
            self._notify_path(event, path, False)

    def _notify_path(self, event: Event, path: str, deleted: bool) -> None:
        watchers = self.watchers.get(path)
        if not watchers:
            return
        original = event.key == path
        if not original and is_hidden(path, event.key):
            return
        for watcher in list(watchers):
            if watcher.notify(event, original, deleted) and not watcher.stream:
                self.unregister(watcher)

    # -- replies --------------------------------------------------------------
    def _ttl_fields(self, node: Node, fields: Dict[str, Any], now: int) -> None:
        if node.expire is not None:
            fields["expiration"] = expiration(node.expire)
            ttl = ttl_left(node.expire, now)
            if ttl:
                fields["ttl"] = ttl

    def _repr(self, node: Node, now: int, recursive: bool = False, sorted_: bool = False,
              listing: Optional[List[Dict[str, Any]]] = None) -> Dict[str, Any]:
        """node.Repr (or loadInternalNode when ``listing`` is given), as a Go-ordered dict."""
        fields: Dict[str, Any] = {}
        if node.path != "/":
            fields["key"] = node.path
        if node.is_dir:
            fields["dir"] = True
        else:
            fields["value"] = node.value
        self._ttl_fields(node, fields, now)
        if listing is None and recursive and node.is_dir:
            listing = self._listing(node, sorted_, True, now)
        if listing:
            fields["nodes"] = listing
        self._indexes(fields, node.modified, node.created)
        return fields

    def _listing(self, node: Node, sorted_: bool, recursive: bool,
                 now: int) -> List[Dict[str, Any]]:
        """A directory's children that are not hidden, sorted by key or in store order."""
        assert node.children is not None
        children = [child for name, child in node.children.items() if not name.startswith("_")]
        if sorted_:
            children.sort(key=lambda child: child.path)
        elif self.shuffle is not None:
            self.shuffle(children)
        return [self._repr(child, now, recursive, sorted_) for child in children]

    def _written(self, node: Node, key: str, index: int, now: int) -> Dict[str, Any]:
        """The node of a write's event: key, value or dir, ttl, indexes."""
        fields: Dict[str, Any] = {"key": shown(key)} if key != "/" else {}
        if node.is_dir:
            fields["dir"] = True
        else:
            fields["value"] = node.value
        self._ttl_fields(node, fields, now)
        self._indexes(fields, index, node.created)
        return fields

    @staticmethod
    def _bare(node: Node, key: str, index: int) -> Dict[str, Any]:
        """The node of a delete or expire event: no value."""
        fields: Dict[str, Any] = {"key": shown(key)}
        if node.is_dir:
            fields["dir"] = True
        Store._indexes(fields, index, node.created)
        return fields

    @staticmethod
    def _indexes(fields: Dict[str, Any], modified: int, created: int) -> None:
        if modified:
            fields["modifiedIndex"] = modified
        if created:
            fields["createdIndex"] = created
