#!/usr/bin/env python3
"""Checks deploy/ with validators the project did not write.

- Every Kubernetes manifest file, and the output of every kustomization
  (base, overlays/trial, overlays/production) rendered by a real kustomize
  (`kustomize build`, else the one built into `kubectl kustomize`), against
  the Kubernetes OpenAPI schemas of the pinned versions, in strict mode
  (an unknown field fails), with kubernetes-validate.
- docker-compose.yml against the Compose Specification's JSON schema (the
  copy shipped by check-jsonschema), with jsonschema.
- Then what no schema sees: every reference inside a rendering (the
  selectors of workloads, Services, PodDisruptionBudgets and
  NetworkPolicies, an autoscaler's target, an Ingress backend, a service
  address in a command line, a ConfigMap or Secret key, the trial's OTLP
  endpoint) names something the rendering holds; every agentmesh service
  has its gRPC readiness probe, /healthz liveness, the shared ConfigMap,
  an autoscaler, a budget, a policy and a headless Service; and every
  Secret a rendering does not hold is one deploy/README.md tells to
  create. In the compose file, depends_on and Prometheus's targets name
  its services. prometheus.yml goes through `promtool check config` when
  promtool is installed.

Every command line in these files goes through the agentmesh binary's own
parser in crates/cli/tests/deploy.rs, not here.

Prints one line per checked file or rendering and exits non-zero on any
failure. Needs only the packages of deploy/requirements.txt and a
kustomize; no network, cluster or container engine.

    python3 deploy/validate.py
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata, resources
from pathlib import Path

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import yaml

# kubernetes-validate reads a schema file (megabytes of JSON) on every call;
# the files do not change during a run, so each is read once.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(
    kubernetes_validate.utils.schema_contents
)

# The Kubernetes versions every manifest must be valid for: the oldest this
# deployment supports and the newest kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30", "1.37")

DEPLOY = Path(__file__).resolve().parent
ROOT = DEPLOY.parent
KUBERNETES = DEPLOY / "kubernetes"
KUSTOMIZATIONS = ("base", "overlays/trial", "overlays/production")

# The gRPC health service name each service registers (SERVICE_NAME in
# services/*/src/lib.rs); the readiness probes must ask for it.
GRPC_HEALTH = {
    "agentmesh-discovery": "agentmesh.v1.DiscoveryService",
    "agentmesh-planner": "agentmesh.v1.PlannerService",
    "agentmesh-executor": "agentmesh.v1.ExecutorService",
    "agentmesh-synthesis": "agentmesh.v1.SynthesisService",
    "agentmesh-gateway": "agentmesh.v1.GatewayService",
}
# Secrets a rendering uses but does not create: deploy/README.md and the
# file headers tell how to create each.
EXTERNAL_SECRETS = {
    "base": {"agentmesh-db", "agentmesh-llm", "agentmesh-gateway-tls", "agentmesh-auth"},
    "overlays/trial": {"agentmesh-llm", "agentmesh-gateway-tls"},
    "overlays/production": {"agentmesh-db", "agentmesh-llm", "agentmesh-gateway-tls", "agentmesh-auth"},
}
# What only the trial overlay runs.
TRIAL_ONLY = {("StatefulSet", "agentmesh-postgres"), ("Deployment", "agentmesh-jaeger")}


class StrictLoader(yaml.SafeLoader):
    """YAML 1.1 as PyYAML reads it (merge keys included), refusing a key
    given twice in one mapping, as kubectl and docker compose do."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_all(text: str) -> list:
    return [d for d in yaml.load_all(text, Loader=StrictLoader) if d is not None]


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.failures = 0

    def ok(self, what: str, detail: str) -> None:
        self.passed += 1
        print(f"ok    {what}: {detail}")

    def fail(self, what: str, problems: list[str]) -> None:
        self.failures += 1
        print(f"FAIL  {what}: {problems[0]}")
        for problem in problems[1:]:
            print(f"      {problem}")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# --- Kubernetes -----------------------------------------------------------


def kustomize() -> tuple[list[str], str] | None:
    """The command that renders a kustomization directory, and its version."""
    if shutil.which("kustomize"):
        out = subprocess.run(["kustomize", "version"], capture_output=True, text=True)
        return ["kustomize", "build"], f"kustomize {out.stdout.strip() or out.stderr.strip()}"
    if shutil.which("kubectl"):
        out = subprocess.run(
            ["kubectl", "version", "--client", "-o", "json"], capture_output=True, text=True
        )
        try:
            info = json.loads(out.stdout)
            version = f"kustomize {info['kustomizeVersion']} (kubectl {info['clientVersion']['gitVersion']})"
        except (ValueError, KeyError):
            version = "kubectl kustomize"
        return ["kubectl", "kustomize"], version
    return None


