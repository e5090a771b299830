"""Collections through Qdrant's API, translated onto ``CollectionService``.

Qdrant API reference (https://api.qdrant.tech/api-reference), section "Collections" and "Service":

* ``GET /`` (root): name and version of the API (qdrant-client checks compatibility with it);
* ``GET /collections``, ``GET /collections/{collection_name}``, ``GET /collections/{collection_name}/exists``;
* ``PUT /collections/{collection_name}`` (create), ``DELETE /collections/{collection_name}``;
* ``PATCH /collections/{collection_name}`` (update): the storage and cluster settings a creation ignores are accepted
  with no effect (``optimizers_config``, as in Qdrant's bulk-upload recipe that turns indexing off and on,
  ``params``, ``strict_mode_config``, ``on_disk``, the HNSW keys other than ``m``/``ef_construct``, a
  ``quantization_config`` equal to the vector's); another ``quantization_config`` (scalar int8, or ``Disabled``;
  the collection's, for every indexed dense vector, or a vector's) or another ``m``/``ef_construct`` (the
  collection's ``hnsw_config`` or a vector's; :func:`~service.http.qdrant.vectors.regraphed`) is recorded at once
  and the vector's index rebuilt from the stored vectors in the background (:mod:`service.collections.index_change`:
  ``status`` yellow until then, searches answered from the old index meanwhile); refused with 422: sparse vectors; ``metadata`` is merged into the collection's (a key given replaces the one kept, a key given as null is removed);
* ``PUT /collections/{collection_name}/index`` (create a payload index: ``{field_name, field_schema}``, the schema a
  type name or a ``*IndexParams`` object; :mod:`service.collections.payload_indexes`) and ``DELETE
  .../index/{field_name}`` (delete one): built (``wait`` or not: answered once built) and reported in
  ``payload_schema`` (``{data_type, params?, points}``); filters on the key read it, answering as without it. ``geo``
  is refused (422); the milvus backend accepts them with no effect and reports none;
* ``PUT /collections/{collection_name}/vectors/{vector_name}`` (create vector name: ``{dense: {size, distance,
  multivector_config}}`` or ``{sparse: {modifier}}``) and ``DELETE`` on the same path (delete vector name): a named
  vector added to or deleted from the collection (:mod:`service.collections.vector_names`: the points stored hold no
  value of a vector added; a vector deleted loses its values; the model-bound one cannot be deleted).

A collection holds named vectors (:mod:`.vectors`; the data model is the collections core's,
:mod:`service.collections.schema`). Creation maps ``vectors`` (one unnamed ``{size, distance}``, or ``{name: {size,
distance}}``) -> dense vectors: ``Cosine`` cosine, ``Dot`` dot, ``Euclid`` l2; the first of the active model's
dimension is bound to the model (``Document`` texts embedded here, re-embedded on a model switch; its record: the
native ``GET /collections/{name}``'s ``model``), every other is client-supplied (any size). ``metadata`` (a JSON
object) is kept with the collection and answered as given in ``config.metadata`` (null when none was given). ``hnsw_config`` (the collection's,
then each vector's) -> an ``hnsw`` index (``m`` -> ``M``, ``ef_construct`` -> ``ef_construction``; ``m: 0``,
Qdrant's "no HNSW graph", -> an exact ``flat`` index). ``quantization_config: {scalar: {type: int8, quantile,
always_ram}}`` (the collection's, or a vector's over it) -> the same index over int8 codes, ``hnsw_sq`` or ``flat_sq``
(:mod:`service.collections.index.flat_sq`: codes in RAM, originals in the store, rescored; answered in the info's
``quantization_config``). ``sparse_vectors: {name: {modifier}}`` -> sparse vectors
(``idf`` or none; searched exactly), multivectors (``multivector_config`` with ``max_sim``: client-supplied, searched
exactly). Refused with 422: product and binary quantization, a datatype other than float32,
the Manhattan distance, ``init_from``, custom sharding; on the milvus backend, anything but one model-bound vector
(Milvus 2.3's limit). Cluster tuning (shards, replication, WAL, optimizers, on-disk flags) is accepted and has no
effect. IVF-PQ has no Qdrant equivalent: create it through the native API; it is then usable here.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from service.collections.errors import CollectionNotFound, InvalidCollectionRequest
from service.http.kit import JSONRoute, json_response
from service.http.qdrant.envelope import API_VERSION, PREFIX, WRITES, Service, ok, unsupported, update_result
from service.http.qdrant.models import (
    CreateCollection,
    CreateFieldIndex,
    UpdateCollection,
    VectorNameConfig,
    VectorParams,
)
from service.http.qdrant.vectors import (
    HNSW_IGNORED,
    dense_config,
    params_of,
    quantization_of,
    regraphed,
    requantized,
    scalar_params,
)

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)


def collection_spec(body: CreateCollection, dimension: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(dense, sparse)`` vector configs of a Qdrant ``CreateCollection`` (:mod:`.vectors`): the first dense vector
    whose ``size`` is ``dimension`` (the active model's) is bound to the model.

    Raises:
        InvalidCollectionRequest: a setting that does not map (see the module docstring).
    """
    for given, what, param in (
        (body.init_from, "init_from", "init_from"),
        (body.sharding_method not in (None, "auto"), "custom sharding", "sharding_method"),
    ):
        if given:
            raise unsupported(what, param)
    given = body.vectors if isinstance(body.vectors, dict) else {"": body.vectors} if body.vectors else {}
    dense: dict[str, Any] = {}
    bound = next((n for n, vp in given.items() if vp.size == dimension and not vp.multivector_config), None)
    for name, vp in given.items():
        at = f"vectors.{name}" if name else "vectors"
        dense[name] = dense_config(vp, name == bound, body.hnsw_config or {}, at, body.quantization_config)
    sparse = {n: {"modifier": p.modifier or "none"} for n, p in (body.sparse_vectors or {}).items()}
    return dense, sparse


