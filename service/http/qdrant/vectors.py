"""Qdrant's vector shapes translated onto the collections' named vectors (:mod:`service.collections.schema`), both
ways (Qdrant API reference, schemas ``VectorStruct``, ``VectorParams``, ``SparseVectorParams``, ``WithVector``):

* creation: ``vectors`` (one unnamed ``VectorParams``, or ``{name: VectorParams}``) and ``sparse_vectors`` ->
  dense and sparse vector configs; the first dense vector whose ``size`` is the active model's dimension is bound to
  the model (``Document`` texts are embedded here and follow a model switch), every other one is client-supplied;
* a point's ``vector`` (floats or a ``Document``: the unnamed vector ``""``; ``{name: floats | Document |
  SparseVector}``) -> its text, its model-bound vector and its other named vectors;
* a stored point -> the ``vector`` Qdrant answers: ``{name: floats | {indices, values}}`` of the vectors the point
  holds among those wanted (``with_vector``: true, or the names), the value alone when that is the unnamed vector
  only, ``{}`` when it holds none of them.
"""

from __future__ import annotations

from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.schema import VectorsConfig
from service.http.qdrant.envelope import unsupported
from service.http.qdrant.models import Document, SparseVector, VectorParams

METRICS = {"Cosine": "cosine", "Dot": "dot", "Euclid": "l2"}
DISTANCES = {v: k for k, v in METRICS.items()}


def dense_config(vp: VectorParams, bind: bool, hnsw: dict[str, Any], param: str) -> dict[str, Any]:
    """The native config of one Qdrant ``VectorParams`` as :func:`~service.collections.schema.new_vectors_config`
    takes it (its ``hnsw_config`` over the collection's ``hnsw``: :func:`hnsw_index`).

    Raises:
        InvalidCollectionRequest: quantization, a multivector comparator other than ``max_sim``, a datatype other
            than float32, Manhattan.
    """
    multi = vp.multivector_config
    for given, what, at in (
        (vp.quantization_config, "quantization", f"{param}.quantization_config"),
        (
            multi and (not isinstance(multi, dict) or multi.get("comparator") != "max_sim"),
            "a multivector comparator other than max_sim",
            f"{param}.multivector_config",
        ),
        (vp.datatype not in (None, "float32"), f"the vector datatype {vp.datatype!r}", f"{param}.datatype"),
    ):
        if given:
            raise unsupported(what, at)
    if vp.distance not in METRICS:
        raise unsupported(f"the {vp.distance} distance", f"{param}.distance")
    if multi:  # searched exactly by MAX_SIM: no index
        return {"bound": False, "size": vp.size, "metric": METRICS[vp.distance], "multivector": True}
    index = hnsw_index({**hnsw, **(vp.hnsw_config or {})}, param)
    return {"bound": bind, "size": vp.size, "metric": METRICS[vp.distance], **index}


HNSW_IGNORED = {"full_scan_threshold", "max_indexing_threads", "on_disk", "payload_m", "inline_storage", "memory"}


def hnsw_index(hnsw: dict[str, Any], param: str) -> dict[str, Any]:
    """``{index, params}`` of a Qdrant ``hnsw_config`` (an ``hnsw`` index, as Qdrant builds by default; ``m`` -> ``M``,
    ``ef_construct`` -> ``ef_construction``; ``m: 0``, Qdrant's "no HNSW graph", -> an exact ``flat`` index).

    Raises:
        InvalidCollectionRequest: an unknown key.
    """
    if unknown := set(hnsw) - HNSW_IGNORED - {"m", "ef_construct"}:
        raise InvalidCollectionRequest(f"hnsw_config: unknown fields {sorted(unknown)}", param="hnsw_config")
    if hnsw.get("m") == 0:
        return {"index": "flat", "params": {}}
    names = {"m": "M", "ef_construct": "ef_construction"}
    return {"index": "hnsw", "params": {names[k]: v for k, v in hnsw.items() if k in names and v is not None}}


def point_parts(
    v: Any, cfg: VectorsConfig, model: dict[str, Any] | None, check_model: Any, collection: str, param: str
) -> tuple[str, list[float] | None, dict[str, Any]]:
    """A point's Qdrant ``vector`` as ``(text, model-bound vector or None, {name: floats | {indices, values}})``.

    Args:
        check_model: ``(Document, model, collection, param) -> text``, raising when the document names another model.

    Raises:
        InvalidCollectionRequest: a name the collection lacks (``vector_not_found``), a ``Document`` for a vector
            that is not model-bound, a sparse vector for a dense one or the reverse.
    """
    named_in = v if isinstance(v, dict) else {"": v}
    text, bound_vec, named = "", None, {}
    b = cfg.bound
    for name, x in named_in.items():
        at = f"{param}.{name}" if isinstance(v, dict) else param
        kind = cfg.kind_of(name, at)
        if b is not None and name == b.name:
            if isinstance(x, SparseVector):
                raise InvalidCollectionRequest(f"{at}: {name!r} is a dense vector", at)
            if isinstance(x, Document):
                text = check_model(x, model, collection, at)
            else:
                bound_vec = x
        elif isinstance(x, Document) and kind == "sparse":  # a server-side sparse model makes it (qdrant/bm25)
            if x.options:
                raise unsupported("Document.options", f"{at}.options")
            named[name] = {"text": x.text, "model": x.model}
        elif isinstance(x, Document):
            raise InvalidCollectionRequest(
                f"{at}: the vector {name!r} is supplied by the client (no model is bound to it): send the vector", at
            )
        elif (kind == "sparse") != isinstance(x, SparseVector):
            raise InvalidCollectionRequest(f"{at}: {name!r} is a {kind} vector", at)
        else:
            named[name] = x.model_dump() if isinstance(x, SparseVector) else x
    return text, bound_vec, named


def all_vectors(point: dict[str, Any], cfg: VectorsConfig) -> dict[str, Any]:
    """``{name: floats | {indices, values}}``: every vector a stored point (read with its vectors) holds."""
    out = dict(point.get("vectors") or {})
    if (b := cfg.bound) is not None and point.get("vector") is not None:
        out[b.name] = point["vector"]
    return out


def shown(point: dict[str, Any] | None, sel: Any, cfg: VectorsConfig) -> Any:
    """The ``vector`` of Qdrant's ``Record``/``ScoredPoint`` as ``with_vector`` (``sel``) asks (None: not asked): the
    vectors asked for that the point holds, ``{name: value}``, or the bare value when that is the unnamed vector
    alone (Qdrant answers a single default vector unnamed, and ``{}`` for a point holding none of them, as
    qdrant-client's local mode does)."""
    if not sel or point is None:
        return None
    have = all_vectors(point, cfg)
    out = have if sel is True else {n: have[n] for n in sel if n in have}
    return out[""] if set(out) == {""} else out


def params_of(info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(vectors, sparse_vectors)`` of Qdrant's ``CollectionParams`` from a collection's native info."""
    vectors = info.get("vectors") or {"dense": {"": {"dimension": info["dimension"], "metric": info["metric"]}}}
    dense = {
        n: {
            "size": v["dimension"],
            "distance": DISTANCES[v["metric"]],
            **({"multivector_config": {"comparator": "max_sim"}} if v.get("multivector") else {}),
        }
        for n, v in vectors["dense"].items()
    }
    sparse = {n: ({"modifier": "idf"} if v["modifier"] == "idf" else {}) for n, v in vectors.get("sparse", {}).items()}
    return (dense[""] if set(dense) == {""} else dense), sparse
