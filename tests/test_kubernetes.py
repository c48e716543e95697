"""Kubernetes: manifests in deploy/kubernetes and specs from nbody_dask.k8s, checked offline.

No API server can run here, so every object is validated the way a strict one would: Dask
objects against the CRDs that dask-kubernetes ships (``openAPIV3Schema``, nulls pruned first,
unknown fields rejected as with ``kubectl apply --validate=strict``), core objects against the
models of the official ``kubernetes`` client. A typo is rejected by the same checks.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

dask_kubernetes = pytest.importorskip("dask_kubernetes")
kubernetes_client = pytest.importorskip("kubernetes.client")
operator = pytest.importorskip("dask_kubernetes.operator")

from nbody_dask import clusters, k8s  # noqa: E402

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
CRDS = (Path(dask_kubernetes.__file__).parent / "operator" / "deployment" / "helm"
        / "dask-kubernetes-operator" / "crds")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
IMAGE = "registry.example.org/nbody-dask:0.1.0"


def _strict(schema: Any) -> Any:
    """A CRD structural schema that, like strict field validation, rejects unknown fields."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (_strict(v) if k in ("items", "additionalProperties", "anyOf", "allOf", "oneOf",
                                   "not") else v) for k, v in schema.items()}
    if "properties" in schema:
        out["properties"] = {k: _strict(v) for k, v in schema["properties"].items()}
        if (not schema.get("x-kubernetes-preserve-unknown-fields")
                and "additionalProperties" not in schema):
            out["additionalProperties"] = False
    return out


def _prune_nulls(node: Any) -> Any:
    """What the API server does to null fields of a non-nullable schema: drop them."""
    if isinstance(node, dict):
        return {k: _prune_nulls(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_prune_nulls(v) for v in node]
    return node


@cache
def _crds() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        found[crd["spec"]["names"]["kind"]] = crd["spec"]
    return found


def _check_core(value: Any, model: str, where: str) -> None:
    """Walk ``value`` along the ``kubernetes`` client's model ``model``; unknown keys fail."""
    if model.lower().startswith("list["):
        assert isinstance(value, list), f"{where}: expected a list"
        for i, item in enumerate(value):
            _check_core(item, model[5:-1], f"{where}[{i}]")
    elif model.lower().startswith(("dict(", "dict[")):
        assert isinstance(value, dict), f"{where}: expected a mapping"
    elif model in ("str", "int", "bool", "float", "object", "datetime"):
        return
    else:
        cls = getattr(kubernetes_client, model)
        assert isinstance(value, dict), f"{where}: expected a {model} mapping"
        by_json = {json: attr for attr, json in cls.attribute_map.items()}
        unknown = sorted(set(value) - set(by_json))
        assert not unknown, f"{where}: unknown field(s) {unknown} in {model}"
        for key, item in value.items():
            _check_core(item, cls.openapi_types[by_json[key]], f"{where}.{key}")


def validate(doc: dict[str, Any]) -> None:
    """Raise (AssertionError or jsonschema.ValidationError) unless a strict API server would
    accept ``doc``."""
    doc = _prune_nulls(doc)
    kind, api_version = doc.get("kind"), doc.get("apiVersion")
    name = doc.get("metadata", {}).get("name", "")
    assert DNS_SUBDOMAIN.match(name), f"metadata.name {name!r} is not a DNS subdomain"
    if kind in _crds():
        crd = _crds()[kind]
        versions = {f"{crd['group']}/{v['name']}": v for v in crd["versions"] if v["served"]}
        assert api_version in versions, f"{kind}: apiVersion {api_version!r} not served"
        _check_core(doc["metadata"], "V1ObjectMeta", "metadata")
        body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
        schema = _strict(versions[api_version]["schema"]["openAPIV3Schema"])
        jsonschema.Draft7Validator(schema).validate(body)
    else:
        assert api_version == "v1" and kind in ("PersistentVolumeClaim", "Secret"), \
            f"unexpected object {api_version} {kind}"
        _check_core({k: v for k, v in doc.items() if k != "status"}, f"V1{kind}", kind)


def _documents() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{path.name}#{i}", doc) for path in sorted(DEPLOY.glob("*.yaml"))
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())) if doc]


