"""Deployment artifacts under ``deploy/``: checked by reading, by their own tools, and live.

- The Dockerfile and the compose, Kubernetes, Prometheus and Grafana files are parsed and
  their essentials checked (there is no container engine or cluster to run them on).
- ``promtool`` checks the Prometheus config and rules, and runs unit tests of the alert
  expressions (generated here, against a copy of the rules without annotations).
- Every metric name and label the alert rules and the dashboard use is looked up in a
  live ``/metrics`` scrape of ``herald run`` after a success, a failure that ran out of
  retries and a rejected outbox row; the image's HEALTHCHECK command runs against it.
- ``systemd-analyze verify`` checks the unit file.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from herald.config import DeliverySettings, Settings
from herald.sourcedb.schema import outbox_ddl
from tests.e2e.conftest import SECRET, HeraldFactory
from tests.e2e.test_delivery import rows, wait_active, wait_deliveries
from tests.support.receiver import Receiver, verification_ok_then
from tests.support.required import unavailable

pytestmark = [pytest.mark.e2e, pytest.mark.backend_neutral]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
ALERT_TESTS = DEPLOY / "prometheus" / "tests"
DASHBOARD = DEPLOY / "grafana" / "herald.json"
KUBERNETES = DEPLOY / "kubernetes"
SERVICES_SCRIPT = ROOT / "scripts" / "test-services.sh"

# Series that Prometheus itself makes, not Herald's /metrics.
PROMETHEUS_SERIES = {"up", "ALERTS", "ALERTS_FOR_STATE"}
# Labels the scrape adds (target labels), absent from the exposition.
TARGET_LABELS = {"job", "instance"}


@pytest.fixture(scope="module")
def yaml() -> Any:
    return pytest.importorskip(
        "yaml", reason="PyYAML is not installed: add pyyaml to the dev extras in pyproject.toml"
    )


# --- PromQL: which series an expression selects ------------------------------------------


@dataclass
class Selector:
    name: str
    matchers: list[tuple[str, str, str]] = field(default_factory=list)  # (label, op, value)


_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*")
      | (?P<number>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[A-Za-z]*)  # also durations: offset 5m
      | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)(?P<labels>\s*\{[^}]*\})?(?P<call>\s*\()?
      | (?P<bare>\{[^}]*\})
    """,
    re.X,
)
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')
_OPERATORS = {"and", "or", "unless", "bool", "offset", "inf", "nan"}


def selectors(expr: str) -> list[Selector]:
    """The vector selectors of a PromQL expression (Grafana variables allowed)."""
    text = re.sub(r"\$\{?\w+\}?", "", expr)  # $__rate_interval, ${datasource}
    text = re.sub(r"\[[^\]]*\]", "", text)  # range and subquery windows
    text = _GROUPING.sub(" ", text)
    found = []
    for m in _TOKEN.finditer(text):
        if m["bare"]:
            raise AssertionError(f"selector without a metric name in {expr!r}")
        ident = m["ident"]
        if ident is None or m["call"] or ident in _OPERATORS:
            continue  # strings, numbers, functions and aggregations, binary operators
        found.append(Selector(ident, _MATCHER.findall(m["labels"] or "")))
    return found


def test_selector_extraction() -> None:
    expr = (
        'histogram_quantile(0.99, sum by (le, destination_type) (rate(x_bucket{a="1", b!~"2"}'
        '[$__rate_interval]))) / ignoring(c) y > 1e3 and on() absent(z{job="herald"}) or vector(0)'
    )
    got = [(s.name, s.matchers) for s in selectors(expr)]
    assert got == [
        ("x_bucket", [("a", "=", "1"), ("b", "!~", "2")]),
        ("y", []),
        ("z", [("job", "=", "herald")]),
    ]


