"""A directory listing of etcd v2, decoded node by node as its body arrives.

etcd v2 has no paging: ``GET /v2/keys/dir`` answers with one JSON document
holding every child, values included (about 20 MB at 100,000 items of 100
bytes).  Decoded whole, it costs several times that in Python objects.
:func:`listed_nodes` reads the document as it comes off the connection and
yields each child as soon as it is complete, so memory holds one child and
a piece of the body (64 KiB), never the listing: what export needs to read
a queue of any length.

The document is ``{"action":"get","node":{"key":...,"dir":true,
"nodes":[{child},{child},...],"modifiedIndex":...}}``; an empty directory
has no ``"nodes"``.  Every ``"`` inside a value is escaped, so the first
``"nodes":[`` of the body is the listed directory's.
"""
from __future__ import annotations

import codecs
import json
from typing import Any, Dict, Iterable, Iterator, Optional

_NODES = '"nodes":['
#: A key of the listed node itself that etcd writes after its "nodes": seen
#: before any "nodes", the directory is empty.
_AFTER_NODES = '"modifiedIndex"'
#: Text already decoded is dropped once this much of it has been used.
_KEEP = 1 << 16
_SEPARATORS = " \t\r\n,"
_DECODER = json.JSONDecoder()


def listed_nodes(pieces: Iterable[bytes]) -> Iterator[Dict[str, Any]]:
    """The children in a v2 GET reply of a directory, whose body comes as ``pieces``.

    ValueError if the body is not such a document, or ends before it does.
    """
    reader = _Reader(pieces)
    if not reader.find_nodes():
        return
    while True:
        node = reader.next_node()
        if node is None:
            return
        yield node


class _Reader:
    """The body's text, decoded as pieces arrive, and how far it has been read."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self._pieces = iter(pieces)
        self._decode = codecs.getincrementaldecoder("utf-8")().decode
        self.text = ""
        self.pos = 0

    def find_nodes(self) -> bool:
        """Move past ``"nodes":[``; False for a directory without children."""
        while True:
            found = self.text.find(_NODES, self.pos)
            if found >= 0:
                self.pos = found + len(_NODES)
                return True
            if _AFTER_NODES in self.text:
                return False
            if not self._more():
                raise ValueError(f"not an etcd listing: {self.text[:80]!r}")

    def next_node(self) -> Optional[Dict[str, Any]]:
        """The next child, None after the last one.

        A child cut between two pieces fails to decode: the next piece is
        added and it is decoded again (a child is an object, which cannot
        decode before its closing brace has arrived).
        """
        while True:
            self._skip_separators()
            if self.pos < len(self.text):
                if self.text[self.pos] == "]":
                    return None
                try:
                    node, self.pos = _DECODER.raw_decode(self.text, self.pos)
                except ValueError:
                    pass
                else:
                    if not isinstance(node, dict):
                        raise ValueError(f"a listed node that is not an object: {node!r:.80}")
                    return node
            if not self._more():
                raise ValueError("the listing ended in the middle")

    def _skip_separators(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in _SEPARATORS:
            self.pos += 1

    def _more(self) -> bool:
        """Add the next piece to the text (dropping what was used); False at the end."""
        piece = next(self._pieces, None)
        if self.pos > _KEEP:
            self.text, self.pos = self.text[self.pos:], 0
        if piece is None:
            self.text += self._decode(b"", True)
            return False
        self.text += self._decode(piece)
        return True
