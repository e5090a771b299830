"""The Milvus side of a collection: the fields of its physical Milvus collections, how each index type of
:mod:`..index` maps to a Milvus index, and Milvus scores to the API's scores.

Fields: ``key`` (VARCHAR primary key: the point id as JSON text, as in the embedded store), ``text`` (VARCHAR),
``payload`` (JSON), ``nulls`` (JSON: the payload's null and empty-array paths, see :mod:`.expr`), ``updated`` (INT64: the write's
version, nanoseconds at the writer; a re-embedding compares it between the old and new physical collection) and
``vector`` (FLOAT_VECTOR of the collection's dimension).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from pymilvus import DataType, MilvusClient

from service.collections.errors import InvalidCollectionRequest
from service.collections.index import IndexSpec
from service.collections.metric import is_distance, normalised
from service.collections.milvus.client import LOAD_TIMEOUT_S
from service.collections.milvus.expr import payload_marks
from service.collections.schema import DenseVector, VectorsConfig

MAX_KEY_BYTES = 4096  # an encoded 512-character string id, escapes included
MAX_TEXT_BYTES = 65535  # Milvus VARCHAR limit

# the API's metric -> Milvus metric (cosine vectors are also stored unit-normalised, as the embedded backend does)
METRICS = {"cosine": "COSINE", "dot": "IP", "l2": "L2"}


def _hnsw(p: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "HNSW", {"M": p["M"], "efConstruction": p["ef_construction"]}


def _ivf_pq(p: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "IVF_PQ", {"nlist": p["nlist"], "m": p["m"], "nbits": p["nbits"]}


def _ivf_sq(p: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return "IVF_SQ8", {"nlist": p["nlist"]}


# index type -> (Milvus index type and build params); search params per type, for top_k results and the search's
# HNSW breadth (None: the index's ef_search)
BUILD = {"flat": lambda p: ("FLAT", {}), "hnsw": _hnsw, "ivf_pq": _ivf_pq, "ivf_sq": _ivf_sq}
SEARCH = {
    "flat": lambda p, k, ef: {},
    "hnsw": lambda p, k, ef: {"ef": max(ef if ef is not None else p["ef_search"], k)},
    "ivf_pq": lambda p, k, ef: {"nprobe": p["nprobe"]},
    "ivf_sq": lambda p, k, ef: {"nprobe": p["nprobe"]},
}


def check_supported(kind: str) -> None:
    """Raises :class:`InvalidCollectionRequest` for an index type this backend cannot build."""
    if kind not in BUILD:
        raise InvalidCollectionRequest(
            f"index {kind!r} is not available on the milvus backend (available: {sorted(BUILD)})", param="index"
        )


def supported_vector(vectors: VectorsConfig) -> DenseVector:
    """The one vector of a collection the milvus backend can hold: one model-bound dense vector (of any name) of an
    index type it builds.

    Raises:
        InvalidCollectionRequest: other vectors (``unsupported``: Milvus 2.3 has one vector field per collection and
            no sparse vectors), collection metadata (``unsupported``: not kept), or an index type it cannot build.
    """
    b = vectors.bound
    if b is None or len(vectors.dense) != 1 or vectors.sparse:
        raise InvalidCollectionRequest(
            "the milvus backend holds one vector per collection, embedded by the service's model: Milvus "
            "2.3 has one vector field per collection and no sparse vectors (use the embedded backend for named, "
            "client-supplied or sparse vectors)",
            param="vectors",
            code="unsupported",
        )
    if vectors.metadata is not None:
        raise InvalidCollectionRequest("the milvus backend keeps no collection metadata", "metadata", "unsupported")
    check_supported(b.spec.kind)
    return b


def physical_schema(dimension: int):
    """The ``pymilvus`` schema of a physical collection: the module docstring's fields, vectors of ``dimension``."""
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
    schema.add_field("key", DataType.VARCHAR, is_primary=True, max_length=MAX_KEY_BYTES)
    schema.add_field("text", DataType.VARCHAR, max_length=MAX_TEXT_BYTES)
    schema.add_field("payload", DataType.JSON)
    schema.add_field("nulls", DataType.JSON)
    schema.add_field("updated", DataType.INT64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dimension)
    return schema


def index_params(client: MilvusClient, spec: IndexSpec):
    """The ``pymilvus`` index parameters of ``spec`` on the ``vector`` field."""
    index_type, params = BUILD[spec.kind](spec.params)
    ip = client.prepare_index_params()
    ip.add_index(field_name="vector", index_type=index_type, metric_type=METRICS[spec.metric], params=params)
    return ip


def create_physical(client: MilvusClient, name: str, spec: IndexSpec, consistency: str) -> None:
    """Create (and load) the physical Milvus collection ``name`` for ``spec``."""
    client.create_collection(
        name,
        schema=physical_schema(spec.dimension),
        index_params=index_params(client, spec),
        consistency_level=consistency,
        timeout=LOAD_TIMEOUT_S,
    )  # creating and loading: not bounded by the request timeout


def search_params(spec: IndexSpec, top_k: int, ef: int | None = None) -> dict[str, Any]:
    """Milvus ``search_params`` for ``top_k`` results; ``ef``: an HNSW index's search breadth (Qdrant's
    ``hnsw_ef``; None: the index's ``ef_search``)."""
    return {"metric_type": METRICS[spec.metric], "params": SEARCH[spec.kind](spec.params, top_k, ef)}


def api_score(metric: str, distance: float) -> float:
    """The API's score: cosine/dot similarity as Milvus gives it; l2 as the Euclidean distance (Milvus reports
    its square)."""
    return float(np.sqrt(max(distance, 0.0))) if is_distance(metric) else float(distance)


def to_rows(
    keys: Sequence[str],
    texts: Sequence[str],
    payloads: Sequence[dict[str, Any] | None],
    vectors: Any,
    updated: int,
    metric: str,
    dim: int,
) -> list[dict[str, Any]]:
    """Rows of a physical collection (the fields above) for encoded ``keys``, their texts and payloads, write
    version ``updated`` and vectors float32 ``(n, dim)`` (unit-normalised here for cosine).

    Raises:
        ValueError: vector shape mismatch.
    """
    v = np.asarray(vectors, dtype=np.float32)
    if v.ndim != 2 or v.shape[1] != dim:
        raise ValueError(f"vectors must have shape (n, {dim}), got {v.shape}")
    v = normalised(v, metric)
    return [
        {"key": k, "text": t, "payload": p or {}, "nulls": payload_marks(p), "updated": updated, "vector": v[i]}
        for i, (k, t, p) in enumerate(zip(keys, texts, payloads))
    ]
