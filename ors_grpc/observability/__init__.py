"""Metrics (Prometheus) and tracing (OpenTelemetry), for the gRPC service and
the doors alike: `metrics`, `tracing`, and `rpc_handlers` (how both wrap a
grpc handler)."""