def schema_problems(documents: list) -> list[str]:
    problems = []
    for document in documents:
        if not isinstance(document, dict) or not {"apiVersion", "kind", "metadata"} <= document.keys():
            problems.append(f"a document without apiVersion, kind and metadata: {str(document)[:80]}")
            continue
        name = f"{document['kind']}/{document['metadata'].get('name')}"
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(document, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                where = ".".join(str(p) for p in e.path) or "(top)"
                problems.append(f"{name}: Kubernetes {version}: {where}: {e.message}")
            except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.utils.VersionNotSupportedError) as e:
                problems.append(f"{name}: Kubernetes {version}: {e.message}")
    return problems


def summary(documents: list) -> str:
    kinds: dict[str, int] = {}
    for d in documents:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    return ", ".join(f"{n} {k}" for k, n in kinds.items())


def pod_spec(document: dict) -> dict | None:
    if document["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return document["spec"]["template"]["spec"]
    return None


def selects(selector: dict, labels: dict) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        present, value = expression["key"] in labels, labels.get(expression["key"])
        operator = expression["operator"]
        if operator == "In" and value not in expression["values"]:
            return False
        if operator == "NotIn" and present and value in expression["values"]:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def reference_problems(name: str, documents: list) -> list[str]:
    """References inside one rendering that name nothing it holds."""
    problems: list[str] = []
    by_kind: dict[str, dict[str, dict]] = {}
    for d in documents:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    workloads = {n: d for k in ("Deployment", "StatefulSet") for n, d in by_kind.get(k, {}).items()}
    templates = {n: d["spec"]["template"]["metadata"].get("labels", {}) for n, d in workloads.items()}
    services = by_kind.get("Service", {})
    config_maps = by_kind.get("ConfigMap", {})
    secrets = by_kind.get("Secret", {})

    def service_port(host: str, port: int) -> bool:
        service = services.get(host)
        return service is not None and any(p["port"] == port for p in service["spec"]["ports"])

    used_secrets: set[str] = set()
    for workload_name, workload in workloads.items():
        if not selects(workload["spec"]["selector"], templates[workload_name]):
            problems.append(f"{workload['kind']}/{workload_name}: its selector does not match its pod template")
        spec = pod_spec(workload)
        for container in spec["containers"]:
            where = f"{workload['kind']}/{workload_name}"
            for source in container.get("envFrom") or []:
                ref = source.get("configMapRef") or source.get("secretRef")
                if "configMapRef" in source and ref["name"] not in config_maps and not ref.get("optional"):
                    problems.append(f"{where}: envFrom ConfigMap {ref['name']} is not in the rendering")
                if "secretRef" in source:
                    used_secrets.add(ref["name"])
            for env in container.get("env") or []:
                value_from = env.get("valueFrom") or {}
                if "configMapKeyRef" in value_from:
                    ref = value_from["configMapKeyRef"]
                    data = config_maps.get(ref["name"], {}).get("data", {})
                    if ref["key"] not in data and not ref.get("optional"):
                        problems.append(f"{where}: {env['name']} reads ConfigMap {ref['name']} key {ref['key']}, which is not there")
                if "secretKeyRef" in value_from:
                    ref = value_from["secretKeyRef"]
                    used_secrets.add(ref["name"])
                    secret = secrets.get(ref["name"])
                    keys = set((secret or {}).get("data", {})) | set((secret or {}).get("stringData", {}))
                    if secret is not None and ref["key"] not in keys and not ref.get("optional"):
                        problems.append(f"{where}: {env['name']} reads Secret {ref['name']} key {ref['key']}, which is not there")
            # Service addresses in the command line: http://HOST:PORT.
            for host, port in re.findall(r"https?://([a-z0-9-]+):(\d+)", " ".join(container.get("args") or [])):
                if not service_port(host, int(port)):
                    problems.append(f"{where}: its arguments name {host}:{port}, which no Service of the rendering serves")
            app = templates[workload_name].get("app")
            if app in GRPC_HEALTH:
                port = container["ports"][0]["containerPort"]
                grpc = (container.get("readinessProbe") or {}).get("grpc") or {}
                if grpc.get("port") != port or grpc.get("service") != GRPC_HEALTH[app]:
                    problems.append(f"{where}: readinessProbe is not gRPC health of {GRPC_HEALTH[app]} on {port}")
                live = (container.get("livenessProbe") or {}).get("httpGet") or {}
                if live.get("path") != "/healthz" or live.get("port") != port:
                    problems.append(f"{where}: livenessProbe is not GET /healthz on {port}")
                if not any((s.get("configMapRef") or {}).get("name") == "agentmesh-config" for s in container.get("envFrom") or []):
                    problems.append(f"{where}: does not read the ConfigMap agentmesh-config (the OTLP endpoint)")
                for kind in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy"):
                    if not any(
                        (kind == "HorizontalPodAutoscaler" and d["spec"]["scaleTargetRef"]["name"] == workload_name)
                        or (kind == "PodDisruptionBudget" and selects(d["spec"]["selector"], templates[workload_name]))
                        or (kind == "NetworkPolicy" and selects(d["spec"]["podSelector"], templates[workload_name]))
                        for d in by_kind.get(kind, {}).values()
                    ):
                        problems.append(f"{where}: no {kind} applies to it")
                headless = [s for s in services.values() if s["spec"].get("clusterIP") == "None"
                            and selects({"matchLabels": s["spec"]["selector"]}, templates[workload_name])]
                if not headless:
                    problems.append(f"{where}: no headless Service selects it")
        for volume in spec.get("volumes") or []:
            if "secret" in volume:
                used_secrets.add(volume["secret"]["secretName"])

    for service_name, service in services.items():
        selector = service["spec"].get("selector")
        if selector:
            matched = [n for n, labels in templates.items() if selects({"matchLabels": selector}, labels)]
            if not matched:
                problems.append(f"Service/{service_name}: its selector matches no pod template")
            for port in service["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                for workload_name in matched:
                    container_ports = {
                        p["containerPort"] if isinstance(target, int) else p.get("name")
                        for c in pod_spec(workloads[workload_name])["containers"] for p in c.get("ports") or []
                    }
                    if target not in container_ports:
                        problems.append(f"Service/{service_name}: targetPort {target} is not a port of {workload_name}")
    for hpa_name, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        target = hpa["spec"]["scaleTargetRef"]
        if target["name"] not in by_kind.get(target["kind"], {}):
            problems.append(f"HorizontalPodAutoscaler/{hpa_name}: its target {target['kind']}/{target['name']} is not in the rendering")
    for kind in ("PodDisruptionBudget", "NetworkPolicy"):
        for policy_name, policy in by_kind.get(kind, {}).items():
            selector = policy["spec"]["selector" if kind == "PodDisruptionBudget" else "podSelector"]
            if not any(selects(selector, labels) for labels in templates.values()):
                problems.append(f"{kind}/{policy_name}: its selector matches no pod template")
    for ingress_name, ingress in by_kind.get("Ingress", {}).items():
        for tls in ingress["spec"].get("tls") or []:
            used_secrets.add(tls["secretName"])
        for rule in ingress["spec"].get("rules") or []:
            for path in rule["http"]["paths"]:
                backend = path["backend"]["service"]
                if not service_port(backend["name"], backend["port"]["number"]):
                    problems.append(f"Ingress/{ingress_name}: backend {backend['name']}:{backend['port']['number']} is not a Service port")

    config = config_maps.get("agentmesh-config", {}).get("data", {})
    endpoint = config.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        problems.append("ConfigMap/agentmesh-config: no OTEL_EXPORTER_OTLP_ENDPOINT")
    elif name == "overlays/trial":
        match = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", endpoint)
        if not match or not service_port(match.group(1), int(match.group(2))):
            problems.append(f"ConfigMap/agentmesh-config: OTEL_EXPORTER_OTLP_ENDPOINT {endpoint} is not a Service of the trial")

    external = used_secrets - set(secrets)
    if external != EXTERNAL_SECRETS[name]:
        problems.append(
            f"the Secrets it expects to exist are {sorted(external)}, "
            f"deploy/README.md names {sorted(EXTERNAL_SECRETS[name])}"
        )
    held = {(d["kind"], d["metadata"]["name"]) for d in documents}
    if name == "overlays/trial" and not TRIAL_ONLY <= held:
        problems.append(f"the trial lacks {sorted(TRIAL_ONLY - held)}")
    if name != "overlays/trial" and TRIAL_ONLY & held:
        problems.append(f"holds {sorted(TRIAL_ONLY & held)}, which only the trial may")
    if name.startswith("overlays/"):
        namespaces = {d["metadata"].get("namespace") for d in documents if d["kind"] != "Namespace"}
        if len(namespaces) != 1 or None in namespaces:
            problems.append(f"resources are not all in one namespace: {sorted(map(str, namespaces))}")
    return problems


def check_kubernetes(report: Report) -> None:
    files = sorted(p for p in KUBERNETES.rglob("*.yaml") if p.name != "kustomization.yaml")
    versions = ", ".join(KUBERNETES_VERSIONS)
    for path in files:
        try:
            documents = load_all(path.read_text())
        except yaml.YAMLError as e:
            report.fail(rel(path), [f"not YAML: {e}"])
            continue
        problems = schema_problems(documents)
        if problems:
            report.fail(rel(path), problems)
        else:
            report.ok(rel(path), f"{summary(documents)}; valid for Kubernetes {versions} (strict)")

    renderer = kustomize()
    if renderer is None:
        report.fail(
            "deploy/kubernetes",
            ["no kustomize: install kustomize or kubectl (which has it built in) to render the overlays"],
        )
        return
    command, version = renderer
    for name in KUSTOMIZATIONS:
        directory = KUBERNETES / name
        out = subprocess.run([*command, str(directory)], capture_output=True, text=True)
        if out.returncode != 0:
            report.fail(f"{rel(directory)} (rendered)", [f"{' '.join(command)} failed: {out.stderr.strip()}"])
            continue
        documents = load_all(out.stdout)
        problems = schema_problems(documents)
        if not problems:
            try:
                problems = reference_problems(name, documents)
            except (KeyError, TypeError, IndexError, AttributeError) as e:
                problems = [f"cannot follow its references: {e!r}"]
        if problems:
            report.fail(f"{rel(directory)} (rendered)", problems)
        else:
            report.ok(
                f"{rel(directory)} (rendered)",
                f"{len(documents)} resources by {version}; valid for Kubernetes {versions} (strict); references resolve",
            )


# --- Compose and Prometheus -------------------------------------------------


def compose_schema() -> dict:
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    return json.loads(vendor.joinpath("compose-spec.json").read_text())


def check_compose(report: Report) -> dict | None:
    path = DEPLOY / "docker-compose.yml"
    try:
        compose = yaml.load(path.read_text(), Loader=StrictLoader)
    except yaml.YAMLError as e:
        report.fail(rel(path), [f"not YAML: {e}"])
        return None
    validator = jsonschema.Draft202012Validator(compose_schema())
    problems = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in sorted(validator.iter_errors(compose), key=lambda e: list(map(str, e.absolute_path)))
    ]
    services = compose.get("services", {})
    for name, service in services.items():
        depends = service.get("depends_on") or []
        for dependency in depends if isinstance(depends, list) else depends.keys():
            if dependency not in services:
                problems.append(f"services.{name}.depends_on: {dependency} is not a service")
    if problems:
        report.fail(rel(path), problems)
    else:
        version = metadata.version("check-jsonschema")
        report.ok(
            rel(path),
            f"{len(services)} services; valid against the Compose Specification schema "
            f"(compose-spec.json of check-jsonschema {version}, jsonschema {metadata.version('jsonschema')})",
        )
    return compose


def check_prometheus(report: Report, compose: dict | None) -> None:
    path = DEPLOY / "prometheus.yml"
    try:
        config = yaml.load(path.read_text(), Loader=StrictLoader)
    except yaml.YAMLError as e:
        report.fail(rel(path), [f"not YAML: {e}"])
        return
    problems = []
    services = (compose or {}).get("services", {})
    for job in config.get("scrape_configs", []) if compose is not None else []:
        for static in job.get("static_configs", []):
            for target in static.get("targets", []):
                host, _, port = target.partition(":")
                command = " ".join(services.get(host, {}).get("command") or [])
                if host not in services:
                    problems.append(f"{job['job_name']}: target {target} is not a compose service")
                elif f":{port}" not in command:
                    problems.append(f"{job['job_name']}: {host} does not listen on {port}")
    promtool = shutil.which("promtool")
    if promtool:
        out = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True, text=True)
        if out.returncode != 0:
            problems.append(f"promtool: {(out.stdout + out.stderr).strip()}")
    if problems:
        report.fail(rel(path), problems)
    else:
        checked = []
        if promtool:
            checked.append("promtool check config passes")
        if compose is not None:
            checked.append("every target is a compose service on its port")
        if not promtool:
            checked.append("promtool not installed: syntax not checked")
        report.ok(rel(path), "; ".join(checked))


def main() -> int:
    report = Report()
    print(
        f"validators: kubernetes-validate {metadata.version('kubernetes-validate')}, "
        f"jsonschema {metadata.version('jsonschema')}, check-jsonschema {metadata.version('check-jsonschema')}, "
        f"PyYAML {metadata.version('PyYAML')}"
    )
    check_kubernetes(report)
    compose = check_compose(report)
    check_prometheus(report, compose)
    print(f"deploy: {report.passed} passed, {report.failures} failed")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
