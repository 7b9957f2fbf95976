"""TLS with client certificates, and etcd v2 auth with a role limited to the prefix."""
from __future__ import annotations

import base64
import json
import urllib.request

import pytest
import trustme

from etcdq_v2 import AuthError, ConfigError, EtcdqError, Queue, connect
from etcdq_v2.server import EtcdServer

from helpers import wait_until


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_files(ca: trustme.CA, tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("tls")
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("etcdq-worker")
    files = {name: folder / f"{name}.pem" for name in
             ("ca", "server_cert", "server_key", "client_cert", "client_key", "other_ca")}
    ca.cert_pem.write_to_path(files["ca"])
    server.cert_chain_pems[0].write_to_path(files["server_cert"])
    server.private_key_pem.write_to_path(files["server_key"])
    client.cert_chain_pems[0].write_to_path(files["client_cert"])
    client.private_key_pem.write_to_path(files["client_key"])
    trustme.CA().cert_pem.write_to_path(files["other_ca"])
    return {name: str(path) for name, path in files.items()}


@pytest.fixture(scope="module")
def tls_etcd(etcd_binary: str, tls_files: dict, tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("tls-etcd") / "data", binary=etcd_binary,
                        scheme="https", extra_args=[
                            "--cert-file", tls_files["server_cert"],
                            "--key-file", tls_files["server_key"],
                            "--client-cert-auth", "--trusted-ca-file", tls_files["ca"]])
    server.start(wait=False)
    client = connect(server.url, ca_cert=tls_files["ca"], cert=tls_files["client_cert"],
                     key=tls_files["client_key"], timeout=1, deadline=1)
    wait_until(lambda: client.get("/") is not None, 30, ignore=(EtcdqError,),
               message="etcd with TLS to answer")
    yield server
    server.stop()


def test_tls_with_a_client_certificate(tls_etcd: EtcdServer, tls_files: dict,
                                       queue_name: str) -> None:
    client = connect(tls_etcd.url, ca_cert=tls_files["ca"], cert=tls_files["client_cert"],
                     key=tls_files["client_key"])
    with Queue(client, queue_name) as queue:
        item_id = queue.put({"secret": True})
        claim = queue.claim(timeout=5)  # the watch runs over TLS too
        assert claim.id == item_id
        claim.complete()
        assert queue.stats()["completed"] == 1


def test_a_wrong_ca_is_a_clear_error_never_unverified(tls_etcd: EtcdServer, tls_files: dict,
                                                      queue_name: str) -> None:
    client = connect(tls_etcd.url, ca_cert=tls_files["other_ca"],
                     cert=tls_files["client_cert"], key=tls_files["client_key"])
    with pytest.raises(ConfigError, match="(?i)certificate verify failed"):
        Queue(client, queue_name).put("x")


def test_no_ca_means_the_system_cas_which_do_not_trust_a_private_ca(
        tls_etcd: EtcdServer, tls_files: dict, queue_name: str) -> None:
    client = connect(tls_etcd.url, cert=tls_files["client_cert"], key=tls_files["client_key"])
    with pytest.raises(ConfigError, match="(?i)certificate"):
        Queue(client, queue_name).put("x")


def test_without_a_client_certificate_etcd_refuses(tls_etcd: EtcdServer, tls_files: dict,
                                                   queue_name: str) -> None:
    client = connect(tls_etcd.url, ca_cert=tls_files["ca"], timeout=1, deadline=2)
    with pytest.raises(EtcdqError):
        Queue(client, queue_name).put("x")


# -- etcd v2 auth ---------------------------------------------------------------

def _admin(url: str, method: str, path: str, doc: dict = None, auth: tuple = None) -> None:
    request = urllib.request.Request(url + path, method=method,
                                     data=json.dumps(doc).encode() if doc else None)
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    urllib.request.urlopen(request, timeout=10).read()


MINIMAL_ROLE = {"role": "etcdq-worker",
                "permissions": {"kv": {"read": ["/etcdq/*"], "write": ["/etcdq/*"]}}}


@pytest.fixture(scope="module")
def auth_etcd(etcd_binary: str, tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("auth-etcd") / "data", binary=etcd_binary).start()
    url, root = server.url, ("root", "root-secret")
    _admin(url, "PUT", "/v2/auth/users/root", {"user": "root", "password": root[1]})
    _admin(url, "PUT", "/v2/auth/roles/etcdq-worker", MINIMAL_ROLE)
    _admin(url, "PUT", "/v2/auth/users/worker",
           {"user": "worker", "password": "worker-secret", "roles": ["etcdq-worker"]})
    _admin(url, "PUT", "/v2/auth/enable")
    _admin(url, "PUT", "/v2/auth/roles/guest",
           {"role": "guest", "revoke": {"kv": {"read": ["/*"], "write": ["/*"]}}}, auth=root)
    yield server
    server.stop()


def test_a_worker_with_the_minimal_role_runs_the_queue(auth_etcd: EtcdServer,
                                                       queue_name: str) -> None:
    client = connect(auth_etcd.url, username="worker", password="worker-secret")
    with Queue(client, queue_name) as queue:
        item_id = queue.put("authorised")
        claim = queue.claim(timeout=10)
        assert claim.id == item_id
        claim.complete()
        assert queue.stats() == {"pending": 0, "running": 0, "completed": 1, "failed": 0}


def test_a_wrong_password_is_an_auth_error(auth_etcd: EtcdServer, queue_name: str) -> None:
    client = connect(auth_etcd.url, username="worker", password="wrong")
    with pytest.raises(AuthError):
        Queue(client, queue_name).put("x")


def test_anonymous_access_is_refused(auth_etcd: EtcdServer, queue_name: str) -> None:
    with pytest.raises(AuthError):
        Queue(auth_etcd.url, queue_name).put("x")


def test_access_outside_the_prefix_is_an_auth_error(auth_etcd: EtcdServer,
                                                    queue_name: str) -> None:
    client = connect(auth_etcd.url, username="worker", password="worker-secret")
    with pytest.raises(AuthError):
        Queue(client, queue_name, prefix="/elsewhere").put("x")
