"""The fronts' request metrics in the core's ``/metrics``: prometheus_client's multiprocess mode.

Each front counts what it answers in its own :class:`~service.metrics.Metrics` (``embed_requests_total``,
``embed_request_duration_seconds``; proxied requests under the route ``proxied``), its values kept by
prometheus_client in memory-mapped files of a directory the supervisor makes (``PROMETHEUS_MULTIPROC_DIR``, set for
the fronts only), one set of files per front index (:func:`use_front_files`; a restarted front goes on from its
predecessor's values, so its counters never go back). The core, which serves ``/metrics``, reads them at scrape time
(:class:`FrontsCollector`) and exposes them as ``embed_front_requests_total{front,route,method,status}``,
``embed_front_request_duration_seconds{front,route,method}`` and, for a front's own tokenizer calls
(``service.front.tokenizing``), ``embed_front_tokenization_duration_seconds{front,model}``, and for the batches a
front runs itself (``front_inference``, ``service.front.local_models``) ``embed_front_inference_duration_seconds``,
``embed_front_batch_size``, ``embed_front_batch_tokens``, ``embed_front_inputs_total`` and
``embed_front_rejected_total`` (each ``{front,model,...}``): the ``front_`` names keep
them apart from the core's own ``embed_requests_total`` (which, behind fronts, counts the fronts' ``/internal/embed``
calls and the proxied requests). Multiprocess mode rather than scraping each front: no socket per front, no
request fan-out at scrape time, and a dead front's counts stay readable.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import values
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

#: the front metrics exposed, by their name in a front's registry
FRONT_METRICS = (
    "embed_requests",
    "embed_request_duration_seconds",
    "embed_tokenization_duration_seconds",
    # a front's own batches (``front_inference``: service.front.local_models)
    "embed_inference_duration_seconds",
    "embed_batch_size",
    "embed_batch_tokens",
    "embed_inputs",
    "embed_rejected",
)


def use_front_files(index: int) -> None:
    """Make this process's metrics, from now on, live in the multiprocess files of front ``index`` (call before
    building any metric; ``PROMETHEUS_MULTIPROC_DIR`` must be set). Fronts of distinct indices run at once, so the
    identifier is distinct among running processes, as prometheus_client requires."""
    values.ValueClass = values.MultiProcessValue(lambda: f"front{index}")


def _renamed(name: str) -> str:
    return "embed_front_" + name.removeprefix("embed_")


class FrontsCollector(Collector):
    """A collector of the fronts' request metrics from the multiprocess directory ``path`` (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def collect(self) -> Iterator[Metric]:
        """The fronts' metrics, one ``front`` label value per front index (prometheus_client ``Collector``)."""
        by_front: dict[str, list[str]] = defaultdict(list)
        for f in sorted(self.path.glob("*_front*.db")):
            by_front[f.stem.rsplit("_front", 1)[1]].append(str(f))
        out: dict[str, Metric] = {}
        for front, files in by_front.items():
            for m in MultiProcessCollector.merge(files, accumulate=True):
                if m.name not in FRONT_METRICS:
                    continue
                dst = out.setdefault(m.name, Metric(_renamed(m.name), m.documentation + " (front processes)", m.type))
                for s in m.samples:
                    dst.add_sample(_renamed(s.name), {**s.labels, "front": front}, s.value)
        yield from out.values()
