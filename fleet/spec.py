"""The fleet spec: YAML in, typed frozen dataclasses out, validated once at the edge.

Dataclasses rather than pydantic: the schema is small, we want our own one-line error format with the field
path, and it keeps the controller's dependency list to what the issue already names.

Path rule (documented in docs/fleet-spec.md): string paths may use `${NAME}` from the environment, plus
`${SOLFLEET_WORK}`, which is always the controller's work dir (`--work-dir`, else $SOLFLEET_WORK, else
`<project>/.work`). Node paths (`root`, `python`) must then be absolute; controller paths (`ssh.*`) may be
relative to the spec file's directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from fleet import validate as v
from fleet.errors import SpecError, UsageError
from fleet.policy import Gates, Rollout, Timeouts, parse_gates, parse_rollout, parse_timeouts
from fleet.provision_spec import Provision, parse_provision, runtime_python
from fleet.service_spec import ServiceSpec, check_port_overlap, parse_service
from fleet.stack import (
    DEFAULT_PLATFORM,
    PIN_KEYS,
    REQUIRED_PINS,
    Requirement,
    Stack,
    parse_requirement,
    resolve_pin,
)

NAME_RE = r"[a-z0-9][a-z0-9_.-]{0,62}"
LABEL_RE = r"[a-z0-9][a-z0-9_-]{0,62}"
HOST_RE = r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}"
USER_RE = r"[a-z_][a-z0-9_-]{0,31}"
# semver with an optional pre-release; no `+build` and no `/`, so a version is always a safe file name
VERSION_RE = r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?"
PIN_RE = r"auto|[0-9][0-9A-Za-z.*+_-]{0,40}"
CC_RE = r"(5|6|7|8|9|10|11|12)\.[0-9]"

NODE_KEYS = [
    "name",
    "host",
    "port",
    "user",
    "connection",
    "root",
    "simulated",
    "labels",
    "gpu",
    "python",
    "ssh",
    "service",
]
DEFAULT_KEYS = [k for k in NODE_KEYS if k not in ("name", "host")]
STACK_KEYS = [*PIN_KEYS, "requirements", "platform"]


class Connection(StrEnum):
    SSH = "ssh"
    LOCAL = "local"


class ExecutionMode(StrEnum):
    """How fleet/runner.py runs each playbook (spec `execution.mode`, docs/fleet-spec.md)."""

    LOCAL = "local"  # ansible-runner starts ansible-playbook from this process
    STREAMING = "streaming"  # transmit -> an `ansible-runner worker` process -> process (Receptor's way)


@dataclass(frozen=True)
class Execution:
    mode: ExecutionMode = ExecutionMode.LOCAL


@dataclass(frozen=True)
class Gpu:
    count: int
    model: str
    cc: str | None


@dataclass(frozen=True)
class SshOptions:
    private_key_file: str | None
    known_hosts_file: str | None


@dataclass(frozen=True)
class Node:
    name: str
    host: str
    port: int
    user: str
    connection: Connection
    root: PurePosixPath
    simulated: bool
    labels: tuple[str, ...]
    gpu: Gpu | None
    python: str
    ssh: SshOptions
    service: ServiceSpec = ServiceSpec()  # the operator service (fleet/service_spec.py)


@dataclass(frozen=True)
class FleetSpec:
    name: str
    source: Path  # the spec file
    work_dir: Path  # controller work dir: ledger, runs, local node roots
    nodes: tuple[Node, ...]
    stack: Mapping[str, str]  # resolved pins (no "auto" left)
    rollout: Rollout
    gates: Gates
    timeouts: Timeouts
    requirements: tuple[Requirement, ...] = ()  # the runtime's other locked requirements (stack.requirements)
    platform: str = DEFAULT_PLATFORM  # pip platform tag of the stack's wheelhouse
    provision: Provision | None = None  # None: the spec has no `provision` section
    execution: Execution = Execution()

    @property
    def resolved_stack(self) -> Stack:
        return Stack(pins=self.stack, requirements=self.requirements, platform=self.platform)

    @property
    def stack_id(self) -> str:
        """Short hash of the resolved stack: names the runtime on a node and the stack an artifact is for."""
        return self.resolved_stack.id

    @property
    def fleet_dir(self) -> Path:
        return self.work_dir / "fleets" / self.name

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    @property
    def compute_capabilities(self) -> tuple[str, ...]:
        return tuple(sorted({n.gpu.cc for n in self.nodes if n.gpu and n.gpu.cc}, key=_cc_key))


def _cc_key(cc: str) -> tuple[int, int]:
    major, minor = cc.split(".")
    return int(major), int(minor)


def project_root() -> Path:
    """The checkout holding fleet/, playbooks/ and inventory/ (an editable install points here)."""
    return Path(__file__).resolve().parent.parent


def embedded_fleet() -> Path:
    return project_root() / "inventory" / "fleets" / "local.yml"


def resolve_work_dir(cli_value: str | None) -> Path:
    if cli_value:
        return Path(cli_value).expanduser().resolve()
    if os.environ.get("SOLFLEET_WORK"):
        return Path(os.environ["SOLFLEET_WORK"]).expanduser().resolve()
    return project_root() / ".work"


def check_version(version: str, *, field: str = "--version") -> str:
    import re

    if not re.fullmatch(VERSION_RE, version):
        raise SpecError(field, version, "expected a version like 1.4.0 or 1.4.0-rc.1", source="argument")
    return version


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML silently keeps the last of two equal keys; a spec with `port:` twice is a mistake to report."""


