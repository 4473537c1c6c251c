"""What operators see of the service: Prometheus metrics, the access log, request ids (docs/metrics.md,
docs/operating.md)."""
