"""The operator files under deploy/: they parse, validate and speak the config treemail accepts.

Offline throughout: Kubernetes manifests are validated against the JSON schemas
bundled in the kubernetes-validate package (strict: unknown fields fail), the
compose file with `docker compose config` when the compose plugin is there
(skipped otherwise; it needs no engine), with Debian's docker-compose 1.29 when
that is there, and structurally in any case; the compose Prometheus config
with promtool when it is installed.
"""

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from treemail.adapters.config import MessagingConfig, ServiceConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
KUBERNETES_VERSION = "1.30.0"

YAML_FILES = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))
K8S_FILES = sorted(p for p in K8S.rglob("*.yaml") if p.name != "kustomization.yaml")
KUSTOMIZATIONS = sorted(K8S.rglob("kustomization.yaml"))

# Read by treemail/cli.py and its logging setup, not by load_config.
EXTRA_ENV = {"TREEMAIL_CONFIG", "TREEMAIL_METRICS_PORT", "TREEMAIL_PROJECTION_METRICS_PORT", "TREEMAIL_PUMP_METRICS_PORT",
             "REDIS_URL", "TREEMAIL_LOG", "TREEMAIL_LOG_FORMAT"}
ENV_NAME = re.compile(r"\b(TREEMAIL_[A-Z0-9_]+|REDIS_URL)\b")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc is not None]


def k8s_objects() -> list[tuple[Path, dict]]:
    return [(path, doc) for path in K8S_FILES for doc in documents(path)]


def find(kind: str, name: str) -> dict:
    found = [doc for _, doc in k8s_objects() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- (a) every YAML parses -----------------------------------------------------------------


def test_deploy_tree_has_the_expected_files():
    for name in (
        "compose.yaml", "Dockerfile", "compose/prometheus.yml", "compose/treemail.toml",
        "valkey/valkey.conf", "valkey/valkey-cluster.conf", "k8s/kustomization.yaml",
        "k8s/valkey-cluster/kustomization.yaml", "grafana/provisioning/datasources/prometheus.yml",
        "grafana/provisioning/dashboards/treemail.yml", "k8s/pump.yaml", "targets/pumps.json", "k8s/gateway.yaml",
    ):
        assert (DEPLOY / name).is_file(), f"deploy/{name} is missing"


@pytest.mark.parametrize("path", YAML_FILES, ids=rel)
def test_yaml_parses(path):
    docs = documents(path)
    assert docs, f"{rel(path)} holds no document"
    for doc in docs:
        assert isinstance(doc, dict), f"{rel(path)}: a document is not a mapping"


# -- (b) Kubernetes manifests --------------------------------------------------------------


@pytest.mark.parametrize("path", K8S_FILES, ids=rel)
def test_k8s_manifest_is_valid_against_the_schema(path):
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]'")
    for doc in documents(path):
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{rel(path)}: {doc['kind']} {doc['metadata'].get('name')}: {exc.message} "
                        f"at {'.'.join(str(p) for p in exc.path)}")


def test_k8s_objects_are_named_and_namespaced():
    for path, doc in k8s_objects():
        assert doc.get("apiVersion") and doc.get("kind"), rel(path)
        assert doc.get("metadata", {}).get("name"), f"{rel(path)}: {doc['kind']} without a name"
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "treemail", f"{rel(path)}: {doc['kind']} namespace"


def test_each_kustomization_lists_exactly_the_manifests_beside_it():
    assert KUSTOMIZATIONS
    for kustomization in KUSTOMIZATIONS:
        doc = yaml.safe_load(kustomization.read_text(encoding="utf-8"))
        assert doc["kind"] == "Kustomization" and doc["namespace"] == "treemail"
        listed = set(doc["resources"])
        beside = {p.name for p in kustomization.parent.glob("*.yaml") if p.name != "kustomization.yaml"}
        assert listed == beside, f"{rel(kustomization)} lists {sorted(listed)}, the folder has {sorted(beside)}"


