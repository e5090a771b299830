"""Qdrant's ``qdrant.Points`` gRPC service translated onto the ``/qdrant`` REST routes (:mod:`.grpc_bridge`): each
method builds the REST body of its request with qdrant-client's ``GrpcToRest`` converters, and its reply from the
REST answer with ``RestToGrpc``. Methods not listed (legacy ``Search``/``Recommend``/``Discover`` and their batches
and groups) answer ``UNIMPLEMENTED``."""

from __future__ import annotations

import asyncio
from typing import Any

from qdrant_client import grpc as g
from qdrant_client.conversions.conversion import GrpcToRest as G
from qdrant_client.conversions.conversion import RestToGrpc as R
from qdrant_client.grpc import points_service_pb2_grpc
from qdrant_client.http import models as rest

from service.http.qdrant.grpc_bridge import Bridge, dump, path

#: Qdrant's gRPC ``FieldType`` as the REST ``field_schema`` names it (index position = enum value)
FIELD_TYPES = ("keyword", "integer", "float", "geo", "text", "bool", "datetime", "uuid")
_INLINE_ROWS = 16  # answers of more rows are converted on a worker thread
_QUERY_FIELDS = (
    "prefetch",
    "query",
    "using",
    "filter",
    "params",
    "score_threshold",
    "with_payload",
    "with_vectors",
    "lookup_from",
    "limit",
    "read_consistency",
    "shard_key_selector",
)


def _opt(req: Any, field: str, convert: Any) -> Any:
    """``convert(req.field)`` when the optional field is set, else None."""
    return convert(getattr(req, field)) if req.HasField(field) else None


def _selector(req: Any, field: str) -> dict[str, Any]:
    """The REST ``{points: [...]}`` or ``{filter: ...}`` of a ``PointsSelector`` field."""
    return dump(G.convert_points_selector(getattr(req, field))) if req.HasField(field) else {}


def _body(**fields: Any) -> dict[str, Any]:
    return {k: dump(v) for k, v in fields.items() if v is not None}


def _datatype(config: Any) -> str | None:
    """The REST ``datatype`` of a vector creation config (``float32``...; unset or ``Default``: None)."""
    return g.Datatype.Name(config.datatype).lower() if config.HasField("datatype") and config.datatype else None


async def _records(rows: list[dict[str, Any]]) -> list[g.RetrievedPoint]:
    """The gRPC records of REST ones (on a worker thread past a few rows: an answer may hold megabytes)."""

    def convert() -> list[g.RetrievedPoint]:
        return [R.convert_record(rest.Record(**p)) for p in rows]

    return await asyncio.to_thread(convert) if len(rows) > _INLINE_ROWS else convert()


async def _scored(rows: list[dict[str, Any]]) -> list[g.ScoredPoint]:
    """The gRPC scored points of REST ones (on a worker thread past a few rows, as :func:`_records`)."""

    def convert() -> list[g.ScoredPoint]:
        return [R.convert_scored_point(rest.ScoredPoint(**p)) for p in rows]

    return await asyncio.to_thread(convert) if len(rows) > _INLINE_ROWS else convert()


def _operation(res: Any, t: float) -> g.PointsOperationResponse:
    return g.PointsOperationResponse(result=R.convert_update_result(rest.UpdateResult(**res)), time=t)


def _query_body(q: Any) -> dict[str, Any]:
    """The REST ``QueryRequest`` of a gRPC ``QueryPoints`` (or of the query fields of ``QueryPointGroups``)."""
    if not isinstance(q, g.QueryPoints):
        qp = g.QueryPoints(collection_name=q.collection_name)
        for f in _QUERY_FIELDS:
            if f in ("prefetch",):
                qp.prefetch.extend(q.prefetch)
            elif q.HasField(f):
                getattr(qp, f).CopyFrom(getattr(q, f)) if hasattr(getattr(q, f), "CopyFrom") else setattr(
                    qp, f, getattr(q, f)
                )
        q = qp
    return dump(G.convert_query_points(q))