def _construct_mapping(
    loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise SpecError(
                f"line {key_node.start_mark.line + 1}", key, "each key may appear once in a mapping"
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_spec(path: str | Path, *, work_dir: Path) -> FleetSpec:
    """Read and validate a fleet spec file. Raises SpecError (exit 2) on the first problem found."""
    source = Path(path)
    label = str(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--fleet: cannot read {label}: {exc.strerror or exc}") from None
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except SpecError as exc:
        raise SpecError(exc.field, exc.value, exc.allowed, source=label) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"{label}: not valid YAML{where}: {problem}") from None
    return parse_spec(data, source=source, label=label, work_dir=work_dir)


def parse_spec(data: object, *, source: Path, label: str, work_dir: Path) -> FleetSpec:
    v.refuse_templates(label, "", data)
    top = v.Fields(data, "", label)
    variables = {**os.environ, "SOLFLEET_WORK": str(work_dir)}
    base = str(source.resolve().parent)

    name = v.string(label, "fleet", top.raw("fleet"), pattern=NAME_RE, what="a fleet name like lab-a")
    defaults = _defaults(top, variables, base)
    # the stack and provision come first: a provisioned node's `python` defaults to its runtime
    stack = _stack(top, label)
    provision = parse_provision(top, label, stack, variables, sys.executable)
    raw_nodes = top.raw("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        v.fail(label, "nodes", raw_nodes, "expected a non-empty list of nodes")
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for i, raw in enumerate(raw_nodes):
        node = _node(label, i, raw, defaults, variables, base, stack.id if provision else None)
        if node.name in seen:
            v.fail(label, f"nodes[{i}].name", node.name, f"duplicate of nodes[{seen[node.name]}].name")
        seen[node.name] = i
        nodes.append(node)
    _check_shared_roots(label, nodes)
    check_port_overlap(
        label,
        {
            i: ("local" if n.connection is Connection.LOCAL else n.host, n.service)
            for i, n in enumerate(nodes)
        },
    )
    rollout = parse_rollout(top, label, nodes)
    gates = parse_gates(top, label)
    timeouts = parse_timeouts(top, label)
    execution = _execution(top, label)
    top.done(
        ["fleet", "defaults", "stack", "provision", "nodes", "rollout", "gates", "timeouts", "execution"]
    )
    return FleetSpec(
        name=name,
        source=source.resolve(),
        work_dir=work_dir,
        nodes=tuple(nodes),
        stack=stack.pins,
        rollout=rollout,
        gates=gates,
        timeouts=timeouts,
        requirements=stack.requirements,
        platform=stack.platform,
        provision=provision,
        execution=execution,
    )


def _execution(top: v.Fields, label: str) -> Execution:
    raw = top.raw("execution", {})
    e = v.Fields({} if raw is None else raw, "execution", label)
    mode = v.choice(label, e.sub("mode"), e.raw("mode", "local"), [m.value for m in ExecutionMode])
    e.done(["mode"])
    return Execution(mode=ExecutionMode(mode))


def _defaults(top: v.Fields, variables: Mapping[str, str], base: str) -> dict[str, tuple[str, Any]]:
    """Raw default values with the field path they came from, so a bad default is reported as `defaults.x`."""
    raw = top.raw("defaults", {})
    if raw is None:
        raw = {}
    d = v.Fields(raw, "defaults", top.source)
    out = {key: (d.sub(key), d.raw(key)) for key in DEFAULT_KEYS if d.has(key)}
    d.done(DEFAULT_KEYS)
    return out


def _pick(n: v.Fields, key: str, defaults: Mapping[str, tuple[str, Any]], fallback: Any) -> tuple[str, Any]:
    if n.has(key):
        return n.sub(key), n.raw(key)
    if key in defaults:
        return defaults[key]
    return n.sub(key), fallback


def _node(
    label: str,
    i: int,
    raw: object,
    defaults: Mapping[str, tuple[str, Any]],
    variables: Mapping[str, str],
    base: str,
    runtime_stack_id: str | None,
) -> Node:
    n = v.Fields(raw, f"nodes[{i}]", label)
    name = v.string(
        label,
        n.sub("name"),
        n.raw("name"),
        pattern=NAME_RE,
        what="a node name: lowercase letters, digits, `_ . -`, at most 63",
    )
    f, val = _pick(n, "connection", defaults, "ssh")
    connection = Connection(v.choice(label, f, val, [c.value for c in Connection]))
    f, val = _pick(n, "host", defaults, "localhost" if connection is Connection.LOCAL else None)
    if val is None:
        v.fail(label, f, val, "required for connection ssh: a host name or IP address")
    host = v.string(label, f, val, pattern=HOST_RE, what="a host name or IP address")
    f, val = _pick(n, "port", defaults, 22)
    port = v.integer(label, f, val, lo=1, hi=65535)
    # an unprivileged deploy user who owns only <root> (docs/security.md); provisioning uses `become`
    f, val = _pick(n, "user", defaults, "solfleet")
    user = v.string(label, f, val, pattern=USER_RE, what="a POSIX user name")
    f, val = _pick(n, "root", defaults, "/opt/solfleet")
    root = v.node_path(label, f, val, variables)
    f, val = _pick(n, "simulated", defaults, False)
    simulated = v.boolean(label, f, val)
    f, val = _pick(n, "labels", defaults, [])
    labels = v.string_list(label, f, val, pattern=LABEL_RE, what="labels (lowercase letters, digits, _ -)")
    f, val = _pick(n, "gpu", defaults, None)
    gpu = None if val is None else _gpu(label, f, val)
    # provisioned (the spec has `provision`): the runtime solfleet provisions; else `auto` for local nodes
    fallback = (
        runtime_python(root, runtime_stack_id)
        if runtime_stack_id
        else ("auto" if connection is Connection.LOCAL else None)
    )
    f, val = _pick(n, "python", defaults, fallback)
    if val is None:
        v.fail(
            label, f, val, "required for connection ssh: the node's interpreter (absolute path, or `auto`)"
        )
    python = _python(label, f, val, variables)
    f, val = _pick(n, "ssh", defaults, None)
    ssh = _ssh(label, f, val, variables, base)
    service = parse_service(
        label,
        f"nodes[{i}]",
        n.raw("service"),
        defaults.get("service", ("", None))[1],
        gpu_count=None if gpu is None else gpu.count,
        simulated=simulated,
    )
    n.done(NODE_KEYS)
    return Node(
        name=name,
        host=host,
        port=port,
        user=user,
        connection=connection,
        root=root,
        simulated=simulated,
        labels=labels,
        gpu=gpu,
        python=python,
        ssh=ssh,
        service=service,
    )


def _gpu(label: str, path: str, raw: object) -> Gpu:
    g = v.Fields(raw, path, label)
    count = v.integer(label, g.sub("count"), g.raw("count", 1), lo=0, hi=64)
    model = v.string(
        label,
        g.sub("model"),
        g.raw("model", "unknown"),
        pattern=r"[A-Za-z0-9 ._-]{1,40}",
        what="a GPU model name",
    )
    cc_raw = g.raw("cc")
    cc = (
        None
        if cc_raw is None
        else v.string(
            label,
            g.sub("cc"),
            cc_raw,
            pattern=CC_RE,
            what='a compute capability like "9.0" (5.0-12.9), quoted',
        )
    )
    g.done(["count", "model", "cc"])
    return Gpu(count=count, model=model, cc=cc)


def _python(label: str, path: str, raw: object, variables: Mapping[str, str]) -> str:
    """`auto` = the interpreter running solfleet: right for local nodes and loopback test nodes, which
    share the controller's filesystem; a remote node needs an explicit absolute path."""
    if raw == "auto":
        return sys.executable
    return str(v.node_path(label, path, raw, variables))


def _ssh(label: str, path: str, raw: object, variables: Mapping[str, str], base: str) -> SshOptions:
    if raw is None:
        return SshOptions(private_key_file=None, known_hosts_file=None)
    s = v.Fields(raw, path, label)
    key = s.raw("private_key_file")
    known = s.raw("known_hosts_file")
    s.done(["private_key_file", "known_hosts_file"])
    return SshOptions(
        private_key_file=None
        if key is None
        else v.controller_path(label, s.sub("private_key_file"), key, variables, base=base),
        known_hosts_file=None
        if known is None
        else v.controller_path(label, s.sub("known_hosts_file"), known, variables, base=base),
    )


def _check_shared_roots(label: str, nodes: list[Node]) -> None:
    """Two nodes on one machine with one root would share a lock and a `current`: refuse it."""
    seen: dict[tuple[str, int, str], int] = {}
    for i, node in enumerate(nodes):
        where = "local" if node.connection is Connection.LOCAL else f"{node.host}:{node.port}"
        key = (where, 0, str(node.root))
        if key in seen:
            v.fail(
                label,
                f"nodes[{i}].root",
                str(node.root),
                f"nodes[{seen[key]}] on the same machine already uses this root; give each node its own",
            )
        seen[key] = i


def _stack(top: v.Fields, label: str) -> Stack:
    raw = top.raw("stack", {})
    s = v.Fields({} if raw is None else raw, "stack", label)
    pins: dict[str, str] = {}
    for key in PIN_KEYS:
        if s.has(key) or key in REQUIRED_PINS:
            value = v.string(
                label,
                s.sub(key),
                s.raw(key, "auto"),
                pattern=PIN_RE,
                what='a quoted version pin like "0.68.*" or "auto"',
            )
            pins[key] = resolve_pin(key, value)
    reqs_raw = s.raw("requirements", [])
    if not isinstance(reqs_raw, list):
        v.fail(label, s.sub("requirements"), reqs_raw, 'expected a list of exact pins like "pyyaml==6.0.2"')
    requirements: list[Requirement] = []
    for i, text in enumerate(reqs_raw):
        if not isinstance(text, str):
            v.fail(label, f"stack.requirements[{i}]", text, 'expected a quoted pin like "pyyaml==6.0.2"')
        req = parse_requirement(text, field_path=f"stack.requirements[{i}]")
        if req.name in ("numba", "numba-cuda", "numpy", "llvmlite", "python"):
            v.fail(label, f"stack.requirements[{i}]", text, f"pin {req.name} with its own stack field")
        if req.name in {r.name for r in requirements}:
            v.fail(label, f"stack.requirements[{i}]", text, "each requirement may appear once")
        requirements.append(req)
    platform = v.string(
        label,
        s.sub("platform"),
        s.raw("platform", DEFAULT_PLATFORM),
        pattern=r"(manylinux|musllinux)_[0-9]+_[0-9]+_(x86_64|aarch64)|manylinux2014_(x86_64|aarch64)",
        what="a pip platform tag like manylinux_2_28_x86_64",
    )
    s.done(STACK_KEYS)
    return Stack(pins=pins, requirements=tuple(sorted(requirements, key=lambda r: r.name)), platform=platform)


def check_controller_files(spec: FleetSpec, nodes: Sequence[Node]) -> None:
    """Before anything runs against `nodes`: the files the controller itself must read exist (SSH key,
    known_hosts), and a local node's interpreter exists here. Otherwise SSH would report each node as
    merely unreachable, halfway through a rollout; this names the field instead and exits 2."""
    index = {n.name: i for i, n in enumerate(spec.nodes)}
    for node in nodes:
        where = f"nodes[{index[node.name]}]"
        for key in ("private_key_file", "known_hosts_file"):
            path = getattr(node.ssh, key)
            if node.connection is Connection.SSH and path is not None and not os.access(path, os.R_OK):
                raise SpecError(
                    f"{where}.ssh.{key} (or defaults.ssh.{key})",
                    path,
                    "expected a readable file on this controller",
                    source=str(spec.source),
                )
        if node.connection is Connection.LOCAL and not os.access(node.python, os.X_OK):
            provisioned = spec.provision is not None and node.python == runtime_python(
                node.root, spec.stack_id
            )
            raise SpecError(
                f"{where}.python (or defaults.python)",
                node.python,
                "this is the node's provisioned runtime: run `solfleet provision` first"
                if provisioned
                else "a local node's interpreter must exist and be executable here",
                source=str(spec.source),
            )