def workloads() -> list[dict]:
    return [doc for _, doc in k8s_objects() if doc["kind"] in ("Deployment", "StatefulSet")]


def test_workloads_have_replicas_resources_probes_and_matching_labels():
    assert workloads()
    for doc in workloads():
        name = f"{doc['kind']} {doc['metadata']['name']}"
        spec = doc["spec"]
        assert isinstance(spec.get("replicas"), int), f"{name}: replicas"
        assert matches(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"]), (
            f"{name}: selector does not match the pod template labels"
        )
        for container in spec["template"]["spec"]["containers"]:
            assert container["resources"]["requests"] and container["resources"]["limits"], f"{name}: resources"
            assert "livenessProbe" in container and "readinessProbe" in container, f"{name}: probes"


def test_worker_projection_and_pump_deployments():
    worker = find("Deployment", "treemail-worker")
    projections = find("Deployment", "treemail-projections")
    pump = find("Deployment", "treemail-pump")
    assert worker["spec"]["replicas"] == 3
    # Exactly one projection runner per partition set; a second folds twice into the same views.
    assert projections["spec"]["replicas"] == 1
    assert projections["spec"]["strategy"]["type"] == "Recreate"
    # Pumps act under etags (never twice): more than one, so obligations are kept while one restarts.
    assert pump["spec"]["replicas"] >= 2
    for doc, command, port in ((worker, "worker", 9464), (projections, "projections", 9465), (pump, "pump", 9466)):
        template = doc["spec"]["template"]
        annotations = template["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == str(port)
        (container,) = template["spec"]["containers"]
        assert container["args"] == [command]
        assert {p["containerPort"] for p in container["ports"]} == {port}
        # /metrics answered 200 with the server gone: alive is /healthz, ready (server and group there) /readyz.
        for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert container[probe]["httpGet"]["path"] == path, f"{command}: {probe}"
            assert container[probe]["httpGet"]["port"] == "metrics", f"{command}: {probe}"
        env = {e["name"]: e.get("value") for e in container["env"]}
        config_mount = env["TREEMAIL_CONFIG"]
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert str(Path(config_mount).parent) in mounts, f"{command}: TREEMAIL_CONFIG is not on a mounted volume"
        volume = next(v for v in template["spec"]["volumes"] if v["name"] == mounts[str(Path(config_mount).parent)])
        assert volume["configMap"]["name"] == "treemail-config"
        assert Path(config_mount).name in find("ConfigMap", "treemail-config")["data"]


GATEWAY_PORT = 8781


def test_the_gateway_serves_on_its_port_with_readiness_probes_in_k8s_and_compose():
    """The host gateway binds every address in its container (loopback is its default), on the port its probes,
    Service and compose healthcheck name; ready means what a worker's /readyz means."""
    import inspect

    from treemail.entrypoints.gateway_command import gateway

    options = inspect.signature(gateway).parameters
    assert {"host", "port"} <= set(options)
    args = ["gateway", "--host", "0.0.0.0", "--port", str(GATEWAY_PORT)]

    deployment = find("Deployment", "treemail-gateway")
    assert deployment["spec"]["replicas"] >= 2  # it keeps nothing: any replica answers any request
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == args
    (port,) = container["ports"]
    assert port["containerPort"] == GATEWAY_PORT
    for probe, path in (("startupProbe", "/healthz"), ("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        assert container[probe]["httpGet"] == {"path": path, "port": port["name"]}, probe
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TREEMAIL_CONFIG"] == "/etc/treemail/treemail.toml"
    service = find("Service", "treemail-gateway")
    # No authentication of its own: never published outside the cluster by these files.
    assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
    assert matches(service["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(GATEWAY_PORT, port["name"])]

    services = compose()["services"]
    gateway_service = services["gateway"]
    assert gateway_service["command"] == args
    assert gateway_service["ports"] == [f"127.0.0.1:{GATEWAY_PORT}:{GATEWAY_PORT}"]  # the host's loopback only
    assert f"127.0.0.1:{GATEWAY_PORT}/readyz" in " ".join(gateway_service["healthcheck"]["test"])
    assert gateway_service["environment"]["REDIS_URL"] == "redis://valkey:6379/0"
    assert gateway_service["depends_on"]["valkey"]["condition"] == "service_healthy"


def test_worker_pdb_and_services_select_the_worker_pods():
    worker_labels = find("Deployment", "treemail-worker")["spec"]["template"]["metadata"]["labels"]
    pdb = find("PodDisruptionBudget", "treemail-worker")
    assert "minAvailable" in pdb["spec"] or "maxUnavailable" in pdb["spec"]
    assert matches(pdb["spec"]["selector"]["matchLabels"], worker_labels)
    assert not matches(pdb["spec"]["selector"]["matchLabels"],
                       find("Deployment", "treemail-projections")["spec"]["template"]["metadata"]["labels"])
    for service, deployment in (("treemail-worker-metrics", "treemail-worker"),
                                ("treemail-projections-metrics", "treemail-projections"),
                                ("treemail-pump-metrics", "treemail-pump")):
        svc = find("Service", service)
        assert svc["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
        labels = find("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
        assert matches(svc["spec"]["selector"], labels), f"Service {service} selects no {deployment} pod"


def test_valkey_cluster_example():
    sts = find("StatefulSet", "valkey-cluster")
    assert sts["spec"]["replicas"] == 6
    assert sts["spec"]["volumeClaimTemplates"]
    conf = find("ConfigMap", "valkey-cluster-config")["data"]["valkey.conf"]
    assert conf == (DEPLOY / "valkey" / "valkey-cluster.conf").read_text(encoding="utf-8"), (
        "the valkey-cluster ConfigMap drifted from deploy/valkey/valkey-cluster.conf"
    )
    script = " ".join(find("Job", "valkey-cluster-create")["spec"]["template"]["spec"]["containers"][0]["command"])
    assert "valkey-cli --cluster create" in script and "--cluster-replicas 1" in script
    assert find("Service", "valkey-cluster")["spec"]["clusterIP"] == "None"


def test_single_valkey_configmap_is_the_durable_conf():
    conf = find("ConfigMap", "valkey-config")["data"]["valkey.conf"]
    assert conf == (DEPLOY / "valkey" / "valkey.conf").read_text(encoding="utf-8"), (
        "the valkey ConfigMap drifted from deploy/valkey/valkey.conf"
    )


def conf_directives(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            out[key.lower()] = value.strip()
    return out


def test_valkey_confs_are_durable():
    single = conf_directives(DEPLOY / "valkey" / "valkey.conf")
    cluster = conf_directives(DEPLOY / "valkey" / "valkey-cluster.conf")
    for conf in (single, cluster):
        # The durable profile needs the append-only file, and the streams must never be evicted.
        assert conf["appendonly"] == "yes"
        assert conf["maxmemory-policy"] == "noeviction"
        # What `treemail server` and the tests run with: small sessions' streams in 2 KB nodes.
        assert conf["stream-node-max-bytes"] == "2048"
    # One server: WAITAOF confirms each fsync. A cluster: every primary must fsync each write itself
    # (treemail.adapters.connection.require_durable_server refuses anything else).
    assert single["appendfsync"] == "everysec"
    assert cluster["appendfsync"] == "always"
    assert single.get("cluster-enabled", "no") == "no"
    assert cluster["cluster-enabled"] == "yes" and cluster["cluster-config-file"]


# -- (c) compose ---------------------------------------------------------------------------


def compose_plugin() -> str:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        why = (probe.stderr or probe.stdout).strip().splitlines()
        pytest.skip(f"docker has no compose plugin ({why[0] if why else probe.returncode})")
    return docker


def test_docker_compose_config():
    docker = compose_plugin()
    done = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--quiet"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, f"docker compose config failed:\n{done.stdout}\n{done.stderr}"


def test_docker_compose_v1_config():
    """Debian's docker-compose 1.29 (Python) checks the file against the compose schema too.

    It predates the top-level `name` key, so that line is left out of what it reads.
    """
    legacy = shutil.which("docker-compose")
    if legacy is None:
        pytest.skip("no docker-compose (v1) binary")
    text = re.sub(r"^name: .*\n", "", COMPOSE.read_text(encoding="utf-8"), flags=re.M)
    done = subprocess.run([legacy, "-f", "-", "--project-directory", str(DEPLOY), "config", "-q"],
                          input=text, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, f"docker-compose config failed:\n{done.stdout}\n{done.stderr}"


def test_compose_services():
    doc = compose()
    services = doc["services"]
    assert {"valkey", "worker", "projections", "pump", "prometheus", "grafana"} <= set(services)
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"compose {name}: {source} does not exist"
            else:
                assert source in doc["volumes"], f"compose {name}: named volume {source} is not declared"

    valkey = services["valkey"]
    conf = valkey["command"][-1]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in valkey["volumes"]}
    assert (DEPLOY / mounted[conf]).resolve() == (DEPLOY / "valkey" / "valkey.conf").resolve()
    assert "/data" in mounted and mounted["/data"] in doc["volumes"], "Valkey's AOF needs a volume at /data"

    worker, projections, pump = services["worker"], services["projections"], services["pump"]
    assert worker["deploy"]["replicas"] == 3 and projections["deploy"]["replicas"] == 1
    assert pump["deploy"]["replicas"] >= 2
    assert worker["command"] == ["worker"] and projections["command"] == ["projections"]
    assert pump["command"] == ["pump"]
    for scaled in (worker, pump):
        assert "ports" not in scaled, "a published host port would stop `--scale`"
        assert "container_name" not in scaled
    build = worker["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).resolve() == (DEPLOY / "Dockerfile").resolve()
    for service in (worker, projections, pump):
        assert service["environment"]["REDIS_URL"] == "redis://valkey:6379/0"
        assert service["depends_on"]["valkey"]["condition"] == "service_healthy"

    prom_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["prometheus"]["volumes"]}
    assert (DEPLOY / prom_mounts["/etc/prometheus/prometheus.yml"]).resolve() == (DEPLOY / "compose/prometheus.yml")
    assert (DEPLOY / prom_mounts["/etc/prometheus/alerts.yml"]).resolve() == (DEPLOY / "alerts.yml")
    grafana_mounts = {v.split(":")[1]: v.split(":")[0] for v in services["grafana"]["volumes"]}
    assert (DEPLOY / grafana_mounts["/etc/grafana/provisioning"]).resolve() == DEPLOY / "grafana/provisioning"
    dashboards = [c for c, h in grafana_mounts.items() if h.endswith("treemail-dashboard.json")]
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/treemail.yml").read_text())
    assert dashboards and Path(dashboards[0]).parent == Path(provider["providers"][0]["options"]["path"])


def test_dockerfile_installs_the_project():
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    assert re.search(r"^RUN pip install \.", text, re.M)
    assert re.search(r'^ENTRYPOINT \["treemail"\]', text, re.M)
    # Every package the wheel ships is copied in.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    for top in set(pyproject["tool"]["setuptools"]["package-dir"].values()):
        assert re.search(rf"^COPY {top} ", text, re.M), f"Dockerfile does not copy {top}/"


def test_compose_prometheus_discovers_the_scaled_services():
    config = yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text(encoding="utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # The same job names as deploy/prometheus.yml, which alerts.yml relies on.
    host_config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text(encoding="utf-8"))
    assert set(jobs) == {job["job_name"] for job in host_config["scrape_configs"]}
    services = compose()["services"]
    for job, service, port in (("treemail-workers", "worker", 9464), ("treemail-projections", "projections", 9465),
                               ("treemail-pumps", "pump", 9466)):
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["names"] == [service] and sd["type"] == "A" and sd["port"] == port
        assert str(port) in [str(p) for p in services[service]["expose"]]
    assert config["rule_files"] == ["alerts.yml"]


def test_compose_prometheus_config_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian's prometheus package: `make prometheus`)")
    # Laid out as the container sees it: the config with alerts.yml beside it.
    shutil.copy(DEPLOY / "compose" / "prometheus.yml", tmp_path / "prometheus.yml")
    shutil.copy(DEPLOY / "alerts.yml", tmp_path / "alerts.yml")
    done = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"promtool check config failed:\n{done.stdout}\n{done.stderr}"


def test_grafana_datasource_is_the_compose_prometheus():
    doc = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text(encoding="utf-8"))
    (source,) = doc["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090" and source["isDefault"]
    dashboard = json.loads((DEPLOY / "grafana" / "treemail-dashboard.json").read_text(encoding="utf-8"))
    # The dashboard picks its data source through a variable, so the provisioned default is used.
    assert any(v["type"] == "datasource" for v in dashboard["templating"]["list"])


# -- (d) config keys and env names ---------------------------------------------------------


def k8s_tomls() -> list[tuple[str, str]]:
    out = []
    for path, doc in k8s_objects():
        if doc["kind"] == "ConfigMap":
            for key, text in doc.get("data", {}).items():
                if key.endswith(".toml"):
                    out.append((f"{rel(path)}:{doc['metadata']['name']}/{key}", text))
    return out


def all_tomls() -> list[tuple[str, str]]:
    files = [(rel(p), p.read_text(encoding="utf-8")) for p in DEPLOY.rglob("*.toml")]
    return files + k8s_tomls()


def test_there_is_a_configmap_toml():
    assert [name for name, _ in k8s_tomls() if name.endswith("treemail-config/treemail.toml")]


@pytest.mark.parametrize("name,text", all_tomls(), ids=[name for name, _ in all_tomls()])
def test_treemail_toml_loads(tmp_path, name, text):
    path = tmp_path / "treemail.toml"
    path.write_text(text, encoding="utf-8")
    # No environment: only the file's keys count, and an unknown key raises ConfigError.
    config = load_config(path, environ={})
    raw = tomllib.loads(text)
    assert set(raw) == {"messaging", "service"}, f"{name}: want exactly the [messaging] and [service] tables"
    assert raw["messaging"] and raw["service"]
    # The durable profile is what these deployments promise; their servers run appendonly yes.
    assert config.service.profile == "durable"


def env_names_in(text: str) -> set[str]:
    return set(ENV_NAME.findall(text))


def env_files() -> list[Path]:
    return [COMPOSE, *K8S_FILES]


def test_env_var_names_map_to_config_fields():
    known = set(EXTRA_ENV)
    known |= {f"TREEMAIL_MESSAGING_{f.upper()}" for f in MessagingConfig.model_fields}
    known |= {f"TREEMAIL_SERVICE_{f.upper()}" for f in ServiceConfig.model_fields}
    seen: dict[str, set[str]] = {}
    for path in env_files():
        # Comments too: documented overrides must be real. `<KEY>` placeholders are not names.
        text = re.sub(r"TREEMAIL_(MESSAGING|SERVICE)_<KEY>", "", path.read_text(encoding="utf-8"))
        for name in env_names_in(text):
            seen.setdefault(name, set()).add(rel(path))
    unknown = {name: sorted(paths) for name, paths in seen.items() if name not in known}
    assert not unknown, f"environment variables treemail does not read: {unknown}"
    assert "TREEMAIL_CONFIG" in seen and "TREEMAIL_METRICS_PORT" in seen


def structured_env() -> list[tuple[str, str, str]]:
    """(where, name, value) of every env entry the services actually get."""
    out = []
    for name, service in compose()["services"].items():
        for key, value in (service.get("environment") or {}).items():
            out.append((f"compose {name}", key, str(value)))
    for path, doc in k8s_objects():
        if doc["kind"] in ("Deployment", "StatefulSet", "Job"):
            for container in doc["spec"]["template"]["spec"]["containers"]:
                for entry in container.get("env", []):
                    out.append((f"{rel(path)} {container['name']}", entry["name"], str(entry.get("value", ""))))
    return out


def test_service_env_values_load(tmp_path):
    """Each treemail service's env, applied over its config file, passes load_config."""
    config_text = {"compose": (DEPLOY / "compose" / "treemail.toml").read_text(encoding="utf-8"),
                   "k8s": find("ConfigMap", "treemail-config")["data"]["treemail.toml"]}
    by_service: dict[str, dict[str, str]] = {}
    for where, name, value in structured_env():
        if ENV_NAME.fullmatch(name):
            by_service.setdefault(where, {})[name] = value
    assert by_service
    for where, env in by_service.items():
        if "TREEMAIL_CONFIG" not in env:
            continue
        # ${VAR:-default} in compose: the default is what runs when VAR is unset.
        env = {k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", v) for k, v in env.items()}
        text = config_text["compose" if where.startswith("compose") else "k8s"]
        path = tmp_path / "treemail.toml"
        path.write_text(text, encoding="utf-8")
        load_config(path, environ={k: v for k, v in env.items() if k != "TREEMAIL_CONFIG"})
        for port_var in ("TREEMAIL_METRICS_PORT", "TREEMAIL_PROJECTION_METRICS_PORT", "TREEMAIL_PUMP_METRICS_PORT"):
            if port_var in env:
                assert env[port_var].isdigit(), f"{where}: {port_var}={env[port_var]!r}"


# -- (e) health, dashboards and what the README promises ------------------------------------


def test_compose_healthchecks_ask_readiness_not_metrics():
    services = compose()["services"]
    for name, port in (("worker", 9464), ("projections", 9465), ("pump", 9466)):
        test = " ".join(services[name]["healthcheck"]["test"])
        assert f"127.0.0.1:{port}/readyz" in test, f"compose {name}: healthcheck {test}"


def test_dashboard_panels_show_zero_where_zero_is_meant():
    """An aggregate over no series is "No data"; a count of workers up or a rate of a counter means 0 then."""
    dashboard = json.loads((DEPLOY / "grafana" / "treemail-dashboard.json").read_text(encoding="utf-8"))
    unlabelled = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            if re.match(r"(count|sum)\(", expr) and "/" not in expr and not expr.endswith("or vector(0)"):
                unlabelled.append(f"{panel['title']}: {expr}")
    assert not unlabelled, unlabelled


def test_the_dashboard_shows_the_delivery_pump_with_the_metrics_it_exports():
    from prometheus_client.parser import text_string_to_metric_families
    from prometheus_client import generate_latest

    from treemail.adapters import metrics

    dashboard = json.loads((DEPLOY / "grafana" / "treemail-dashboard.json").read_text(encoding="utf-8"))
    exprs = [t["expr"] for p in dashboard["panels"] if "pump" in p["title"].lower() for t in p["targets"]]
    exported = {s.name for f in text_string_to_metric_families(generate_latest(metrics.PUMP_REGISTRY).decode())
                for s in f.samples}
    used = {name for expr in exprs for name in re.findall(r"treemail_\w+", expr)}
    assert {"treemail_pump_lag_seconds", "treemail_obligations_total"} <= used
    assert used <= exported, used - exported
    jobs = {job["job_name"] for job in yaml.safe_load((DEPLOY / "compose" / "prometheus.yml").read_text())[
        "scrape_configs"]}
    assert any(f'job="{job}"' in expr for expr in exprs for job in jobs if "pump" in job)


def test_deploy_readme_knows_the_cluster_client():
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "single-node client" not in text
    assert "cluster = true" in text and "/readyz" in text and "/healthz" in text
    example = (K8S / "valkey-cluster" / "valkey-cluster.yaml").read_text(encoding="utf-8")
    assert "cluster-aware" not in example and "cluster = true" in example
