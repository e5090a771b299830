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


def dense_config(
    vp: VectorParams, bind: bool, hnsw: dict[str, Any], param: str, quantization: Any = None
) -> dict[str, Any]:
    """The native config of one Qdrant ``VectorParams`` as :func:`~service.collections.schema.new_vectors_config`
    takes it (its ``hnsw_config`` over the collection's ``hnsw``: :func:`hnsw_index`; its ``quantization_config``,
    else the collection's ``quantization``: :func:`scalar_params`).

    Raises:
        InvalidCollectionRequest: a quantization other than scalar int8 or on a multivector, a multivector comparator
            other than ``max_sim``, a datatype other than float32, Manhattan.
    """
    multi = vp.multivector_config
    at_q = f"{param}.quantization_config" if vp.quantization_config is not None else "quantization_config"
    scalar = scalar_params(vp.quantization_config if vp.quantization_config is not None else quantization, at_q)
    for given, what, at in (
        (multi and scalar, "quantization of a multivector (searched exactly, without an index)", at_q),
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
    if scalar is not None:  # the same index over int8 codes, rescored from the stored originals
        index = {"index": QUANTIZED[index["index"]], "params": {**index["params"], "quantization": scalar}}
    return {"bound": bind, "size": vp.size, "metric": METRICS[vp.distance], **index}


#: the index of a vector given a scalar ``quantization_config``, by the index it would have without one
QUANTIZED = {"hnsw": "hnsw_sq", "flat": "flat_sq"}
#: Qdrant's ``hnsw_config.m`` > 0 on an exact index (the graph built) and ``m: 0`` on a graph index (no graph)
GRAPH_OF, EXACT_OF = {"flat": "hnsw"}, {"hnsw": "flat"}
SCALAR_KEYS = {"type", "quantile", "always_ram", "memory"}


def scalar_params(config: Any, param: str) -> dict[str, Any] | None:
    """The native ``quantization`` params (``{type, quantile, always_ram}``) of a Qdrant ``QuantizationConfig``
    (Qdrant API reference, schema ``ScalarQuantization``: ``{scalar: {type: int8, quantile, always_ram, memory}}``;
    ``memory`` is accepted with no effect: the codes are in RAM here); None for none (null, or ``Disabled`` in an
    update).

    Raises:
        InvalidCollectionRequest: product or binary quantization (``unsupported``), another type than int8, an
            unknown key, a value that is not an object.
    """
    if config is None or config == "Disabled":
        return None
    if isinstance(config, dict) and set(config) & {"product", "binary"}:
        raise unsupported(f"{sorted(set(config) & {'product', 'binary'})[0]} quantization", param)
    scalar = config.get("scalar") if isinstance(config, dict) and set(config) == {"scalar"} else None
    if not isinstance(scalar, dict):
        raise InvalidCollectionRequest(f"{param} must be {{scalar: {{type: int8, ...}}}}", param=param)
    if unknown := set(scalar) - SCALAR_KEYS:
        raise InvalidCollectionRequest(f"{param}.scalar: unknown fields {sorted(unknown)}", param=param)
    if scalar.get("type") != "int8":
        raise unsupported(f"the scalar quantization type {scalar.get('type')!r} (int8 only)", f"{param}.scalar.type")
    out = {k: scalar.get(k) for k in ("type", "quantile", "always_ram")}
    if isinstance(q := out["quantile"], float):  # gRPC carries it as a float32: 0.99 -> 0.9900000095...
        out["quantile"] = round(q, 6)
    return out


def requantized(info: dict[str, Any], scalars: dict[str, dict[str, Any] | None]) -> dict[str, tuple[str, dict]]:
    """``{name: (index kind, params)}``: each dense vector of a collection's native ``info`` named in ``scalars``
    given that scalar quantization (:func:`scalar_params`; None: none), as :func:`dense_config` would have made it
    (``hnsw`` <-> ``hnsw_sq``, ``flat`` <-> ``flat_sq``; the graph params kept, the quantization and its training
    params dropped with it).

    Raises:
        InvalidCollectionRequest: quantization of an index that has no quantized form here (``unsupported``).
    """
    dense, out = info["vectors"]["dense"], {}
    plain = {v: k for k, v in QUANTIZED.items()}
    for name, scalar in scalars.items():
        if name not in dense:
            raise InvalidCollectionRequest(
                f"the collection has no dense vector {name!r}", "vectors", "vector_not_found"
            )
        kind, params = dense[name]["index"], dict(dense[name]["params"])
        base = plain.get(kind, kind)
        at = f"vectors.{name}.quantization_config" if name else "quantization_config"
        if scalar is not None and base not in QUANTIZED:
            raise unsupported(f"quantization of a {kind} index", at)
        if scalar is None:
            out[name] = (base, {k: v for k, v in params.items() if k not in {"quantization", *SQ_TRAINING_KEYS}})
        else:
            out[name] = (QUANTIZED[base], {**params, "quantization": scalar})
    return out


def regraphed(current: dict[str, tuple[str, dict]], graphs: dict[str, dict[str, Any]]) -> dict[str, tuple[str, dict]]:
    """``current`` (``{name: (index kind, params)}``) with each vector named in ``graphs`` given that Qdrant
    ``hnsw_config``'s ``m``/``ef_construct`` (Qdrant API reference, "Update collection parameters": the graph is
    rebuilt): an ``hnsw``/``hnsw_sq`` index takes ``M``/``ef_construction``; ``m: 0`` (Qdrant's "no HNSW graph")
    makes it ``flat``/``flat_sq`` (the quantization kept); ``m`` > 0 on a ``flat``/``flat_sq`` index builds the graph.

    Raises:
        InvalidCollectionRequest: ``m``/``ef_construct`` for an index that has no graph form here (``unsupported``).
    """
    out, plain = dict(current), {v: k for k, v in QUANTIZED.items()}
    names = {"m": "M", "ef_construct": "ef_construction"}
    for name, hnsw in graphs.items():
        kind, params = out[name]
        base, quantized = plain.get(kind, kind), kind in plain
        at = f"vectors.{name}.hnsw_config" if name else "hnsw_config"
        if base not in QUANTIZED:
            raise unsupported(f"hnsw_config m/ef_construct of a {kind} index", at)
        graph = {names[k]: v for k, v in hnsw.items() if k in names and v is not None}
        if graph.get("M") == 0:  # no graph: the exact index (the quantization kept)
            base = EXACT_OF.get(base, base)
            params = {k: v for k, v in params.items() if k in {"quantization", *SQ_TRAINING_KEYS}}
        elif (graph.get("M") or 0) > 0 and base in GRAPH_OF:  # an exact index given a graph
            base, params = GRAPH_OF[base], {**params, **graph}
        elif base in EXACT_OF:  # a graph index: its params changed
            params = {**params, **graph}
        out[name] = (QUANTIZED[base] if quantized else base, params)
    return out


#: the training params a quantized index adds to its plain form's
SQ_TRAINING_KEYS = {"min_train_points", "train_sample"}


def quantization_of(info: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any] | None]]:
    """``(collection's, {indexed dense vector's name: its})`` Qdrant ``quantization_config`` of a collection's native
    info (None: none); the collection's is the vectors' when they all have the same one, else None."""
    dense = (info.get("vectors") or {}).get("dense") or {}
    each = {n: (v.get("params") or {}).get("quantization") for n, v in dense.items() if not v.get("multivector")}
    each = {n: {"scalar": q} if q else None for n, q in each.items()}
    common = next(iter(each.values())) if each and all(q == next(iter(each.values())) for q in each.values()) else None
    return common, each


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
    common, quantized = quantization_of(info)
    dense = {
        n: {
            "size": v["dimension"],
            "distance": DISTANCES[v["metric"]],
            **({"multivector_config": {"comparator": "max_sim"}} if v.get("multivector") else {}),
            **({"quantization_config": quantized[n]} if quantized.get(n) not in (None, common) else {}),
        }
        for n, v in vectors["dense"].items()
    }
    sparse = {n: ({"modifier": "idf"} if v["modifier"] == "idf" else {}) for n, v in vectors.get("sparse", {}).items()}
    return (dense[""] if set(dense) == {""} else dense), sparse
