"""deploy/: every Kubernetes object loads into the official Kubernetes Python models, losslessly,
and its security-relevant fields are what docs/deploy.md says; the arguments in the manifests and
systemd units parse with the real CLI; the units pass ``systemd-analyze verify``; every series the
Grafana dashboard queries is one the daemon or the autopilot exports.

Not run here: a live cluster (no API server, no kubelet). See docs/deploy.md §7.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import REPO_ROOT

kubernetes = pytest.importorskip("kubernetes")
from kubernetes.client import ApiClient  # noqa: E402

DEPLOY = REPO_ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
SOCKET_DIR = "/run/kinetoscope"
TRACE_ROOT = "/var/lib/kinetoscope/traces"


def _objects() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append((path.name, doc))
    return out


OBJECTS = _objects()


def _model(doc: dict[str, Any]) -> Any:
    group_version = doc["apiVersion"].split("/")[-1].capitalize()  # "apps/v1" -> "V1"
    return ApiClient()._ApiClient__deserialize(doc, f"{group_version}{doc['kind']}")  # type: ignore[attr-defined]


def _normalise(value: Any) -> Any:
    """YAML ints for quantities/ports and JSON ints compare equal; drop empty containers."""
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    return value


def by_kind(kind: str, name: str | None = None) -> Any:
    for _file, doc in OBJECTS:
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name):
            return _model(doc)
    raise AssertionError(f"no {kind} {name or ''} in deploy/kubernetes")


@pytest.mark.parametrize(
    ("file", "doc"), OBJECTS, ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in OBJECTS]
)
def test_every_object_loads_into_the_kubernetes_models_losslessly(file: str, doc: dict[str, Any]) -> None:
    model = _model(doc)
    assert type(model).__name__.endswith(doc["kind"])
    # the models drop unknown fields silently: a misspelt or misplaced field shows up as a
    # difference between the document and its model serialised back
    back = ApiClient().sanitize_for_serialization(model)
    assert _normalise(back) == _normalise(doc), f"{file}: fields the Kubernetes models do not know"


def test_all_expected_objects_are_shipped() -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for _f, d in OBJECTS}
    assert {
        ("DaemonSet", "kscope-daemon"),
        ("Service", "kscope-daemon"),
        ("Deployment", "kscope-autopilot"),
        ("NetworkPolicy", "kscope-daemon"),
        ("NetworkPolicy", "kscope-autopilot"),
    } <= kinds


def _args(container: Any) -> dict[str, str]:
    return dict(a.lstrip("-").split("=", 1) for a in container.args if a.startswith("--") and "=" in a)


def test_daemonset_security_fields() -> None:
    ds = by_kind("DaemonSet", "kscope-daemon")
    spec = ds.spec.template.spec
    assert spec.host_pid is True  # container pids -> host pids, /proc/<pid>/environ of ranks
    assert not spec.host_network and spec.automount_service_account_token is False
    (c,) = spec.containers
    sc = c.security_context
    assert sc.privileged is False and sc.allow_privilege_escalation is False
    assert sc.read_only_root_filesystem is True
    assert sc.capabilities.drop == ["ALL"]
    assert set(sc.capabilities.add) <= {"SYS_PTRACE", "CHOWN", "FOWNER", "DAC_OVERRIDE", "DAC_READ_SEARCH"}
    assert sc.seccomp_profile.type == "RuntimeDefault"
    assert c.resources.limits["cpu"] and c.resources.limits["memory"]
    args = _args(c)
    assert {"tls-cert", "tls-key", "tls-client-ca"} <= set(args)  # mutual TLS on the RPC port
    assert args["ipc-socket-dir"] == SOCKET_DIR and args["trace-root"] == TRACE_ROOT
    token = next(e for e in c.env if e.name == "KSCOPE_TOKEN")
    assert token.value is None and token.value_from.secret_key_ref.name  # from a Secret, not inline
    mounts = {m.name: m.mount_path for m in c.volume_mounts}
    volumes = {v.name: v for v in spec.volumes}
    # the socket directory and the trace root are hostPaths at the same paths as in the pod,
    # so training pods that mount the same hostPaths meet the daemon there
    assert volumes["ipc"].host_path.path == mounts["ipc"] == SOCKET_DIR
    assert volumes["traces"].host_path.path == mounts["traces"] == TRACE_ROOT
    assert volumes["tls"].secret.default_mode == 0o400
    ports = {p.name: p.container_port for p in c.ports}
    svc = by_kind("Service", "kscope-daemon")
    assert {p.name: p.port for p in svc.spec.ports} == ports == {"rpc": 1778, "metrics": 9778}
    assert svc.spec.selector == ds.spec.selector.match_labels


def test_autopilot_security_fields() -> None:
    dep = by_kind("Deployment", "kscope-autopilot")
    spec = dep.spec.template.spec
    assert spec.security_context.run_as_non_root is True and spec.security_context.run_as_user != 0
    (c,) = spec.containers
    assert c.security_context.capabilities.drop == ["ALL"]
    assert c.security_context.allow_privilege_escalation is False
    assert c.security_context.read_only_root_filesystem is True
    assert c.resources.limits["memory"]
    args = _args(c)
    assert {"tls-ca", "tls-cert", "tls-key", "catalog"} <= set(args)
    catalog = next(e for e in c.env if e.name == "KSCOPE_CATALOG")
    assert catalog.value_from.secret_key_ref.name  # the PostgreSQL URL (with its password) from a Secret


def test_network_policies_limit_who_reaches_the_daemon() -> None:
    pol = by_kind("NetworkPolicy", "kscope-daemon")
    assert pol.spec.pod_selector.match_labels == {"app.kubernetes.io/name": "kscope-daemon"}
    assert set(pol.spec.policy_types) == {"Ingress", "Egress"}
    rules = {tuple(p.port for p in r.ports): r for r in pol.spec.ingress}
    assert set(rules) == {(1778,), (9778,)}
    rpc_from = [f.pod_selector.match_labels["app.kubernetes.io/name"] for f in rules[(1778,)]._from]
    assert set(rpc_from) == {"kscope-autopilot", "kscope-serve"}
    assert all(f.namespace_selector is not None for f in rules[(9778,)]._from)


def test_example_training_pod_meets_the_daemon() -> None:
    job = by_kind("Job")
    (c,) = job.spec.template.spec.containers
    env = {e.name: e for e in c.env}
    assert env["KINETO_USE_DAEMON"].value == "1" and env["KINETO_IPC_SOCKET_DIR"].value == SOCKET_DIR
    assert env["POD_NAMESPACE"].value_from.field_ref.field_path == "metadata.namespace"
    mounts = {m.mount_path for m in c.volume_mounts}
    assert {SOCKET_DIR, TRACE_ROOT} <= mounts
    assert job.spec.template.spec.host_pid is None  # the job needs no host privileges


def _parse_cli(argv: list[str]) -> None:
    """Parse ``kscope ARGV`` with the real CLI's option definitions (nothing runs)."""
    import typer.main

    from kinetoscope.cli.main import app

    group = typer.main.get_command(app)
    ctx = group.make_context("kscope", list(argv))
    name, cmd, rest = group.resolve_command(ctx, list(argv))
    assert cmd is not None and name == argv[0], argv
    cmd.make_context(name, rest, parent=ctx)  # raises click.UsageError for an unknown flag


