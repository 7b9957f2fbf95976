"""A headless Chromium driven over the DevTools protocol (CDP), for the browser tests.

Chromium is started with ``--headless=new --remote-debugging-port=0``: it
picks a free port and writes it to ``DevToolsActivePort`` in its profile
directory (and says so on stderr).  The tests talk to one page target over a
WebSocket: a client of RFC 6455 written here on the standard library (text
frames out, masked as a client must; text, continuation, ping and close
frames in), so the tests need no extra package.

Only what the tests use: navigate, evaluate JavaScript, click at a point,
type text, take a screenshot.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import urlsplit

#: The names Debian and other distributions give the Chromium binary.
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def find_chromium() -> Optional[str]:
    """``ETCDQ_CHROMIUM``, else the first Chromium on PATH; None if there is none."""
    chosen = os.environ.get("ETCDQ_CHROMIUM")
    if chosen:
        return chosen
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class CDPError(Exception):
    """An error reply from Chromium, or a page that did not do what was awaited."""


class WebSocket:
    """A minimal blocking WebSocket client (RFC 6455) over one TCP connection."""

    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        self._sock = socket.create_connection((host, port), timeout=timeout)
        self._file = self._sock.makefile("rb")
        key = base64.b64encode(os.urandom(16))
        # No Origin header: Chromium refuses DevTools WebSockets from origins
        # it was not told to allow, and accepts clients that send none.
        self._sock.sendall(b"GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\n"
                           b"Connection: Upgrade\r\nSec-WebSocket-Key: %s\r\n"
                           b"Sec-WebSocket-Version: 13\r\n\r\n"
                           % (parts.path.encode(), host.encode(), port, key))
        status = self._file.readline()
        response = self._headers()
        if b" 101 " not in status:
            raise CDPError(f"WebSocket upgrade refused: {status!r}")
        accept = base64.b64encode(hashlib.sha1(key + _GUID).digest())
        if response.get(b"sec-websocket-accept") != accept:
            raise CDPError("WebSocket upgrade answered with a wrong Sec-WebSocket-Accept")

    def _headers(self) -> Dict[bytes, bytes]:
        headers = {}
        for line in iter(self._file.readline, b"\r\n"):
            if not line:
                raise CDPError("connection closed during the WebSocket upgrade")
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        return headers

    def send(self, text: str) -> None:
        self._frame(0x1, text.encode("utf-8"))

    def _frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        size = len(payload)
        if size < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | size)
        elif size < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, size)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, size)
        masked = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        self._sock.sendall(head + mask + masked)

    def receive(self) -> str:
        """The next text message (fragments joined; pings answered)."""
        parts: List[bytes] = []
        while True:
            final, opcode, payload = self._read_frame()
            if opcode == 0x9:
                self._frame(0xA, payload)
            elif opcode == 0x8:
                raise CDPError("Chromium closed the DevTools connection")
            elif opcode in (0x0, 0x1, 0x2):
                parts.append(payload)
                if final:
                    return b"".join(parts).decode("utf-8")

    def _read_frame(self) -> Tuple[bool, int, bytes]:
        first, second = self._exact(2)
        size = second & 0x7F
        if size == 126:
            size = struct.unpack("!H", self._exact(2))[0]
        elif size == 127:
            size = struct.unpack("!Q", self._exact(8))[0]
        mask = self._exact(4) if second & 0x80 else b""
        payload = self._exact(size)
        if mask:
            payload = bytes(byte ^ mask[i % 4] for i, byte in enumerate(payload))
        return bool(first & 0x80), first & 0x0F, payload

    def _exact(self, size: int) -> bytes:
        data = self._file.read(size)
        if len(data) != size:
            raise CDPError("the DevTools connection ended mid-frame")
        return data

    def close(self) -> None:
        try:
            self._frame(0x8, b"")
        except OSError:
            pass
        self._file.close()
        self._sock.close()


class Page:
    """One page target: commands by id; events are read past (the tests poll the DOM)."""

    def __init__(self, socket_url: str, timeout: float = 15.0) -> None:
        self._ws = WebSocket(socket_url, timeout)
        self._next = 0

    def call(self, method: str, **params: Any) -> Dict[str, Any]:
        self._next += 1
        self._ws.send(json.dumps({"id": self._next, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.receive())
            if message.get("id") == self._next:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                result: Dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        reply = self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                          awaitPromise=True)
        if "exceptionDetails" in reply:
            raise CDPError(f"{expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    def open(self, url: str, timeout: float = 15.0) -> None:
        """Navigate, and wait until the document (and its deferred script) loaded."""
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while self.evaluate("document.readyState + ' ' + location.href") != f"complete {url}":
            if time.monotonic() > deadline:
                raise CDPError(f"{url} did not load within {timeout:g} s")
            time.sleep(0.05)

    def click(self, selector: str) -> None:
        """A real mouse click (pressed, released) at the middle of the element."""
        box = self.evaluate(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " if (!e) return null; e.scrollIntoView({block: 'center'});"
            " const r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if box is None:
            raise CDPError(f"nothing to click: no {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1],
                      button="left", clickCount=1)

    def type_text(self, text: str) -> None:
        """Type into the focused element, as a keyboard's input would."""
        self.call("Input.insertText", text=text)

    def screenshot(self, width: int, max_height: int) -> bytes:
        """A PNG of the whole page (up to ``max_height``) laid out ``width`` CSS pixels wide."""
        # No scrollbar: the page is laid out at the full width, measured, and shown whole.
        self.call("Emulation.setScrollbarsHidden", hidden=True)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=600,
                  deviceScaleFactor=1, mobile=False)
        height = min(int(self.evaluate("document.documentElement.scrollHeight")), max_height)
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)
        self.evaluate("window.scrollTo(0, 0)")
        try:
            return base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        finally:
            self.call("Emulation.clearDeviceMetricsOverride")
            self.call("Emulation.setScrollbarsHidden", hidden=False)

    def close(self) -> None:
        self._ws.close()


class Chromium:
    """A headless Chromium process of the tests' own, with a throwaway profile."""

    def __init__(self, binary: str, profile: Path, timeout: float = 20.0) -> None:
        self._stderr = (profile.parent / "chromium.log").open("wb")
        args = [binary, "--headless=new", "--remote-debugging-port=0",
                f"--user-data-dir={profile}", "--no-first-run", "--no-default-browser-check",
                "--disable-gpu", "--disable-extensions", "--disable-background-networking",
                "--disable-dev-shm-usage", "--window-size=1280,900",
                # The sandbox needs user namespaces, which containers and root often
                # lack; the browser only ever loads the tests' own local page.
                "--no-sandbox", "about:blank"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._stderr,
                                        start_new_session=True)
        self.log = profile.parent / "chromium.log"
        self.port = self._port(profile / "DevToolsActivePort", timeout)

    def _port(self, marker: Path, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise CDPError(f"Chromium exited ({self.process.returncode}): "
                               f"{self.log.read_text(errors='replace')[-2000:]}")
            lines = marker.read_text().splitlines() if marker.exists() else []
            if lines and lines[0].isdigit():
                return int(lines[0])
            time.sleep(0.05)
        raise CDPError(f"Chromium wrote no DevToolsActivePort within {timeout:g} s")

    def page(self) -> Page:
        """A connection to the browser's (first) page."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list",
                                    timeout=10) as reply:
            targets = json.load(reply)
        target = next(t for t in targets if t.get("type") == "page")
        return Page(target["webSocketDebuggerUrl"])

    def stop(self) -> None:
        """End Chromium and its helper processes (its own process group), by its id."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)  # a helper left behind gets the KILL
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
        self._stderr.close()
