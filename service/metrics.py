"""Prometheus metrics of the service, in their own registry (one :class:`Metrics` per app).

Names (all prefixed ``embed_``):

* ``embed_requests_total{route,method,status}`` — answered HTTP requests (counter).
* ``embed_request_duration_seconds{route,method}`` — wall time of a request (histogram, seconds).
* ``embed_queue_size{model}`` — requests admitted to the batcher and not yet answered (gauge).
* ``embed_batch_size{model}`` — inputs per inference batch (histogram).
* ``embed_batch_tokens{model}`` — padded tokens per inference batch, ``batch x max_len`` (histogram).
* ``embed_tokenization_duration_seconds{model}`` — tokenizing one request (histogram, seconds).
* ``embed_inference_duration_seconds{model}`` — one ONNX Runtime batch, padding included (histogram, seconds).
* ``embed_inputs_total{model}`` — inputs embedded (counter).
* ``embed_rejected_total{model,reason}`` — requests refused by the batcher (``queue_full``, ``input_too_long``).
* ``embed_model_info{name,version,sha256,quantization,providers,active}`` — 1 per loaded model (gauge).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LAT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SIZE = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_TOKENS = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    """All service metrics, registered in a private :class:`CollectorRegistry`."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("embed_requests", "HTTP requests answered", ["route", "method", "status"], registry=r)
        self.request_duration = Histogram(
            "embed_request_duration_seconds",
            "HTTP request duration in seconds",
            ["route", "method"],
            buckets=_LAT,
            registry=r,
        )
        self.queue_size = Gauge(
            "embed_queue_size", "requests admitted to the batcher, not yet answered", ["model"], registry=r
        )
        self.batch_size = Histogram(
            "embed_batch_size", "inputs per inference batch", ["model"], buckets=_SIZE, registry=r
        )
        self.batch_tokens = Histogram(
            "embed_batch_tokens",
            "padded tokens per inference batch (batch x max_len)",
            ["model"],
            buckets=_TOKENS,
            registry=r,
        )
        self.tokenization_duration = Histogram(
            "embed_tokenization_duration_seconds",
            "tokenization time per request in seconds",
            ["model"],
            buckets=_LAT,
            registry=r,
        )
        self.inference_duration = Histogram(
            "embed_inference_duration_seconds",
            "ONNX Runtime time per batch in seconds",
            ["model"],
            buckets=_LAT,
            registry=r,
        )
        self.inputs = Counter("embed_inputs", "inputs embedded", ["model"], registry=r)
        self.rejected = Counter("embed_rejected", "requests refused by the batcher", ["model", "reason"], registry=r)
        self.model_info = Gauge(
            "embed_model_info",
            "loaded models (value 1)",
            ["name", "version", "sha256", "quantization", "providers", "active"],
            registry=r,
        )

    def set_models(self, rows: list[dict[str, str]]) -> None:
        """Replace the ``embed_model_info`` series with one per loaded model (label dicts)."""
        self.model_info.clear()
        for labels in rows:
            self.model_info.labels(**labels).set(1)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
