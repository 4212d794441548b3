"""Test helper: a stand-in OTLP trace collector on loopback, over gRPC or HTTP, that keeps the
spans any process sends it (a served process and its worker processes alike)."""

from __future__ import annotations

import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

#: Seconds `Collector.wait_for` waits for the spans it is asked for.
SPAN_WAIT_S = 10.0


class Collector:
    """A stand-in OTLP collector on loopback (its own thread): the spans it was sent."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self._lock = threading.Lock()

    def receive(self, body: bytes) -> None:
        request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
        with self._lock:
            self.spans += [span for resource in request.resource_spans
                           for scope in resource.scope_spans for span in scope.spans]

    def wait_for(self, *names: str) -> dict[str, Any]:
        deadline = time.monotonic() + SPAN_WAIT_S
        while time.monotonic() < deadline:
            with self._lock:
                by_name = {span.name: span for span in self.spans}
            if set(names) <= set(by_name):
                return by_name
            time.sleep(0.05)
        raise AssertionError(f"the collector got {sorted(by_name)}, not all of {names}")


@contextlib.contextmanager
def otlp_collector(protocol: str) -> Iterator[tuple[Collector, str]]:
    collector = Collector()
    if protocol == "grpc":
        class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                collector.receive(request.SerializeToString())
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            yield collector, f"http://127.0.0.1:{port}"
        finally:
            server.stop(None)
        return

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            assert self.path == "/v1/traces"
            collector.receive(self.rfile.read(int(self.headers["Content-Length"])))
            body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    http_server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=http_server.serve_forever, daemon=True).start()
    try:
        yield collector, f"http://127.0.0.1:{http_server.server_address[1]}"
    finally:
        http_server.shutdown()
        http_server.server_close()
