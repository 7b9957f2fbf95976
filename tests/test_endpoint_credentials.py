"""Credentials travel only as options, never in an endpoint URL, and never in clear text
unnoticed: TLS files on an http:// endpoint are refused, a password sent over http:// to
another host is warned of, and a URL with userinfo is refused without being echoed."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from etcdq_v2 import ConfigError, Queue, connect
from etcdq_v2.transport import Transport

SECRET = "s3cr3t-pw-42"
WITH_USERINFO = f"http://alice:{SECRET}@127.0.0.1:2"


@pytest.fixture
def tls_file(tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    path.write_text("not read: the endpoint check comes first\n")
    return str(path)


@pytest.mark.parametrize("option", ["ca_cert", "cert", "key"])
def test_tls_files_with_an_http_endpoint_are_a_config_error(tls_file: str, option: str
                                                             ) -> None:
    with pytest.raises(ConfigError, match="https://"):
        connect("https://127.0.0.1:2,http://127.0.0.1:3", **{option: tls_file})


def test_tls_files_with_an_http_endpoint_fail_every_verb(tls_file: str) -> None:
    done = _etcdq(["--endpoints", "http://127.0.0.1:2", "--ca-cert", tls_file, "stats", "q"])
    assert done.returncode == 2, done.stderr
    assert "http://127.0.0.1:2 is http://" in done.stderr


def test_basic_auth_over_http_off_this_host_is_warned_of(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    with caplog.at_level(logging.WARNING, "etcdq_v2.transport"):
        connect("http://127.0.0.1:2", username="alice", password=SECRET).close()
        assert not caplog.records  # loopback: the password does not leave this host
        connect("http://192.0.2.1:2379", username="alice", password=SECRET).close()
    [record] = caplog.records
    assert "clear text" in record.getMessage() and "192.0.2.1" in record.getMessage()
    assert SECRET not in caplog.text


@pytest.mark.parametrize("url", [WITH_USERINFO, f"https://{SECRET}@127.0.0.1:2",
                                 f"http://alice:{SECRET}@[::1]:2"])
def test_an_endpoint_with_credentials_is_refused_without_echoing_them(url: str) -> None:
    for attempt in (lambda: connect(url), lambda: Transport(url),
                    lambda: Queue(f"http://127.0.0.1:3,{url}", "q")):
        with pytest.raises(ConfigError) as caught:
            attempt()
        message = str(caught.value)
        assert SECRET not in message and "alice" not in message
        assert "--username" in message and "ETCDQ_PASSWORD" in message


def test_no_message_log_or_api_body_carries_an_endpoint_s_credentials(
        caplog: pytest.LogCaptureFixture) -> None:
    """Every way in that takes an endpoint: the CLI (its output and log, -vv), the
    dashboard (refused before it serves anything), the library (its log)."""
    from etcdq_v2.dashboard import Dashboard
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(ConfigError) as caught:
            Dashboard(WITH_USERINFO, port=0)
    assert SECRET not in str(caught.value) and SECRET not in caplog.text
    for args in (["-vv", "--endpoints", WITH_USERINFO, "stats", "q"],
                 ["-vv", "dashboard", "--port", "0"]):
        done = _etcdq(args, env={"ETCDQ_ENDPOINTS": WITH_USERINFO})
        assert done.returncode == 2, done.stderr
        assert SECRET not in done.stdout + done.stderr
        assert "--username" in done.stderr


def _etcdq(args: list, env: dict = None) -> "subprocess.CompletedProcess[str]":
    return subprocess.run([sys.executable, "-m", "etcdq_v2", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})
