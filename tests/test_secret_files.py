"""The password and the dashboard's token can be read from a file, so that neither shows
in ``ps``: the password in the file is the one etcd is sent, the token in the file is the
one the API requires."""
from __future__ import annotations

import base64
import os
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List

import pytest


def _etcdq(args: List[str], env: Dict[str, str] = None, **kwargs) -> "subprocess.Popen[str]":
    return subprocess.Popen([sys.executable, "-m", "etcdq_v2", *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, **(env or {})}, **kwargs)


def _first_request(listener: socket.socket, seen: List[bytes]) -> None:
    connection, _ = listener.accept()
    with connection:
        connection.settimeout(30)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = connection.recv(65536)
            if not chunk:
                break
            data += chunk
        seen.append(data)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_the_password_file_s_first_line_is_the_password_sent(tmp_path: Path, how: str
                                                             ) -> None:
    secret = tmp_path / "password"
    secret.write_text("pw from a file\nnot this line\n")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    seen: List[bytes] = []
    reader = threading.Thread(target=_first_request, args=(listener, seen), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    args = ["--endpoints", url, "--username", "alice", "--request-timeout", "1"]
    env = {"ETCDQ_PASSWORD_FILE": str(secret)} if how == "environment" else {}
    if how == "option":
        args += ["--password-file", str(secret)]
    process = _etcdq([*args, "stats", "q"], env=env)
    try:
        reader.join(60)
    finally:
        process.kill()
        process.communicate()
        listener.close()
    expected = base64.b64encode(b"alice:pw from a file")
    assert seen and b"Authorization: Basic " + expected in seen[0], seen


def test_a_password_and_its_file_together_are_a_usage_error(tmp_path: Path) -> None:
    secret = tmp_path / "password"
    secret.write_text("pw\n")
    process = _etcdq(["--username", "a", "--password-file", str(secret), "stats", "q"],
                     env={"ETCDQ_PASSWORD": "other"})
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "not both" in err
    process = _etcdq(["--username", "a", "--password-file", str(tmp_path / "none"),
                      "stats", "q"])
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2 and "cannot read the password" in err


def test_the_dashboard_requires_the_token_of_its_token_file(etcd_url: str, tmp_path: Path
                                                            ) -> None:
    token = "a-token-read-from-a-file-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    process = _etcdq(["--endpoints", etcd_url, "dashboard", "--port", "0", "--token-file",
                      str(tmp_path / "token")])
    try:
        url = process.stdout.readline().strip()
        assert url.startswith("http://"), process.stderr.read()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url + "api/overview", timeout=30)
        assert refused.value.code == 401
        asked = urllib.request.Request(url + "api/overview",
                                       headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(asked, timeout=30) as answer:
            assert answer.status == 200
    finally:
        process.terminate()
        process.communicate(timeout=30)