#: index types that search by a full scan (of floats or of int8 codes): Qdrant's "plain" index, not counted as indexed
FULL_SCAN_KINDS = ("flat", "flat_sq")


def indexed_vectors(info: dict[str, Any]) -> int:
    """Qdrant's ``indexed_vectors_count`` ("vectors stored in a specialized vector index") of a collection's native
    info: summed over its vectors, the live vectors in a trained ANN index (HNSW, IVF; not a flat index, a multivector
    scan, or an IVF index still on its exact fallback), plus the sparse vectors held (each in an inverted index)."""
    vectors = info.get("vectors") or {"dense": {"": {"index": info["index"]["type"]}}}
    n = 0
    for v in (vectors.get("dense") or {}).values():
        if v.get("multivector") or v.get("index") in FULL_SCAN_KINDS:
            continue
        if "trained" in v:  # a client-supplied vector's index
            n += v.get("vectors", 0) if v["trained"] else 0
        elif (idx := info["index"]).get("trained"):  # the model-bound one
            n += idx.get("vectors", 0) - idx.get("tombstones", 0)
    return n + sum(v.get("points", 0) for v in (vectors.get("sparse") or {}).values())


def collection_info(info: dict[str, Any]) -> dict[str, Any]:
    """Qdrant's ``CollectionInfo`` of a collection's native info (``GET /collections/{name}``)."""
    dense = (info.get("vectors") or {}).get("dense") or {}
    first = dense.get("") or next(iter(dense.values()), None)  # the graph's params as they are now (PATCH rebuilds)
    params, n = (first or info["index"])["params"], info["count"]
    running = (info.get("reembedding") or {}).get("state") == "running" or bool(info.get("indexing"))
    vectors, sparse = params_of(info)
    return {
        "status": "yellow" if running else "green",  # yellow: re-embedded, or an index trained or rebuilt (optimised)
        "optimizer_status": "ok",
        "indexed_vectors_count": indexed_vectors(info),
        "points_count": n,
        "segments_count": 1,
        "config": {
            "params": {
                "vectors": vectors,
                **({"sparse_vectors": sparse} if sparse else {}),
                "shard_number": 1,
                "replication_factor": 1,
                "write_consistency_factor": 1,
                "on_disk_payload": True,
            },
            "hnsw_config": {
                "m": params.get("M", 0),
                "ef_construct": params.get("ef_construction", 100),
                "full_scan_threshold": 10000,
            },
            "optimizer_config": {
                "deleted_threshold": 0.2,
                "vacuum_min_vector_number": 1000,
                "default_segment_number": 1,
                "flush_interval_sec": 5,
            },
            "wal_config": {"wal_capacity_mb": 32, "wal_segments_ahead": 0},
            "quantization_config": quantization_of(info)[0],
            "metadata": (info.get("vectors") or {}).get("metadata"),
        },
        "payload_schema": info.get("payload_indexes") or {},
    }


