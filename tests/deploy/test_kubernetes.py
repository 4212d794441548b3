"""The Kubernetes manifests (deploy/k8s/): valid against a stated Kubernetes version, and consistent
with each other, with the Envoy configuration and with what the server exports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from deploy.envoy import run_topology
from ors_grpc.observability.metrics import SESSION_LOAD
from tests.support.servers import start_serve

#: The Kubernetes release the manifests are written for (kubernetes-validate ships its schemas).
KUBERNETES_VERSION = "1.34"
MANIFESTS = Path(run_topology.REPO_ROOT) / "deploy" / "k8s"


def resources() -> list[dict[str, Any]]:
    return [document for path in sorted(MANIFESTS.glob("*.yaml"))
            for document in yaml.safe_load_all(path.read_text()) if document]


def resource(kind: str, name: str) -> dict[str, Any]:
    return next(item for item in resources() if (item["kind"], item["metadata"]["name"]) == (kind, name))


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("manifest", resources(), ids=lambda item: f"{item['kind']}/{item['metadata']['name']}")
def test_every_manifest_is_valid_kubernetes(manifest: dict[str, Any]) -> None:
    # strict: an unknown field (a typo) is an error, not silently dropped.
    assert kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True) == KUBERNETES_VERSION


def test_the_envoy_configmap_is_the_rendered_template() -> None:
    committed = (MANIFESTS / "envoy-config.yaml").read_text()
    assert committed == run_topology.kubernetes_configmap(), (
        "deploy/k8s/envoy-config.yaml is stale: python deploy/envoy/run_topology.py --kubernetes-config"
        " > deploy/k8s/envoy-config.yaml"
    )
    envoy = resource("Deployment", "ors-envoy")["spec"]["template"]["spec"]
    assert envoy["volumes"][0]["configMap"]["name"] == run_topology.KUBERNETES_CONFIGMAP
    assert option(envoy["containers"][0]["args"], "-c") == f"{envoy['containers'][0]['volumeMounts'][0]['mountPath']}/envoy.yaml"


def test_the_headless_service_lists_the_backend_pods_on_the_ports_envoy_dials() -> None:
    service = resource("Service", run_topology.KUBERNETES_SERVICE)["spec"]
    pod = resource("Deployment", "ors-backend")["spec"]["template"]
    assert service["clusterIP"] == "None"
    # A draining (terminating, not ready) pod stays in DNS, so in Envoy's clusters: its pinned sessions reach it.
    assert service["publishNotReadyAddresses"] is True
    assert service["selector"].items() <= pod["metadata"]["labels"].items()
    args = pod["spec"]["containers"][0]["args"]
    ports = {port["name"]: port["port"] for port in service["ports"]}
    assert ports == {"grpc": run_topology.KUBERNETES_GRPC_PORT, "http": run_topology.KUBERNETES_HTTP_PORT}
    assert (int(option(args, "--port")), int(option(args, "--http-port"))) == (ports["grpc"], ports["http"])


def test_the_backend_drains_before_it_is_killed() -> None:
    pod = resource("Deployment", "ors-backend")["spec"]["template"]["spec"]
    serve = pod["containers"][0]
    grpc_port = int(option(serve["args"], "--port"))
    assert pod["terminationGracePeriodSeconds"] > float(option(serve["args"], "--drain-timeout"))
    assert serve["lifecycle"]["preStop"]["exec"]["command"] == ["ors-grpc", "drain", f"127.0.0.1:{grpc_port}", "--wait"]
    # Its session ids name the pod (its IP, from the downward API), for Envoy's stateful sessions.
    assert option(serve["args"], "--advertise-host") == "$(POD_IP)"
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in serve["env"]
    # Ready only while SERVING (a drain says NOT_SERVING); alive by TCP, so a drain is not a restart.
    assert serve["readinessProbe"]["grpc"]["port"] == grpc_port
    assert "grpc" not in serve["livenessProbe"]


def test_the_autoscaler_scales_the_backends_on_the_load_signal_they_export() -> None:
    spec = resource("HorizontalPodAutoscaler", "ors-backend")["spec"]
    backend = resource("Deployment", "ors-backend")
    assert (spec["scaleTargetRef"]["kind"], spec["scaleTargetRef"]["name"]) == ("Deployment", backend["metadata"]["name"])
    assert spec["metrics"][0]["pods"]["metric"]["name"] == SESSION_LOAD.describe()[0].name
    # The signal is a ratio over --max-sessions: the backends must set it.
    assert int(option(backend["spec"]["template"]["spec"]["containers"][0]["args"], "--max-sessions")) > 0


def loopback(args: list[str]) -> list[str]:
    """A container's `ors-grpc serve` arguments, bound to 127.0.0.1 on free ports instead."""
    rewritten = list(args)
    for name, value in (("--host", "127.0.0.1"), ("--port", "0"), ("--http-port", "0"), ("--metrics-port", "0"),
                        ("--advertise-host", "127.0.0.1")):
        rewritten[rewritten.index(name) + 1] = value
    return rewritten


def test_the_backend_container_command_serves_and_its_pre_stop_drains_it() -> None:
    serve = resource("Deployment", "ors-backend")["spec"]["template"]["spec"]["containers"][0]
    assert serve["args"][:2] == ["ors-grpc", "serve"]
    with start_serve(*loopback(serve["args"][2:])) as running:
        command = [running.grpc_target if part.startswith("127.0.0.1:") else part
                   for part in serve["lifecycle"]["preStop"]["exec"]["command"][1:]]
        drain = subprocess.run([sys.executable, "-m", "ors_grpc.cli", *command],
                               capture_output=True, text=True, timeout=60)
        assert drain.returncode == 0, drain.stdout + drain.stderr
        assert drain.stdout.splitlines()[-1] == f"{running.grpc_target} has stopped"  # --wait: until it exited
        assert running.proc.wait(timeout=60) == 0