def alert_rules(yaml: Any) -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def dashboard_panels() -> Iterator[dict[str, Any]]:
    def walk(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for panel in panels:
            yield panel
            yield from walk(panel.get("panels", []))

    yield from walk(json.loads(DASHBOARD.read_text())["panels"])


def dashboard_exprs() -> list[str]:
    return [t["expr"] for p in dashboard_panels() for t in p.get("targets", []) if "expr" in t]


# --- the container image -------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # also comment lines inside a continuation, as Docker does
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        keyword, _, args = (buf + line).partition(" ")
        out.append((keyword.upper(), args.strip()))
        buf = ""
    assert not buf, "the Dockerfile ends inside a continuation line"
    return out


def healthcheck_command() -> list[str]:
    args = dict(dockerfile_instructions(DOCKERFILE.read_text()))["HEALTHCHECK"]
    command: list[str] = json.loads(args[args.index("CMD") + len("CMD") :])
    return command


def test_dockerfile_is_multi_stage_non_root_and_healthchecked() -> None:
    ins = dockerfile_instructions(DOCKERFILE.read_text())
    global_args: dict[str, str] = {}
    for keyword, args in ins:
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in args:
            key, _, value = args.partition("=")
            global_args[key] = value
    stages = [args.split() for keyword, args in ins if keyword == "FROM"]
    assert len(stages) >= 2, "multi-stage: a builder and a runtime stage"
    images = {re.sub(r"\$\{(\w+)\}", lambda m: global_args[m[1]], s[0]) for s in stages}
    assert len(images) == 1, f"builder and runtime must share one base (the venv moves): {images}"
    base = images.pop()
    m = re.fullmatch(r"python:3\.(\d+)-slim(?:-\w+)?", base)
    assert m, base
    assert int(m[1]) >= 11, base
    names = [s[2] for s in stages if len(s) == 3 and s[1].upper() == "AS"]
    assert "builder" in names
    runtime = max(i for i, (k, _) in enumerate(ins) if k == "FROM")
    final = ins[runtime:]
    builder = ins[:runtime]
    assert any(k == "RUN" and "pip wheel" in a for k, a in builder), "builds a wheel"
    assert any(k == "RUN" and "venv" in a for k, a in builder)
    assert any(k == "COPY" and a.startswith("--from=builder") for k, a in final)
    for k, a in builder:
        if k == "COPY":
            for source in shlex.split(a)[:-1]:
                if not source.startswith("--"):
                    assert (ROOT / source).exists(), f"COPY {source}: not in the build context"

    def last(keyword: str) -> str:
        values = [a for k, a in final if k == keyword]
        assert values, f"no {keyword} in the runtime stage"
        return values[-1]

    user = last("USER").split(":")[0]
    assert user not in ("root", "0"), "runs as a non-root user"
    assert user == "herald" or int(user) >= 1000
    run_steps = " ".join(a for k, a in final if k == "RUN")
    assert "useradd" in run_steps
    assert " herald" in run_steps
    env: dict[str, str] = {}
    for k, a in final:
        if k == "ENV":
            for item in shlex.split(a):
                key, _, value = item.partition("=")
                env[key] = value
    assert env["HERALD_API__LISTEN"] == "0.0.0.0:8080"
    assert env["HERALD_METRICS__LISTEN"] == "0.0.0.0:9464", "the probes' own listener"
    assert env["HERALD_DATABASE__URL"] == "sqlite:////var/lib/herald/herald.db"
    assert env["HERALD_LOG__FORMAT"] == "json"
    assert last("EXPOSE").split() == ["8080", "9464"]
    assert last("WORKDIR") == "/var/lib/herald"
    assert "/var/lib/herald" in last("VOLUME")
    assert last("STOPSIGNAL") == "SIGTERM"
    assert json.loads(last("ENTRYPOINT")) == ["herald"]
    assert json.loads(last("CMD")) == ["run"]
    health = last("HEALTHCHECK")
    assert "/healthz" in health
    assert "urllib.request" in health, "slim images have no curl or wget"
    assert healthcheck_command()[0] == "/opt/herald/bin/python"


def test_the_image_installs_pinned_dependencies() -> None:
    """Every package the wheel needs is pinned in constraints.txt, which the build uses,
    and each pin meets pyproject.toml's lower bound (``make constraints`` rewrites it)."""
    from packaging.markers import default_environment
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    constraints = DOCKERFILE.parent / "constraints.txt"
    pins: dict[str, Version] = {}
    for line in constraints.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = Version(version)
    builder = [a for k, a in dockerfile_instructions(DOCKERFILE.read_text()) if k == "RUN"]
    assert any("--constraint constraints.txt" in a for a in builder)
    env: dict[str, str] = {**cast("dict[str, str]", default_environment()), "extra": ""}
    missing: list[str] = []
    todo, seen = ["herald"], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(env):
                continue  # an extra (dev) or another platform's
            dep = canonicalize_name(req.name)
            if dep not in pins:
                missing.append(f"{dep} (for {name})")
                continue
            if name == "herald":
                assert req.specifier.contains(pins[dep], prereleases=True), (req, pins[dep])
            todo.append(dep)
    assert not missing, f"not pinned in constraints.txt (run make constraints): {missing}"


def test_the_image_env_is_a_valid_herald_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, a in dockerfile_instructions(DOCKERFILE.read_text()):
        if k == "ENV":
            for item in shlex.split(a):
                key, _, value = item.partition("=")
                if key.startswith("HERALD_"):
                    monkeypatch.setenv(key, value)
    settings = Settings()
    assert (settings.api.host, settings.api.port) == ("0.0.0.0", 8080)
    assert (settings.metrics.host, settings.metrics.port) == ("0.0.0.0", 9464)
    assert settings.database.sqlite_path == Path("/var/lib/herald/herald.db")
    assert settings.key_file() == Path("/var/lib/herald/herald.db.key")  # inside the volume


def test_dockerignore_keeps_local_state_out_and_the_sources_in() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def ignored(path: str) -> bool:
        return any(fnmatch(path, p) or fnmatch(path, p.removeprefix("**/")) for p in patterns)

    for path in (".venv", ".git", "herald.db", "herald.db-wal", "herald.db.key", "x/a.db"):
        assert ignored(path), path
    assert ignored("bench/results")
    for path in ("pyproject.toml", "README.md", "src", "src/herald/store/sql/sqlite/0001.sql"):
        assert not ignored(path), path


# --- YAML: compose, Kubernetes, Grafana provisioning ------------------------------------


def test_every_yaml_file_in_deploy_loads(yaml: Any) -> None:
    files = sorted([*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")])
    assert len(files) >= 10
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, f"{path} is empty"
        assert all(isinstance(d, dict) for d in docs), path
    json.loads(DASHBOARD.read_text())


def k8s_objects(yaml: Any) -> dict[str, dict[str, Any]]:
    """The base's objects by kind (the SQLite variant applies the base as it is)."""
    base = KUBERNETES / "base"
    kustomization = yaml.safe_load((base / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    present = sorted(p.name for p in base.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == present, "kustomization.yaml lists every manifest"
    assert yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())["resources"] == ["base"]
    objects: dict[str, dict[str, Any]] = {}
    for name in listed:
        for doc in yaml.safe_load_all((base / name).read_text()):
            assert doc["kind"] not in objects, f"two {doc['kind']} objects"
            objects[doc["kind"]] = doc
    return objects


def test_kubernetes_manifests(yaml: Any) -> None:
    objs = k8s_objects(yaml)
    # No Secret: `kubectl apply -k` must never replace the operator's real key.
    assert set(objs) == {"Deployment", "Service", "ServiceMonitor", "PersistentVolumeClaim"}
    deployment, service, monitor = objs["Deployment"], objs["Service"], objs["ServiceMonitor"]
    pvc = objs["PersistentVolumeClaim"]
    assert deployment["apiVersion"] == "apps/v1"
    spec = deployment["spec"]
    assert spec["replicas"] == 1, "one replica while the database is SQLite"
    assert spec["strategy"]["type"] == "Recreate", "a rolling update would start a second one"
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "metrics": 9464}
    # The probes ask metrics.listen, a listener of its own: a flood of the API's port
    # cannot get the pod restarted.
    for probe, path in (
        ("startup", "/healthz"),
        ("liveness", "/healthz"),
        ("readiness", "/readyz"),
    ):
        assert container[f"{probe}Probe"]["httpGet"] == {"path": path, "port": "metrics"}
    assert {"requests", "limits"} <= container["resources"].keys()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 10001
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    env = {e["name"]: e for e in container["env"]}
    settings_env = {
        f"HERALD_{section.upper()}__{key.upper()}"
        for section, values in Settings().model_dump().items()
        for key in values
    }
    assert set(env) <= settings_env, f"unknown settings: {set(env) - settings_env}"
    assert env["HERALD_API__LISTEN"]["value"] == "0.0.0.0:8080"
    listen = env["HERALD_METRICS__LISTEN"]["value"]
    assert Settings.model_validate({"metrics": {"listen": listen}}).metrics.port == 9464
    db_url = env["HERALD_DATABASE__URL"]["value"]
    assert db_url.startswith("sqlite:////var/lib/herald/")
    grace = float(
        env.get("HERALD_DELIVERY__SHUTDOWN_GRACE_SECONDS", {}).get("value")
        or DeliverySettings().shutdown_grace_seconds
    )
    assert pod["terminationGracePeriodSeconds"] > grace
    key_ref = env["HERALD_SECURITY__ENCRYPTION_KEY"]["valueFrom"]["secretKeyRef"]
    # The documented command makes exactly the Secret and key the pod reads.
    create = f"kubectl create secret generic {key_ref['name']} --from-literal={key_ref['key']}="
    assert create in (KUBERNETES / "kustomization.yaml").read_text()
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    data = next(n for n, path in mounts.items() if path == "/var/lib/herald")
    assert volumes[data]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    # The Service and the ServiceMonitor reach the pod's named port.
    assert service["metadata"]["name"] == "herald", "the Prometheus job label alerts.yml expects"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    service_ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert service_ports == {"http": (8080, "http"), "metrics": (9464, "metrics")}
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")


def kustomize(path: Path, yaml: Any) -> dict[str, dict[str, Any]]:
    """``kubectl kustomize path``: the objects it builds, by kind."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        unavailable("kubectl is not installed")
    proc = subprocess.run(
        [kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "$patch" not in proc.stdout, "a patch directive left in the output"
    objects: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all(proc.stdout):
        assert doc["kind"] not in objects, f"two {doc['kind']} objects"
        objects[doc["kind"]] = doc
    return objects


def test_kustomize_builds_the_sqlite_variant(yaml: Any) -> None:
    objs = kustomize(KUBERNETES, yaml)
    assert sorted(objs) == ["Deployment", "PersistentVolumeClaim", "Service", "ServiceMonitor"]
    [container] = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "herald:0.1.0"
    assert objs["Deployment"]["metadata"]["labels"]["app.kubernetes.io/part-of"] == "herald"


def test_kustomize_builds_the_postgres_variant(yaml: Any) -> None:
    objs = kustomize(KUBERNETES / "postgres", yaml)
    # No volume and no Secret: replicas keep nothing on disk, keys stay the operator's.
    assert sorted(objs) == ["Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor"]
    spec = objs["Deployment"]["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 1
    pod = spec["template"]["spec"]
    [container] = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    db = env["HERALD_DATABASE__URL"]
    assert "value" not in db, "the URL, with its password, comes from a Secret"
    ref = db["valueFrom"]["secretKeyRef"]
    create = f"kubectl create secret generic {ref['name']} --from-literal={ref['key']}="
    assert create in (KUBERNETES / "postgres" / "kustomization.yaml").read_text()
    assert "HERALD_SECURITY__ENCRYPTION_KEY" in env, "every replica reads the same key"
    assert env["HERALD_METRICS__LISTEN"]["value"] == "0.0.0.0:9464"
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert "/var/lib/herald" not in {m["mountPath"] for m in container["volumeMounts"]}
    assert not any("persistentVolumeClaim" in v for v in pod["volumes"])
    pdb = objs["PodDisruptionBudget"]
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    pod_labels = spec["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_compose_stack(yaml: Any) -> None:
    path = DEPLOY / "compose.yaml"
    text = path.read_text()
    compose = yaml.safe_load(text)
    services = compose["services"]
    assert {"herald", "postgres", "prometheus", "grafana"} <= services.keys()
    herald = services["herald"]
    build = herald["build"]
    assert (path.parent / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    env = herald["environment"]
    assert env["HERALD_API__LISTEN"] == "0.0.0.0:8080"
    assert env["HERALD_METRICS__LISTEN"] == "0.0.0.0:9464"
    assert env["HERALD_DATABASE__URL"].startswith("sqlite:////var/lib/herald/")
    assert "HERALD_ENCRYPTION_KEY" in env["HERALD_SECURITY__ENCRYPTION_KEY"]
    assert re.search(
        r"^\s*# HERALD_DATABASE__URL: postgresql://herald:herald@postgres/herald$", text, re.M
    )
    assert "base64.urlsafe_b64encode(os.urandom(32))" in text, "how to generate a key"
    assert "herald-data:/var/lib/herald" in herald["volumes"]
    assert "herald-data" in compose["volumes"]
    assert any(p.endswith(":8080") for p in herald["ports"])
    pg = services["postgres"]["environment"]
    assert (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"]) == ("herald",) * 3

    def bind_mounts(service: dict[str, Any]) -> dict[str, Path]:
        out = {}
        for volume in service["volumes"]:
            source, target = volume.split(":")[:2]
            if source.startswith("."):
                out[target] = (path.parent / source).resolve()
        return out

    prom = bind_mounts(services["prometheus"])
    assert prom["/etc/prometheus"] == PROMETHEUS_CONFIG.parent
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    graf = bind_mounts(services["grafana"])
    assert graf["/etc/grafana/provisioning"] == DEPLOY / "grafana" / "provisioning"
    [dashboard_target] = [t for t, s in graf.items() if s == DASHBOARD]
    # Grafana's provisioning finds the dashboard and the Prometheus service.
    prov = DEPLOY / "grafana" / "provisioning"
    [provider] = yaml.safe_load((prov / "dashboards" / "herald.yaml").read_text())["providers"]
    assert Path(dashboard_target).parent == Path(provider["options"]["path"])
    [ds] = yaml.safe_load((prov / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert ds["type"] == "prometheus"
    assert ds["isDefault"] is True
    assert ds["url"] == "http://prometheus:9090"


def test_prometheus_scrapes_herald(yaml: Any) -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "herald"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert job["static_configs"][0]["targets"] == ["herald:9464"]  # metrics.listen
    assert config["rule_files"] == ["alerts.yml"]


def test_alert_rules_have_severity_and_a_runbook(yaml: Any) -> None:
    rules = alert_rules(yaml)
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^### Prometheus alerts$", readme, re.M), "the runbook section"
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"], rule["alert"]
        assert annotations["description"], rule["alert"]
        assert annotations["runbook_url"].endswith("#prometheus-alerts"), rule["alert"]
        assert f"`{rule['alert']}`" in readme, f"{rule['alert']} is not in the README runbook"
    exprs = " ".join(r["expr"] for r in rules)
    for needle in (
        "herald_outbox_lag_seconds",
        'herald_delivery_attempts_total{outcome!="success"}',
        "herald_deliveries_exhausted_total",
        "herald_destinations_failing",
        "herald_database_up == 0",
        "herald_storage_errors_total",
        "herald_oldest_due_delivery_age_seconds",
        'up{job="herald"} == 0',
        'absent(up{job="herald"})',
        "absent(herald_build_info",
        'herald_component_up{component!="workers"} == 0',
        "herald_source_up == 0",
    ):
        assert needle in exprs, needle


def test_dashboard_structure() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "herald"
    assert dash["schemaVersion"] >= 36
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for p in panels:
        pos = p["gridPos"]
        assert pos["x"] >= 0, p["title"]
        assert pos["x"] + pos["w"] <= 24, p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
    exprs = "\n".join(dashboard_exprs())
    for needle in (
        "herald_deliveries_completed_total",
        "sum by (outcome) (rate(herald_delivery_attempts_total",
        "histogram_quantile(0.5, sum by (le) (rate(herald_delivery_attempt_duration_seconds_bucket",
        "histogram_quantile(0.95,",
        "histogram_quantile(0.99, sum by (le) (rate(herald_delivery_attempt_duration",
        "histogram_quantile(0.99, sum by (le, destination_type) (rate(herald_event_delivery_lat",
        "herald_outbox_pending",
        "herald_outbox_lag_seconds",
        "sum by (state) (herald_deliveries_pending)",
        "sum by (type, status) (herald_destinations)",
        "herald_inflight_attempts",
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "min(herald_database_up)",
        "herald_storage_errors_total",
        "herald_oldest_due_delivery_age_seconds",
        "herald_deliveries_exhausted_total",
        "herald_destinations_failing",
        "herald_api_requests_total",
        "herald_replays_total",
    ):
        assert needle in exprs, needle
    [var] = [v for v in dash["templating"]["list"] if v["name"] == "datasource"]
    assert (var["type"], var["query"]) == ("datasource", "prometheus")


# --- promtool --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    """promtool, installed the way ``make test`` does (scripts/test-services.sh) if missing."""
    found = shutil.which("promtool")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        unavailable(
            "promtool is not installed and cannot be installed here (needs root and apt-get);"
            " install Debian's prometheus package or put promtool on PATH"
        )
    script = SERVICES_SCRIPT.read_text()
    block = re.search(r"^# >>> promtool.*?^# <<< promtool$", script, re.M | re.S)
    assert block, "scripts/test-services.sh has no promtool block"
    subprocess.run(
        ["bash", "-c", f"set -uo pipefail\n{block[0]}\nensure_promtool"],
        timeout=900,
        check=False,
    )
    found = shutil.which("promtool")
    if not found:
        unavailable("promtool is not installed and installing Debian's prometheus package failed")
    return found


def run_promtool(promtool: str, *args: str, cwd: Path = ROOT) -> str:
    proc = subprocess.run(
        [promtool, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    return out


def test_promtool_check_rules(promtool: str) -> None:
    out = run_promtool(promtool, "check", "rules", str(ALERTS))
    assert "SUCCESS" in out


def test_promtool_check_config(promtool: str, yaml: Any) -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    referenced = [*config.get("rule_files", []), *config.get("scrape_config_files", [])]
    missing = [f for f in referenced if not (PROMETHEUS_CONFIG.parent / f).exists()]
    if missing:
        pytest.skip(f"prometheus.yml references files that are not here: {missing}")
    out = run_promtool(promtool, "check", "config", str(PROMETHEUS_CONFIG))
    assert "is valid prometheus config file" in out


def test_alert_rules_fire_when_they_should(promtool: str, yaml: Any, tmp_path: Path) -> None:
    """promtool's rule unit tests, against the rules without annotations (promtool compares
    rendered annotations exactly; ``check rules`` already validates their templates)."""
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc))
    attempts = "herald_delivery_attempts_total{destination_type=%r, outcome=%r}"
    sev_w, sev_c = {"severity": "warning"}, {"severity": "critical"}
    target = {"job": "herald", "instance": "herald:8080"}

    def case(
        series: dict[str, str], alert: str, at: str, expected: list[dict[str, str]]
    ) -> dict[str, Any]:
        return {
            "interval": "1m",
            "input_series": [
                {"series": s.replace("'", '"'), "values": v} for s, v in series.items()
            ],
            "alert_rule_test": [
                {
                    "eval_time": at,
                    "alertname": alert,
                    "exp_alerts": [{"exp_labels": e} for e in expected],
                }
            ],
        }

    up = 'up{job="herald", instance="herald:8080"}'
    tests = [
        case({up: "1 1 0x10"}, "HeraldDown", "3m", []),  # down for 1 min: not yet
        case({up: "1 1 0x10"}, "HeraldDown", "5m", [{**sev_c, **target}]),
        case({up: "1x20"}, "HeraldDown", "15m", []),
        case({}, "HeraldMetricsAbsent", "11m", [{**sev_w, "job": "herald"}]),
        case(
            {up: "1x20", 'herald_build_info{job="herald", version="0.1.0"}': "1x20"},
            "HeraldMetricsAbsent",
            "15m",
            [],
        ),
        case(
            {
                'herald_component_up{component="relay"}': "1x10",
                'herald_component_up{component="dispatcher"}': "1 0x10",
                # The old label of the dispatcher, reported beside it: no second alert.
                'herald_component_up{component="workers"}': "1 0x10",
            },
            "HeraldComponentNotRunning",
            "5m",
            [{**sev_c, "component": "dispatcher"}],
        ),
        case(
            {'herald_source_up{source="shop"}': "1 1 0x10", 'herald_source_up{source="b"}': "1x12"},
            "HeraldSourceDown",
            "8m",
            [{**sev_w, "source": "shop"}],
        ),
        case({'herald_source_up{source="shop"}': "1 1 0x10"}, "HeraldSourceDown", "5m", []),
        case({"herald_outbox_lag_seconds": "120x10"}, "HeraldOutboxLagging", "7m", [sev_w]),
        case({"herald_outbox_lag_seconds": "120x10"}, "HeraldOutboxStalled", "7m", []),
        case({"herald_outbox_lag_seconds": "1000x20"}, "HeraldOutboxStalled", "15m", [sev_c]),
        case({"herald_outbox_lag_seconds": "0+5x20"}, "HeraldOutboxLagging", "10m", []),
        case(
            {
                'herald_deliveries_pending{state="due"}': "2000x30",
                'herald_deliveries_pending{state="held"}': "5000x30",
            },
            "HeraldDueDeliveriesPilingUp",
            "20m",
            [{**sev_w, "state": "due"}],
        ),
        # webhook: half the attempts fail; aws_sqs: 1 in 61; rabbitmq: all fail but rarely.
        case(
            {
                attempts % ("webhook", "success"): "0+60x40",
                attempts % ("webhook", "failure_retryable"): "0+30x40",
                attempts % ("webhook", "timeout"): "0+30x40",
                attempts % ("aws_sqs", "success"): "0+60x40",
                attempts % ("aws_sqs", "failure_permanent"): "0+1x40",
                attempts % ("rabbitmq", "failure_retryable"): "0+0.1x40",
            },
            "HeraldDeliveryFailureRatioHigh",
            "30m",
            [{**sev_w, "destination_type": "webhook"}],
        ),
        case(
            {'herald_outbox_rejected_total{reason="invalid_json"}': "0 0 1 1"},
            "HeraldOutboxRowsRejected",
            "3m",
            [{**sev_w, "reason": "invalid_json"}],
        ),
        case(
            {"herald_instances_reaped_total": "0 0 1 1"},
            "HeraldInstancePresumedDead",
            "3m",
            [sev_w],
        ),
        case({"herald_instances_reaped_total": "0x20"}, "HeraldInstancePresumedDead", "15m", []),
    ]
    covered = {t["alert_rule_test"][0]["alertname"] for t in tests}
    assert covered | alerts_tested_under_deploy(yaml) == {r["alert"] for r in alert_rules(yaml)}, (
        "a test case for every alert, here or in deploy/prometheus/tests"
    )
    spec = {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": tests}
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = run_promtool(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert "SUCCESS" in out


def alerts_tested_under_deploy(yaml: Any) -> set[str]:
    """The alerts the promtool unit tests in deploy/prometheus/tests prove to fire."""
    names = set()
    for path in sorted(ALERT_TESTS.glob("*.yml")):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for case in test["alert_rule_test"]:
                if case.get("exp_alerts"):
                    names.add(case["alertname"])
    return names


def test_the_alert_unit_tests_under_deploy_pass(promtool: str, yaml: Any) -> None:
    """deploy/prometheus/tests: the rules as shipped, annotations and all, fire when they
    should; the operator can run the same files."""
    files = sorted(ALERT_TESTS.glob("*.yml"))
    assert files
    for path in files:
        assert yaml.safe_load(path.read_text())["rule_files"] == ["../alerts.yml"], path
    out = run_promtool(promtool, "test", "rules", *map(str, files))
    assert "SUCCESS" in out
    assert "FAILED" not in out
    assert {
        "HeraldDatabaseDown",
        "HeraldStorageErrors",
        "HeraldDueBacklogGrowing",
        "HeraldDeliveriesExhausted",
        "HeraldDestinationsFailing",
    } <= alerts_tested_under_deploy(yaml)


# --- systemd -----------------------------------------------------------------------------------

_SYSTEMD_PROBLEM = re.compile(
    r"Unknown (key|section|lvalue)|Missing '='|Invalid section header|Failed to parse|"
    r"bad-setting|syntax|Unknown value|Invalid",
    re.I,
)


def systemd_verify(tool: str, unit_text: str, directory: Path) -> tuple[int, str]:
    directory.mkdir(exist_ok=True)
    path = directory / "herald.service"
    path.write_text(unit_text)
    proc = subprocess.run(
        [tool, "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0", "SYSTEMD_PAGER": ""},
        check=False,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze is not installed")
    unit = (DEPLOY / "systemd" / "herald.service").read_text()
    herald_bin = Path(sys.executable).parent / "herald"
    if not herald_bin.exists():
        herald_bin = ROOT / ".venv" / "bin" / "herald"
    assert herald_bin.exists(), "the herald console script"
    text, n = re.subn(r"^ExecStart=\S+", f"ExecStart={herald_bin}", unit, flags=re.M)
    assert n == 1
    code, out = systemd_verify(tool, text, tmp_path / "unit")
    if code != 0 and re.search(r"user|group", out, re.I):
        # No herald user on this machine: verify the rest.
        text = re.sub(r"^(User|Group)=", r"# \1=", text, flags=re.M)
        code, out = systemd_verify(tool, text, tmp_path / "unit")
    problems = [line for line in out.splitlines() if _SYSTEMD_PROBLEM.search(line)]
    assert code == 0, out
    assert not problems, out
    # The checker notices a bad unit, so the silence above means something.
    bad = text.replace("[Service]", "[Service]\nRestartSecs=2\nNoEquals", 1)
    _, out = systemd_verify(tool, bad, tmp_path / "bad")
    assert "RestartSecs" in out, out
    assert _SYSTEMD_PROBLEM.search(out), out


# --- live: every name the rules and the dashboard use is in a real scrape -------------------


def scrape_series(port: int) -> dict[str, list[dict[str, str]]]:
    """Sample name -> the label sets it has, from one /metrics scrape."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    series: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series.setdefault(sample.name, []).append(dict(sample.labels))
    return series


def defined_here(sample: str) -> bool:
    """Whether Herald's source names the metric of ``sample``. The rules and the dashboard
    may use a series whose code lands on another branch (issue 17's operational events
    add herald_deliveries_exhausted_total and herald_destinations_failing); until it
    does, its absence from the scrape is no error. Once metrics.py names it, it must be
    in the scrape."""
    family = re.sub(r"_(total|bucket|count|sum|created|info)$", "", sample)
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "herald").rglob("*.py"))
    return f'"{family}"' in source or f'"{sample}"' in source or not family.startswith("herald_")


def missing_from(series: dict[str, list[dict[str, str]]], exprs: list[str]) -> list[str]:
    problems = []
    for expr in exprs:
        for sel in selectors(expr):
            if sel.name in PROMETHEUS_SERIES:
                continue
            if sel.name not in series:
                if not defined_here(sel.name):
                    continue  # see defined_here
                problems.append(f"{sel.name} (in {expr!r})")
                continue
            for label, op, value in sel.matchers:
                if label in TARGET_LABELS:
                    continue
                values = {labels.get(label) for labels in series[sel.name]}
                if values == {None}:
                    problems.append(f"{sel.name} has no label {label!r}")
                elif op == "=" and value not in values:
                    problems.append(
                        f"{sel.name}{{{label}={value!r}}}: only {sorted(map(str, values))}"
                    )
    return problems


async def test_every_metric_the_rules_and_dashboard_use_is_exported(
    herald_factory: HeraldFactory, yaml: Any
) -> None:
    rule_exprs = [r["expr"] for r in alert_rules(yaml)]
    dash_exprs = dashboard_exprs()
    used = {s.name for e in rule_exprs + dash_exprs for s in selectors(e)}
    assert {
        "herald_outbox_lag_seconds",
        "herald_delivery_attempts_total",
        "herald_deliveries_completed_total",
        "herald_build_info",
        "herald_component_up",
        "herald_delivery_attempt_duration_seconds_bucket",
        "herald_event_delivery_latency_seconds_bucket",
        "process_resident_memory_bytes",
    } <= used, used

    h = herald_factory(
        {"delivery": {"max_retries": 0}, "metrics": {"refresh_seconds": 0.1}}, start=False
    )
    # An outbox source (a producer's SQLite file): herald_source_up and its series.
    producer = h.workdir / "producer.db"
    with sqlite3.connect(producer) as conn:
        conn.executescript(outbox_ddl("sqlite"))
    with h.config_path.open("a") as fh:
        fh.write(f'[[outbox.sources]]\nname = "shop"\nurl = "sqlite:///{producer}"\n')
    await h.astart()
    ok = await Receiver(secrets=[SECRET]).start()
    bad = await Receiver(
        secrets=[SECRET], behaviour=verification_ok_then(lambda _: web.Response(status=500))
    ).start()
    try:
        dests = await asyncio.gather(
            *(
                h.acreate_webhook(r.url, secret=SECRET, name=name, events=[f"probe.{name}"])
                for r, name in ((ok, "ok"), (bad, "bad"))
            )
        )
        await asyncio.gather(*(wait_active(h, d["id"]) for d in dests))
        h.insert_events(rows(2, prefix="evt_ok", type_="probe.ok"))
        h.insert_events(rows(1, prefix="evt_bad", type_="probe.bad"))
        # A row the relay rejects on either backend (jsonb accepts it, it is no object).
        h.insert_events([("evt_poison", "default", "a.b", "[1]")])
        await wait_deliveries(h, "status = 'success' AND kind = 'event'", 2)
        await wait_deliveries(h, "status = 'failure' AND kind = 'event'", 1)  # no retries left
        # Gauges come from a periodic refresh; wait until a scrape has everything.
        deadline = time.monotonic() + 15
        while True:
            series = await asyncio.to_thread(scrape_series, h.port)
            problems = missing_from(series, rule_exprs) + missing_from(series, dash_exprs)
            if not problems or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        assert not problems, "\n".join(problems)

        # The image's HEALTHCHECK command, run against this daemon.
        command = healthcheck_command()
        command[0] = sys.executable
        env = {**os.environ, "HERALD_API__LISTEN": f"127.0.0.1:{h.port}"}
        proc = await asyncio.to_thread(
            subprocess.run, command, env=env, capture_output=True, timeout=30, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert await h.astop() == 0
        proc = await asyncio.to_thread(
            subprocess.run, command, env=env, capture_output=True, timeout=30, check=False
        )
        assert proc.returncode != 0, "the health check fails once the daemon is gone"
    finally:
        await ok.stop()
        await bad.stop()