class Points(points_service_pb2_grpc.PointsServicer):
    """``qdrant.Points`` over :class:`~.grpc_bridge.Bridge` (module docstring)."""

    def __init__(self, bridge: Bridge) -> None:
        self.b = bridge

    async def Upsert(self, req: g.UpsertPoints, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/Upsert`` as ``PUT /qdrant/collections/{...}/points``."""

        def body() -> dict[str, Any]:
            return _body(
                points=[G.convert_point_struct(p) for p in req.points],
                update_filter=_opt(req, "update_filter", G.convert_filter),
                update_mode=_opt(req, "update_mode", G.convert_update_mode),
                shard_key=_opt(req, "shard_key_selector", G.convert_shard_key_selector),
            )

        return _operation(*await self.b.call(ctx, "PUT", path("/collections/{}/points", req.collection_name), body))

    async def Delete(self, req: g.DeletePoints, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/Delete`` as ``POST /qdrant/collections/{...}/points/delete``."""
        url = path("/collections/{}/points/delete", req.collection_name)
        return _operation(*await self.b.call(ctx, "POST", url, lambda: _selector(req, "points")))

    async def Get(self, req: g.GetPoints, ctx: Any) -> g.GetResponse:
        """``qdrant.Points/Get`` as ``POST /qdrant/collections/{...}/points``."""

        def body() -> dict[str, Any]:
            return _body(
                ids=[G.convert_point_id(i) for i in req.ids],
                with_payload=_opt(req, "with_payload", G.convert_with_payload_selector),
                with_vector=_opt(req, "with_vectors", G.convert_with_vectors_selector),
            )

        res, t = await self.b.call(ctx, "POST", path("/collections/{}/points", req.collection_name), body)
        return g.GetResponse(result=await _records(res), time=t)

    async def UpdateVectors(self, req: g.UpdatePointVectors, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/UpdateVectors`` as ``PUT /qdrant/collections/{...}/points/vectors``."""

        def body() -> dict[str, Any]:
            return _body(
                points=[G.convert_point_vectors(p) for p in req.points],
                update_filter=_opt(req, "update_filter", G.convert_filter),
            )

        url = path("/collections/{}/points/vectors", req.collection_name)
        return _operation(*await self.b.call(ctx, "PUT", url, body))

    async def DeleteVectors(self, req: g.DeletePointVectors, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/DeleteVectors`` as ``POST /qdrant/collections/{...}/points/vectors/delete``."""
        url = path("/collections/{}/points/vectors/delete", req.collection_name)

        def body() -> dict[str, Any]:
            return {**_selector(req, "points_selector"), "vector": list(req.vectors.names)}

        return _operation(*await self.b.call(ctx, "POST", url, body))

    async def _set_payload(self, req: g.SetPayloadPoints, ctx: Any, method: str) -> g.PointsOperationResponse:
        def body() -> dict[str, Any]:
            out = {"payload": G.convert_payload(req.payload), **_selector(req, "points_selector")}
            return {**out, "key": req.key} if req.HasField("key") else out

        url = path("/collections/{}/points/payload", req.collection_name)
        return _operation(*await self.b.call(ctx, method, url, body))

    async def SetPayload(self, req: g.SetPayloadPoints, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/SetPayload`` as ``POST /qdrant/collections/{...}/points/payload``."""
        return await self._set_payload(req, ctx, "POST")

    async def OverwritePayload(self, req: g.SetPayloadPoints, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/OverwritePayload`` as ``PUT /qdrant/collections/{...}/points/payload``."""
        return await self._set_payload(req, ctx, "PUT")

    async def DeletePayload(self, req: g.DeletePayloadPoints, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/DeletePayload`` as ``POST /qdrant/collections/{...}/points/payload/delete``."""

        def body() -> dict[str, Any]:
            return {"keys": list(req.keys), **_selector(req, "points_selector")}

        url = path("/collections/{}/points/payload/delete", req.collection_name)
        return _operation(*await self.b.call(ctx, "POST", url, body))

    async def ClearPayload(self, req: g.ClearPayloadPoints, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/ClearPayload`` as ``POST /qdrant/collections/{...}/points/payload/clear``."""
        url = path("/collections/{}/points/payload/clear", req.collection_name)
        return _operation(*await self.b.call(ctx, "POST", url, lambda: _selector(req, "points")))

    async def CreateFieldIndex(self, req: g.CreateFieldIndexCollection, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/CreateFieldIndex`` as ``PUT /qdrant/collections/{...}/index``: ``field_index_params``
        (qdrant-client's ``GrpcToRest.convert_payload_schema_params``) as REST's params object, else ``field_type``
        as a type name."""
        schema: Any = FIELD_TYPES[req.field_type] if req.HasField("field_type") else None
        if req.HasField("field_index_params"):
            schema = G.convert_payload_schema_params(req.field_index_params).model_dump(mode="json", exclude_none=True)
        body = _body(field_name=req.field_name, field_schema=schema)
        return _operation(*await self.b.call(ctx, "PUT", path("/collections/{}/index", req.collection_name), body))

    async def DeleteFieldIndex(self, req: g.DeleteFieldIndexCollection, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/DeleteFieldIndex`` as ``DELETE /qdrant/collections/{...}/index/{...}``."""
        url = path("/collections/{}/index/{}", req.collection_name, req.field_name)
        return _operation(*await self.b.call(ctx, "DELETE", url))

    async def CreateVectorName(self, req: g.CreateVectorNameRequest, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/CreateVectorName`` as ``PUT /qdrant/collections/{...}/vectors/{...}`` (enum values by
        name: one the REST body does not accept is refused there, as over REST)."""
        body: dict[str, Any] = {}
        if req.HasField("dense_config"):
            d = req.dense_config
            body["dense"] = _body(
                size=d.size,
                distance=g.Distance.Name(d.distance),
                multivector_config=_opt(d, "multivector_config", G.convert_multivector_config),
                datatype=_datatype(d),
            )
        elif req.HasField("sparse_config"):
            s = req.sparse_config
            body["sparse"] = _body(
                modifier=_opt(s, "modifier", lambda m: g.Modifier.Name(m).lower()), datatype=_datatype(s)
            )
        url = path("/collections/{}/vectors/{}", req.collection_name, req.vector_name)
        return _operation(*await self.b.call(ctx, "PUT", url, body))

    async def DeleteVectorName(self, req: g.DeleteVectorNameRequest, ctx: Any) -> g.PointsOperationResponse:
        """``qdrant.Points/DeleteVectorName`` as ``DELETE /qdrant/collections/{...}/vectors/{...}``."""
        url = path("/collections/{}/vectors/{}", req.collection_name, req.vector_name)
        return _operation(*await self.b.call(ctx, "DELETE", url))

    async def Scroll(self, req: g.ScrollPoints, ctx: Any) -> g.ScrollResponse:
        """``qdrant.Points/Scroll`` as ``POST /qdrant/collections/{...}/points/scroll``."""

        def body() -> dict[str, Any]:
            return _body(
                filter=_opt(req, "filter", G.convert_filter),
                offset=_opt(req, "offset", G.convert_point_id),
                limit=req.limit if req.HasField("limit") else None,
                with_payload=_opt(req, "with_payload", G.convert_with_payload_selector),
                with_vector=_opt(req, "with_vectors", G.convert_with_vectors_selector),
                order_by=_opt(req, "order_by", G.convert_order_by),
            )

        res, t = await self.b.call(ctx, "POST", path("/collections/{}/points/scroll", req.collection_name), body)
        out = g.ScrollResponse(result=await _records(res["points"]), time=t)
        if res.get("next_page_offset") is not None:
            out.next_page_offset.CopyFrom(R.convert_extended_point_id(res["next_page_offset"]))
        return out

    async def Count(self, req: g.CountPoints, ctx: Any) -> g.CountResponse:
        """``qdrant.Points/Count`` as ``POST /qdrant/collections/{...}/points/count``."""

        def body() -> dict[str, Any]:
            return _body(
                filter=_opt(req, "filter", G.convert_filter), exact=req.exact if req.HasField("exact") else None
            )

        res, t = await self.b.call(ctx, "POST", path("/collections/{}/points/count", req.collection_name), body)
        return g.CountResponse(result=R.convert_count_result(rest.CountResult(**res)), time=t)

    async def UpdateBatch(self, req: g.UpdateBatchPoints, ctx: Any) -> g.UpdateBatchResponse:
        """``qdrant.Points/UpdateBatch`` as ``POST /qdrant/collections/{...}/points/batch``."""

        def body() -> dict[str, Any]:
            return {"operations": [G.convert_points_update_operation(op) for op in req.operations]}

        res, t = await self.b.call(ctx, "POST", path("/collections/{}/points/batch", req.collection_name), body)
        return g.UpdateBatchResponse(result=[R.convert_update_result(rest.UpdateResult(**r)) for r in res], time=t)

    async def Query(self, req: g.QueryPoints, ctx: Any) -> g.QueryResponse:
        """``qdrant.Points/Query`` as ``POST /qdrant/collections/{...}/points/query``."""
        url = path("/collections/{}/points/query", req.collection_name)
        res, t = await self.b.call(ctx, "POST", url, lambda: _query_body(req))
        return g.QueryResponse(result=await _scored(res["points"]), time=t)

    async def QueryBatch(self, req: g.QueryBatchPoints, ctx: Any) -> g.QueryBatchResponse:
        """``qdrant.Points/QueryBatch`` as ``POST /qdrant/collections/{...}/points/query/batch``."""
        url = path("/collections/{}/points/query/batch", req.collection_name)
        res, t = await self.b.call(ctx, "POST", url, lambda: {"searches": [_query_body(q) for q in req.query_points]})
        batches = [g.BatchResult(result=await _scored(r["points"])) for r in res]
        return g.QueryBatchResponse(result=batches, time=t)

    async def QueryGroups(self, req: g.QueryPointGroups, ctx: Any) -> g.QueryGroupsResponse:
        """``qdrant.Points/QueryGroups`` as ``POST /qdrant/collections/{...}/points/query/groups``."""

        def body() -> dict[str, Any]:
            return {
                **_query_body(req),
                "group_by": req.group_by,
                **_body(
                    group_size=req.group_size if req.HasField("group_size") else None,
                    with_lookup=_opt(req, "with_lookup", G.convert_with_lookup),
                ),
            }

        url = path("/collections/{}/points/query/groups", req.collection_name)
        res, t = await self.b.call(ctx, "POST", url, body)
        return g.QueryGroupsResponse(result=R.convert_groups_result(rest.GroupsResult(**res)), time=t)

    async def Facet(self, req: g.FacetCounts, ctx: Any) -> g.FacetResponse:
        """``qdrant.Points/Facet`` as ``POST /qdrant/collections/{...}/facet``."""

        def body() -> dict[str, Any]:
            return _body(
                key=req.key,
                filter=_opt(req, "filter", G.convert_filter),
                limit=req.limit if req.HasField("limit") else None,
                exact=req.exact if req.HasField("exact") else None,
            )

        res, t = await self.b.call(ctx, "POST", path("/collections/{}/facet", req.collection_name), body)
        return g.FacetResponse(hits=[R.convert_facet_value_hit(rest.FacetValueHit(**h)) for h in res["hits"]], time=t)

    async def _matrix(self, req: g.SearchMatrixPoints, ctx: Any, kind: str) -> tuple[dict[str, Any], float]:
        def body() -> dict[str, Any]:
            return _body(
                filter=_opt(req, "filter", G.convert_filter),
                using=req.using if req.HasField("using") else None,
                sample=req.sample if req.HasField("sample") else None,
                limit=req.limit if req.HasField("limit") else None,
            )

        return await self.b.call(
            ctx, "POST", path("/collections/{}/points/search/matrix/" + kind, req.collection_name), body
        )

    async def SearchMatrixPairs(self, req: g.SearchMatrixPoints, ctx: Any) -> g.SearchMatrixPairsResponse:
        """``qdrant.Points/SearchMatrixPairs`` as ``POST /qdrant/collections/{...}/points/search/matrix/pairs``."""
        res, t = await self._matrix(req, ctx, "pairs")
        return g.SearchMatrixPairsResponse(
            result=R.convert_search_matrix_pairs(rest.SearchMatrixPairsResponse(**res)), time=t
        )

    async def SearchMatrixOffsets(self, req: g.SearchMatrixPoints, ctx: Any) -> g.SearchMatrixOffsetsResponse:
        """``qdrant.Points/SearchMatrixOffsets`` as ``POST /qdrant/collections/{...}/points/search/matrix/offsets``."""
        res, t = await self._matrix(req, ctx, "offsets")
        result = R.convert_search_matrix_offsets(rest.SearchMatrixOffsetsResponse(**res))
        return g.SearchMatrixOffsetsResponse(result=result, time=t)