@router.get("")
async def root() -> Response:
    """Qdrant API reference: ``GET /`` (root): ``{title, version}`` (not enveloped, as in Qdrant)."""
    return json_response({"title": "qdrant - vector search engine", "version": API_VERSION, "commit": None})


async def _root_slash(request: Request) -> Response:
    return await root()


# qdrant-client's info() asks for the prefix with a trailing slash: the same answer, not a redirect (a plain route:
# the documented operation is the one above)
router.add_route(PREFIX + "/", _root_slash, methods=["GET"], include_in_schema=False)


@router.get("/collections")
async def list_collections(request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``GET /collections`` -> ``{collections: [{name}]}``."""
    names = [c.name for c in svc.backend.list()]
    return ok(request, {"collections": [{"name": n} for n in names]})


@router.put("/collections/{collection_name}", dependencies=WRITES)
async def create_collection(collection_name: str, body: CreateCollection, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``PUT /collections/{collection_name}`` -> ``true``. Errors: 409 exists, 422 a setting
    that does not map (module docstring)."""
    dense, sparse = collection_spec(body, svc.active_model().dimension)
    await svc.create(collection_name, dense=dense, sparse=sparse, metadata=body.metadata)
    return ok(request, True)


@router.patch("/collections/{collection_name}", dependencies=WRITES)
async def update_collection(collection_name: str, body: UpdateCollection, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``PATCH /collections/{collection_name}`` -> ``true`` (module docstring: what is accepted
    with no effect and what is refused). Errors: 404, 422."""
    info = await svc.info(collection_name)
    _, each = quantization_of(info)
    hnsw = dict(body.hnsw_config or {})
    asked = dict.fromkeys(each, body.quantization_config) if body.quantization_config is not None else {}
    graph_keys = {"m", "ef_construct"}
    graphs = dict.fromkeys(each, {k: hnsw[k] for k in graph_keys & set(hnsw)}) if graph_keys & set(hnsw) else {}
    for name, diff in (body.vectors or {}).items():
        if unknown := set(diff) - {"hnsw_config", "quantization_config", "on_disk", "memory"}:
            raise InvalidCollectionRequest(f"vectors.{name}: unknown fields {sorted(unknown)}", param="vectors")
        own = dict(diff.get("hnsw_config") or {})
        if unknown := set(own) - HNSW_IGNORED - graph_keys:
            raise InvalidCollectionRequest(f"vectors.{name}.hnsw_config: unknown fields {sorted(unknown)}", "vectors")
        if graph_keys & set(own):
            graphs[name] = {**graphs.get(name, {}), **{k: own[k] for k in graph_keys & set(own)}}
        if diff.get("quantization_config") is not None:
            asked[name] = diff["quantization_config"]
    kept = lambda q: q and (q["type"], q["quantile"])  # noqa: E731 (always_ram: no effect here)
    changed = {
        n: scalar_params(c, "quantization_config")
        for n, c in asked.items()
        if kept(scalar_params(c, "quantization_config")) != kept((each.get(n) or {}).get("scalar"))
    }
    if body.sparse_vectors:
        raise unsupported("sparse vectors", "sparse_vectors")
    if unknown := set(hnsw) - HNSW_IGNORED - graph_keys:
        raise InvalidCollectionRequest(f"hnsw_config: unknown fields {sorted(unknown)}", param="hnsw_config")
    if changed or graphs:  # rebuilt in the background (status yellow meanwhile), as Qdrant does
        dense = info["vectors"]["dense"]
        current = {n: (v["index"], dict(v["params"])) for n, v in dense.items() if n in {*changed, *graphs}}
        if missing := set(graphs) - set(dense):
            missing_name = sorted(missing)[0]
            raise InvalidCollectionRequest(f"no dense vector {missing_name!r}", "vectors", "vector_not_found")
        await svc.change_indexes(collection_name, regraphed({**current, **requantized(info, changed)}, graphs))
    if (update := body.metadata) is not None:
        await svc.backend.update_vectors(collection_name, lambda cfg: cfg.with_metadata(update))
    return ok(request, True)


@router.get("/collections/{collection_name}")
async def get_collection(collection_name: str, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``GET /collections/{collection_name}`` -> ``CollectionInfo``. Errors: 404."""
    return ok(request, collection_info(await svc.info(collection_name)))


@router.get("/collections/{collection_name}/exists")
async def collection_exists(collection_name: str, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``GET /collections/{collection_name}/exists`` -> ``{exists}``."""
    try:
        await svc.collection(collection_name)
    except CollectionNotFound:
        return ok(request, {"exists": False})
    return ok(request, {"exists": True})


@router.delete("/collections/{collection_name}", dependencies=WRITES)
async def delete_collection(collection_name: str, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``DELETE /collections/{collection_name}`` -> ``true`` (Qdrant answers ``false`` for
    a missing collection; so does this)."""
    try:
        await svc.backend.delete(collection_name)
    except CollectionNotFound:
        return ok(request, False)
    return ok(request, True)


@router.put("/collections/{collection_name}/index", dependencies=WRITES)
async def create_field_index(collection_name: str, body: CreateFieldIndex, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``PUT /collections/{collection_name}/index`` -> ``UpdateResult``: the index of
    ``field_name`` by ``field_schema`` built (module docstring). Errors: 404; 422 a bad key or schema, ``geo``."""
    await svc.create_payload_index(collection_name, body.field_name, body.field_schema)
    return ok(request, update_result(0))


@router.delete("/collections/{collection_name}/index/{field_name}", dependencies=WRITES)
async def delete_field_index(collection_name: str, field_name: str, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``DELETE /collections/{collection_name}/index/{field_name}`` -> ``UpdateResult``: the
    index of ``field_name`` dropped (none: nothing changes; the key stays filterable). Errors: 404."""
    await svc.delete_payload_index(collection_name, field_name)
    return ok(request, update_result(0))


@router.put("/collections/{collection_name}/vectors/{vector_name}", dependencies=WRITES)
async def create_vector(
    collection_name: str, vector_name: str, body: VectorNameConfig, request: Request, svc: Service
) -> Response:
    """Qdrant API reference: ``PUT /collections/{collection_name}/vectors/{vector_name}`` (create vector name) ->
    ``UpdateResult``: the dense (client-supplied; an ``hnsw`` index, or MAX_SIM scanned for a multivector) or sparse
    vector added, none of the stored points holding it (module docstring). Errors: 404; 422 exactly one of ``dense``
    and ``sparse`` not given, the name taken by a vector of another definition, a setting that does not map, any
    change on the milvus backend."""
    dense = sparse = None
    if body.dense is not None:
        vp = VectorParams(**body.dense.model_dump(exclude_none=True))
        dense = dense_config(vp, False, {}, "dense")  # an hnsw index, as Qdrant builds by default
    if body.sparse is not None:
        if body.sparse.datatype not in (None, "float32"):
            raise unsupported(f"the sparse vector datatype {body.sparse.datatype!r}", "sparse.datatype")
        sparse = {"modifier": body.sparse.modifier or "none"}
    await svc.create_vector_name(collection_name, vector_name, dense, sparse)
    return ok(request, update_result(0))


@router.delete("/collections/{collection_name}/vectors/{vector_name}", dependencies=WRITES)
async def delete_vector(collection_name: str, vector_name: str, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``DELETE /collections/{collection_name}/vectors/{vector_name}`` (delete vector name) ->
    ``UpdateResult``: the vector and every stored value of it dropped; a name the collection lacks changes nothing.
    Errors: 404; 422 the model-bound vector, the unnamed vector when it is the only dense one, any change on the
    milvus backend."""
    await svc.delete_vector_name(collection_name, vector_name)
    return ok(request, update_result(0))