@pytest.mark.parametrize("label, doc", _documents(), ids=[d[0] for d in _documents()])
def test_deploy_manifests_validate(label, doc):
    validate(doc)


def test_every_dask_kind_has_a_manifest():
    kinds = {doc["kind"] for _, doc in _documents()}
    assert {"DaskCluster", "DaskJob", "DaskWorkerGroup", "PersistentVolumeClaim"} <= kinds


def _manifest(kind: str) -> dict[str, Any]:
    return copy.deepcopy(next(doc for _, doc in _documents() if doc["kind"] == kind))


@pytest.mark.parametrize("mutate", [
    pytest.param(lambda d: d["spec"]["worker"].__setitem__("replica", 4), id="spec.worker.replica"),
    pytest.param(lambda d: d["spec"]["worker"]["spec"]["containers"][0].__setitem__(
        "imagePullPolice", "Always"), id="container.imagePullPolice"),
    pytest.param(lambda d: d["spec"]["worker"]["spec"]["containers"][0]["volumeMounts"][0]
                 .__setitem__("mountpath", "/data"), id="volumeMounts.mountpath"),
    pytest.param(lambda d: d["spec"]["worker"].__setitem__("replicas", "four"),
                 id="replicas-not-an-integer"),
    pytest.param(lambda d: d["spec"].pop("scheduler"), id="scheduler-missing"),
    pytest.param(lambda d: d.__setitem__("apiVersion", "kubernetes.dask.org/v2"),
                 id="unserved-version"),
    pytest.param(lambda d: d["metadata"].__setitem__("name", "NBody_Dask"), id="bad-name"),
    pytest.param(lambda d: d["metadata"].__setitem__("label", {"a": "b"}), id="metadata.label"),
])
def test_a_typo_is_rejected(mutate):
    doc = _manifest("DaskCluster")
    validate(doc)
    mutate(doc)
    with pytest.raises((AssertionError, jsonschema.ValidationError)):
        validate(doc)


def test_unknown_fields_pass_the_bare_crd_schema():
    """Why the strict step is needed: the CRD alone (structural, pruning) accepts a typo."""
    doc = _manifest("DaskCluster")
    doc["spec"]["worker"]["replica"] = 4
    schema = _crds()["DaskCluster"]["versions"][0]["schema"]["openAPIV3Schema"]
    jsonschema.Draft7Validator(schema).validate({"spec": doc["spec"]})


def test_a_typo_in_a_core_object_is_rejected():
    doc = _manifest("PersistentVolumeClaim")
    doc["spec"]["accesModes"] = doc["spec"].pop("accessModes")
    with pytest.raises(AssertionError, match="accesModes"):
        validate(doc)


def test_nulls_are_pruned_as_by_the_api_server():
    spec = operator.make_cluster_spec(name="x", image=IMAGE)
    assert spec["spec"]["worker"]["spec"]["containers"][0]["env"] is None
    validate(spec)


