"""examples/kubernetes/: valid against Kubernetes' schemas (bundled by kubernetes-validate, offline), and coherent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.requires import require
from tests.scaling_targets import SERVER_MODULE, server_module

kubernetes_validate = require("kubernetes_validate", "make test-all installs it (the test-all group)")

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "examples" / "kubernetes").glob("*.yaml"))
# The oldest Kubernetes the manifests are for (the preStop sleep action), and the newest the package bundles.
VERSIONS = ["1.30.0", kubernetes_validate.utils.latest_version()]


def documents() -> dict[str, dict[str, Any]]:
    """Every resource of the manifests, by kind."""
    found = {}
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                assert doc["kind"] not in found, f"two {doc['kind']}s"
                found[doc["kind"]] = doc
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_validates_strictly(path: Path, version: str) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_can_fail() -> None:
    deployment = documents()["Deployment"]
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError, match="replica"):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)


def test_the_pieces_fit_together() -> None:
    docs = documents()
    assert set(docs) == {"Deployment", "Service", "HorizontalPodAutoscaler", "ConfigMap"}
    deployment, service, hpa = docs["Deployment"], docs["Service"], docs["HorizontalPodAutoscaler"]
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    assert container["command"] == ["python", "-m", SERVER_MODULE]
    assert {p["name"] for p in container["ports"]} >= {service["spec"]["ports"][0]["targetPort"]}

    # The probes ask the example server for paths it has.
    server = server_module()
    paths = {getattr(route, "path", None) for route in server.create_app(server.ServerSettings()).routes}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] in paths, probe

    # The HPA scales this Deployment on a metric this package exports, which the adapter's rule serves.
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    (pods_metric,) = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    from async_batcher.metrics_multiprocess import _metrics_for

    assert pods_metric == _metrics_for("async_batcher").queued._name
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "PROMETHEUS_MULTIPROC_DIR" in env  # one /metrics for the pod's workers
    (rule,) = yaml.safe_load(docs["ConfigMap"]["data"]["config.yaml"])["rules"]
    assert rule["seriesQuery"].startswith(pods_metric + "{")
    assert rule["name"]["as"] == pods_metric

    # The grace period covers the preStop pause, the drain of a full queue and the workers' teardown.
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    queued = int(env["KERAS_SERVER_MAX_QUEUE_SIZE"])
    batches = -(-queued // int(env["KERAS_SERVER_MAX_BATCH_SIZE"])) + 1  # a full queue, and the batch in flight
    drain = batches * 0.1  # seconds: a generous time per batch for this model (about 1 ms measured)
    teardown = 10  # seconds: uvicorn's exit and TensorFlow's teardown, generously
    assert grace >= pause + drain + teardown