def _substitute(args: list[str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)|\$\{(\w+)\}", "x", a) for a in args]


def test_manifest_arguments_parse_with_the_real_cli() -> None:
    for kind, name in (("DaemonSet", "kscope-daemon"), ("Deployment", "kscope-autopilot")):
        (c,) = by_kind(kind, name).spec.template.spec.containers
        _parse_cli(_substitute(c.args))


def _unit(path: Path) -> dict[str, list[str]]:
    """key -> values of a systemd unit (continuation lines joined; repeated keys kept)."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "[")) and "=" in line:
            k, v = line.split("=", 1)
            out.setdefault(k, []).append(v)
    return out


@pytest.mark.parametrize("unit", ["kscope-daemon.service", "kscope-autopilot.service"])
def test_systemd_units_hardening_and_arguments(unit: str, tmp_path: Path) -> None:
    path = DEPLOY / "systemd" / unit
    u = _unit(path)
    for key, value in (
        ("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
        ("ProtectKernelModules", "yes"), ("RestrictNamespaces", "yes"), ("RestrictSUIDSGID", "yes"),
    ):  # fmt: skip
        assert u[key] == [value], (unit, key)
    assert u["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
    assert "MemoryMax" in u and "SystemCallFilter" in u
    if unit == "kscope-daemon.service":
        assert set(u["CapabilityBoundingSet"][0].split()) <= {
            "CAP_SYS_PTRACE", "CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH",
        }  # fmt: skip
    else:
        assert u["DynamicUser"] == ["yes"] and u["CapabilityBoundingSet"] == [""]
    argv = shlex.split(u["ExecStart"][0])
    assert argv[0] == "/usr/local/bin/kscope"
    _parse_cli(_substitute(argv[1:]))
    if shutil.which("systemd-analyze"):
        copy = tmp_path / unit
        copy.write_text(path.read_text().replace("/usr/local/bin/kscope", "/bin/true"))
        res = subprocess.run(
            ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, check=False,
            env={**os.environ, "SYSTEMD_LOG_LEVEL": "warning"},
        )  # fmt: skip
        complaints = [
            line for line in (res.stdout + res.stderr).splitlines()
            if "Unknown key" in line or "Invalid" in line or "Failed to parse" in line
        ]  # fmt: skip
        assert not complaints, complaints


def test_containerfile_builds_the_cli_image() -> None:
    text = (DEPLOY / "Containerfile").read_text()
    assert text.count("FROM ") == 2 and 'ENTRYPOINT ["kscope"]' in text
    assert "useradd --system --uid 10001" in text  # the autopilot's runAsUser exists in the image
    assert "10001" in (K8S / "autopilot.yaml").read_text()


def _exported_names() -> set[str]:
    """Every series name the daemon and the autopilot export (scraped from real registries)."""
    from prometheus_client import generate_latest

    from kinetoscope.autopilot.metrics import AutopilotMetrics
    from kinetoscope.daemon.metrics import DaemonMetrics, ProcessMetrics, ProcessRow

    daemon = DaemonMetrics()
    daemon.registry.register(
        ProcessMetrics(lambda: [ProcessRow(("1", "2", "0", "j", "launcher", "", ""), 3, 0.5, False)])
    )
    names: set[str] = set()
    for registry in (daemon.registry, AutopilotMetrics().registry):
        for line in generate_latest(registry).decode().splitlines():
            if line.startswith("# TYPE "):
                name, kind = line.split()[2:4]
                names.add(name)
                if kind == "counter":
                    names.add(name + "_total")
                if kind == "histogram":
                    names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


def test_grafana_dashboard_queries_exported_series() -> None:
    doc = json.loads((DEPLOY / "grafana" / "kinetoscope-fleet.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\b(kscope_[a-z_]+)", e)}
    missing = used - _exported_names()
    assert not missing, f"the dashboard queries series nobody exports: {sorted(missing)}"
    autopilot = {n for n in used if n.startswith("kscope_autopilot_")}
    assert len(autopilot) >= 8  # the fleet figures of kinetoscope/autopilot/metrics.py