@pytest.mark.parametrize("kwargs", [
    {},
    {"n_workers": 8, "worker_cpu": 16, "worker_memory": "32Gi"},
    {"worker_cpu": 4, "layout": "pairs"},
    {"gpus_per_worker": 1, "worker_cpu": 4},
    {"volume_claim": "nbody-store", "mount_path": "/scratch", "env": {"DASK_NBODY__DTYPE":
                                                                      "float32"}},
])
def test_generated_cluster_specs_validate(kwargs):
    spec = k8s.cluster_spec(image=IMAGE, **kwargs)
    validate(spec)
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    limits = worker["resources"]["limits"]
    assert worker["resources"]["requests"] == limits
    if kwargs.get("gpus_per_worker"):
        assert worker["args"][:3] == ["dask", "cuda", "worker"]
        assert limits["nvidia.com/gpu"] == "1"
        assert "nvidia.com/gpu" not in str(spec["spec"]["scheduler"])
    else:  # the rows layout by default: one Dask thread, a kernel on every core of the pod
        assert worker["args"][:2] == ["dask", "worker"]
        i = worker["args"].index("--nthreads")
        cores = str(kwargs.get("worker_cpu", 2))
        if kwargs.get("layout") == "pairs":
            assert worker["args"][i + 1] == limits["cpu"] == cores
        else:
            assert worker["args"][i + 1] == "1"
            assert {"name": "NUMBA_NUM_THREADS", "value": cores} in worker["env"]
            assert limits["cpu"] == cores
    if "volume_claim" in kwargs:
        assert worker["volumeMounts"] == [{"name": "store", "mountPath": "/scratch"}]


def test_generated_worker_group_validates():
    group = k8s.worker_group_spec("nbody-dask", "gpu", image=IMAGE, n_workers=2,
                                  volume_claim="nbody-store")
    validate(group)
    assert group["metadata"]["name"] == "nbody-dask-gpu"
    assert group["spec"]["cluster"] == "nbody-dask"


def test_generated_spec_matches_the_hand_written_manifest():
    """deploy/kubernetes/daskcluster.yaml is what cluster_spec() makes for its settings."""
    spec = k8s.cluster_spec("nbody-dask", image=IMAGE, n_workers=4, worker_cpu=8,
                            worker_memory="8Gi", volume_claim="nbody-store")
    assert _prune_nulls(spec) == _manifest("DaskCluster")


@pytest.mark.parametrize("kwargs, match", [
    ({"image": None}, "image must name"),
    ({"image": IMAGE, "name": "Bad_Name"}, "name must be a lower-case DNS label"),
    ({"image": IMAGE, "n_workers": -1}, "n_workers must be >= 0"),
    ({"image": IMAGE, "worker_cpu": 0}, "worker_cpu must be >= 1"),
    ({"image": IMAGE, "layout": "grid"}, "layout must be one of"),
    ({"image": IMAGE, "worker_memory": "8 GB"}, "worker_memory must be a Kubernetes quantity"),
    ({"image": IMAGE, "volume_claim": "store", "mount_path": "data"}, "mount_path must be"),
])
def test_bad_spec_values_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        k8s.cluster_spec(**kwargs)


def test_kubecluster_without_a_cluster_fails_fast_and_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="no Kubernetes cluster to talk to"):
        clusters.kubernetes(image=IMAGE)
    assert time.monotonic() - t0 < 20


def test_python_example_stops_with_one_line(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "absent"), "PATH": "/usr/bin:/bin"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, str(DEPLOY / "kubecluster.py"), "--image", IMAGE],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip().startswith("error: nbody_dask.clusters.kubernetes: no Kubernetes")
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert time.monotonic() - t0 < 30


@pytest.mark.slow
def test_cli_cluster_kubernetes_errors_are_one_line(tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "absent"), "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "nbody_dask.cli", "run", "--n", "64", "--steps", "2",
           "--store", str(tmp_path / "r.zarr"), "--cluster", "kubernetes"]
    no_image = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=60)
    assert no_image.returncode != 0
    assert "image must name" in no_image.stderr
    assert len(no_image.stderr.strip().splitlines()) == 1, no_image.stderr
    env["DASK_NBODY__KUBERNETES__IMAGE"] = IMAGE
    no_cluster = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=60)
    assert no_cluster.returncode != 0
    assert "no Kubernetes cluster to talk to" in no_cluster.stderr
    assert len(no_cluster.stderr.strip().splitlines()) == 1, no_cluster.stderr
    assert not (tmp_path / "r.zarr").exists()
