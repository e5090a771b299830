"""Prometheus metrics of the service, in their own registry (one :class:`Metrics` per app).

Names (all prefixed ``embed_``):

* ``embed_requests_total{route,method,status}`` — answered HTTP requests (counter).
* ``embed_request_duration_seconds{route,method}`` — wall time of a request (histogram, seconds).
* ``embed_queue_size{model}`` — requests admitted to the batcher and not yet answered (gauge).
* ``embed_batch_size{model}`` — inputs per inference batch (histogram).
* ``embed_batch_tokens{model}`` — padded tokens per inference batch, ``batch x max_len`` (histogram).
* ``embed_tokenization_duration_seconds{model}`` — one tokenizer call: a chunk of a request of up to ~8k
  characters (histogram, seconds).
* ``embed_inference_duration_seconds{model}`` — one ONNX Runtime batch, padding included (histogram, seconds).
* ``embed_inputs_total{model}`` — inputs embedded (counter).
* ``embed_rejected_total{model,reason}`` — requests refused by the batcher (``queue_full``, ``input_too_long``, ``request_too_large``).
* ``embed_model_info{name,version,sha256,quantization,providers,active}`` — 1 per loaded model (gauge).
* ``embed_collection_search_duration_seconds{index,operation}`` — a ``search`` or ``search_batch`` request on a
  collection with that index type, embedding of text queries included (histogram, seconds; successes only).
* ``embed_collection_upsert_duration_seconds{index}`` — an upsert request, embedding and durable commit included
  (histogram, seconds; successes only).

Read from every open collection (:class:`CollectionsCollector`, gauges): at scrape time when that is quick, else the
last values read (a scrape never waits on a slow or unreachable vector store: Milvus answers ``info()`` over the
network; see :class:`CollectionsCollector`):

* ``embed_collection_info{collection,index,metric,model,version}`` — 1 per collection; a collection without a
  model-bound vector (client vectors only, sparse vectors only, payloads only) has ``none`` for those it lacks (its
  other gauges carry ``index="none"`` too).
* ``embed_collection_points{collection,index}`` — live points.
* ``embed_collection_index_vectors{collection,index}`` / ``embed_collection_index_tombstones{collection,index}`` —
  vectors in the FAISS index and those of them removed but not yet rebuilt away.
* ``embed_collection_index_trained{collection,index}`` — 1 once the index is trained (IVF-PQ), else 0.
* ``embed_collection_writes_since_snapshot{collection}`` — write sequence numbers not covered by the newest snapshot.
* ``embed_collection_snapshot_age_seconds{collection}`` — seconds since the last snapshot (or since the collection
  was opened, when none was written since).
* ``embed_collection_reembed_done{collection}`` / ``embed_collection_reembed_total{collection}`` — points
  re-embedded towards the new active model, and the points to do (the running or last re-embedding; 0 if none).
* ``embed_collection_reembed_state{collection,state}`` — 1 for the current state (``none``, ``running``,
  ``completed``, ``cancelled``, ``failed``), 0 for the others.
* ``embed_collection_stats_age_seconds{collection}`` — how old the values above are (seconds since they were read).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("service.metrics")

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
            "tokenization time per tokenizer call (a chunk of a request, ~8k characters at most) in seconds",
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
        self.collection_search_duration = Histogram(
            "embed_collection_search_duration_seconds",
            "collection search request duration in seconds, by index type",
            ["index", "operation"],
            buckets=_LAT,
            registry=r,
        )
        self.collection_upsert_duration = Histogram(
            "embed_collection_upsert_duration_seconds",
            "collection upsert request duration in seconds (embedding and durable commit), by index type",
            ["index"],
            buckets=_LAT,
            registry=r,
        )
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

    def watch_collections(self, collections: Callable[[], Mapping[str, Any] | None]) -> None:
        """Export the collections returned by ``collections()`` (name -> open collection, or None while the
        service starts) at every scrape, through a :class:`CollectionsCollector`."""
        self.registry.register(CollectionsCollector(collections))

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


REEMBED_STATES = ("none", "running", "completed", "cancelled", "failed")


class CollectionsCollector(Collector):
    """The ``embed_collection_*`` gauges, from each open collection's ``info()``, without making a scrape wait on it.

    A scrape starts a reading of every collection's ``info()`` on a thread of its own (unless one is still running),
    waits for it at most ``wait_s``, and exports the last values read for each open collection (with their age,
    ``embed_collection_stats_age_seconds``): fresh when the backend answers within ``wait_s`` (the embedded backend,
    a healthy Milvus), the previous ones while it is slow or unreachable (a Milvus outage: a reading may take each
    call's timeout, once per collection). A collection never read yet has no samples; a deleted one drops out at
    once (the list of open collections is the service's own).

    Args:
        collections: returns the collections (name -> object with ``info()`` returning the
            ``GET /collections/{name}`` body), or None before they are started.
        wait_s: the longest a scrape waits for the current reading.
    """

    def __init__(self, collections: Callable[[], Mapping[str, Any] | None], wait_s: float = 0.25) -> None:
        self._collections = collections
        self.wait_s = wait_s
        self._last: dict[str, tuple[float, dict[str, Any]]] = {}  # name -> (monotonic time read, info)
        self._lock = threading.Lock()
        self._reading: threading.Thread | None = None

    def _read(self, colls: dict[str, Any]) -> None:
        """Read every collection's ``info()`` into the last values (a failing one keeps its previous values)."""
        for name, coll in colls.items():
            try:
                info = coll.info()
            except Exception:
                log.warning("metrics: reading collection %s failed; exporting its last values", name, exc_info=True)
                continue
            with self._lock:
                self._last[name] = (time.monotonic(), info)

    def snapshot(self) -> dict[str, tuple[float, dict[str, Any]]]:
        """Start a reading (module docstring), wait for it at most ``wait_s``, and return ``{name: (age_s, info)}`` of
        the open collections read at least once."""
        colls = dict(self._collections() or {})
        with self._lock:
            reading = self._reading
            if reading is None or not reading.is_alive():
                reading = self._reading = threading.Thread(
                    target=self._read, args=(colls,), name="metrics-collections", daemon=True
                )
                reading.start()
        reading.join(self.wait_s)
        now = time.monotonic()
        with self._lock:
            for gone in set(self._last) - set(colls):
                del self._last[gone]
            return {n: (now - t, info) for n, (t, info) in self._last.items() if n in colls}

    def _families(self) -> dict[str, GaugeMetricFamily]:
        ci, c = ["collection", "index"], ["collection"]
        specs = {
            "info": (
                "collection (value 1) with its index type, metric and embedding model",
                [*ci, "metric", "model", "version"],
            ),
            "points": ("live points in the collection", ci),
            "index_vectors": ("vectors in the FAISS index, tombstones included", ci),
            "index_tombstones": ("removed vectors still in the FAISS index (until a rebuild)", ci),
            "index_trained": ("1 once the index is trained, else 0", ci),
            "writes_since_snapshot": (
                "write sequence numbers not covered by the newest snapshot (embedded backend)",
                c,
            ),
            "snapshot_age_seconds": ("seconds since the last snapshot, or since opening (embedded backend)", c),
            "reembed_done": ("points re-embedded towards the new active model (running or last re-embedding)", c),
            "reembed_total": ("points the running or last re-embedding has to embed", c),
            "reembed_state": ("1 for the collection's re-embedding state, 0 for the others", [*c, "state"]),
            "stats_age_seconds": ("seconds since the values of the other embed_collection_* gauges were read", c),
        }
        return {k: GaugeMetricFamily(f"embed_collection_{k}", doc, labels=labels) for k, (doc, labels) in specs.items()}

    def describe(self) -> Iterator[Metric]:
        """The families, without samples (lets the registry check names without reading any collection)."""
        yield from self._families().values()

    def collect(self) -> Iterator[Metric]:
        """One sample per collection and family, from :meth:`snapshot` (the last values read). A collection whose
        info cannot be rendered is left out of this scrape (logged); the scrape itself always answers."""
        f = self._families()
        for name, (age, info) in sorted(self.snapshot().items()):
            try:
                samples = list(self._samples(name, age, info))
            except Exception:
                log.warning("metrics: collection %s has an info the gauges cannot render", name, exc_info=True)
                continue
            for family, labels, value in samples:
                f[family].add_metric(labels, value)
        yield from f.values()

    @staticmethod
    def _samples(name: str, age: float, info: dict[str, Any]) -> Iterator[tuple[str, list[str], float]]:
        """``(family, label values, value)`` of each sample of collection ``name`` (its info read ``age`` s ago)."""
        yield "stats_age_seconds", [name], age
        idx = info.get("index") or {}
        ci = [name, _label(idx.get("type"))]
        model = info.get("model") or {}
        yield "info", [*ci, _label(info.get("metric")), _label(model.get("name")), _label(model.get("version"))], 1
        yield "points", ci, float(info.get("count") or 0)
        yield "index_vectors", ci, float(idx.get("vectors") or 0)
        yield "index_tombstones", ci, float(idx.get("tombstones") or 0)
        yield "index_trained", ci, 1 if idx.get("trained", True) else 0
        if info.get("snapshot_sequence") is not None:  # backends with local snapshots (embedded)
            yield "writes_since_snapshot", [name], float(info["sequence"] - info["snapshot_sequence"])
            yield "snapshot_age_seconds", [name], float(info["snapshot_age_seconds"])
        re = info.get("reembedding") or {}
        yield "reembed_done", [name], float(re.get("done") or 0)
        yield "reembed_total", [name], float(re.get("total") or 0)
        state = _label(re.get("state", "none"))
        for s in dict.fromkeys((*REEMBED_STATES, state)):
            yield "reembed_state", [name, s], 1 if s == state else 0


def _label(value: object) -> str:
    """A label value: ``"none"`` for a missing one (a collection without a model-bound vector has no index type,
    metric or model), else the value as text (Prometheus label values are strings)."""
    return "none" if value is None else str(value)


class CollectionTimer:
    """Times collection requests into the histograms of :class:`Metrics`, labelled by the collection's index type.

    Use as ``with timer("search", name): ...``; an operation that raises is not observed (errors are counted by
    ``embed_requests_total``).

    Args:
        metrics: the service metrics.
        collections: returns the open collections (name -> collection with ``spec.kind``), or None.
    """

    def __init__(self, metrics: Metrics, collections: Callable[[], Mapping[str, Any] | None]) -> None:
        self.metrics = metrics
        self._collections = collections

    @contextmanager
    def __call__(self, operation: str, name: str) -> Iterator[None]:
        """Time the block as ``operation`` (``search``, ``search_batch`` or ``upsert``) on collection ``name``."""
        t0 = time.perf_counter()
        yield
        dt = time.perf_counter() - t0
        coll = (self._collections() or {}).get(name)
        spec = getattr(coll, "spec", None)  # None: a collection without a model-bound vector (client vectors only)
        kind = spec.kind if spec is not None else "unknown" if coll is None else "none"
        if operation == "upsert":
            self.metrics.collection_upsert_duration.labels(kind).observe(dt)
        else:
            self.metrics.collection_search_duration.labels(kind, operation).observe(dt)


def open_collections(state: Any) -> Mapping[str, Any] | None:
    """The collections of an app (name -> handle, from its collections backend), or None before start."""
    svc = getattr(state, "collection_service", None)
    return {c.name: c for c in svc.backend.list()} if svc is not None else None
