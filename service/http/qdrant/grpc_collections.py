"""Qdrant's ``qdrant.Collections`` and ``qdrant.Qdrant`` (health check) gRPC services translated onto the ``/qdrant``
REST routes (:mod:`.grpc_bridge`). Cluster and shard-key methods answer ``UNIMPLEMENTED`` (one node, no custom
sharding), as their REST routes are not served."""

from __future__ import annotations

import json
from typing import Any

from qdrant_client import grpc as g
from qdrant_client.conversions.conversion import GrpcToRest as G
from qdrant_client.conversions.conversion import RestToGrpc as R
from qdrant_client.grpc import collections_service_pb2_grpc, qdrant_pb2_grpc
from qdrant_client.http import models as rest

from service.http.qdrant.collections import root
from service.http.qdrant.grpc_bridge import Bridge, dump, path

#: fields of a gRPC ``CreateCollection`` and how each becomes the REST body's field
_CREATE = {
    "vectors_config": ("vectors", G.convert_vectors_config),
    "sparse_vectors_config": ("sparse_vectors", G.convert_sparse_vector_config),
    "hnsw_config": ("hnsw_config", G.convert_hnsw_config_diff),
    "wal_config": ("wal_config", G.convert_wal_config_diff),
    "optimizers_config": ("optimizers_config", G.convert_optimizers_config_diff),
    "quantization_config": ("quantization_config", G.convert_quantization_config),
    "strict_mode_config": ("strict_mode_config", G.convert_strict_mode_config),
    "sharding_method": ("sharding_method", G.convert_sharding_method),
    "shard_number": ("shard_number", int),
    "replication_factor": ("replication_factor", int),
    "write_consistency_factor": ("write_consistency_factor", int),
    "on_disk_payload": ("on_disk_payload", bool),
}


def _done(res: Any, t: float) -> g.CollectionOperationResponse:
    return g.CollectionOperationResponse(result=bool(res), time=t)


class Collections(collections_service_pb2_grpc.CollectionsServicer):
    """``qdrant.Collections`` over :class:`~.grpc_bridge.Bridge` (module docstring)."""

    def __init__(self, bridge: Bridge) -> None:
        self.b = bridge

    async def Get(self, req: g.GetCollectionInfoRequest, ctx: Any) -> g.GetCollectionInfoResponse:
        """``qdrant.Collections/Get`` as ``GET /qdrant/collections/{...}``."""
        res, t = await self.b.call(ctx, "GET", path("/collections/{}", req.collection_name))
        return g.GetCollectionInfoResponse(result=R.convert_collection_info(rest.CollectionInfo(**res)), time=t)

    async def List(self, req: g.ListCollectionsRequest, ctx: Any) -> g.ListCollectionsResponse:
        """``qdrant.Collections/List`` as ``GET /qdrant/collections``."""
        res, t = await self.b.call(ctx, "GET", path("/collections"))
        names = [g.CollectionDescription(name=c["name"]) for c in res["collections"]]
        return g.ListCollectionsResponse(collections=names, time=t)

    async def Create(self, req: g.CreateCollection, ctx: Any) -> g.CollectionOperationResponse:
        """``qdrant.Collections/Create`` as ``PUT /qdrant/collections/{...}``."""

        def body() -> dict[str, Any]:
            out = {n: dump(convert(getattr(req, f))) for f, (n, convert) in _CREATE.items() if req.HasField(f)}
            return {**out, "metadata": G.convert_payload(req.metadata)} if req.metadata else out

        return _done(*await self.b.call(ctx, "PUT", path("/collections/{}", req.collection_name), body))

    async def Update(self, req: g.UpdateCollection, ctx: Any) -> g.CollectionOperationResponse:
        """``qdrant.Collections/Update`` as ``PATCH /qdrant/collections/{...}``."""

        def body() -> Any:
            return G.convert_update_collection(req)

        return _done(*await self.b.call(ctx, "PATCH", path("/collections/{}", req.collection_name), body))

    async def Delete(self, req: g.DeleteCollection, ctx: Any) -> g.CollectionOperationResponse:
        """``qdrant.Collections/Delete`` as ``DELETE /qdrant/collections/{...}``."""
        return _done(*await self.b.call(ctx, "DELETE", path("/collections/{}", req.collection_name)))

    async def UpdateAliases(self, req: g.ChangeAliases, ctx: Any) -> g.CollectionOperationResponse:
        """``qdrant.Collections/UpdateAliases`` as ``POST /qdrant/collections/aliases``."""

        def body() -> dict[str, Any]:
            return {"actions": [G.convert_alias_operations(a) for a in req.actions]}

        return _done(*await self.b.call(ctx, "POST", path("/collections/aliases"), body))

    async def _aliases(self, ctx: Any, url: str) -> g.ListAliasesResponse:
        res, t = await self.b.call(ctx, "GET", url)
        return g.ListAliasesResponse(
            aliases=[R.convert_alias_description(rest.AliasDescription(**a)) for a in res["aliases"]], time=t
        )

    async def ListCollectionAliases(self, req: g.ListCollectionAliasesRequest, ctx: Any) -> g.ListAliasesResponse:
        """``qdrant.Collections/ListCollectionAliases`` as ``GET /qdrant/collections/{...}/aliases``."""
        return await self._aliases(ctx, path("/collections/{}/aliases", req.collection_name))

    async def ListAliases(self, req: g.ListAliasesRequest, ctx: Any) -> g.ListAliasesResponse:
        """``qdrant.Collections/ListAliases`` as ``GET /qdrant/aliases``."""
        return await self._aliases(ctx, path("/aliases"))

    async def CollectionExists(self, req: g.CollectionExistsRequest, ctx: Any) -> g.CollectionExistsResponse:
        """``qdrant.Collections/CollectionExists`` as ``GET /qdrant/collections/{...}/exists``."""
        res, t = await self.b.call(ctx, "GET", path("/collections/{}/exists", req.collection_name))
        return g.CollectionExistsResponse(result=g.CollectionExists(exists=bool(res["exists"])), time=t)


class Health(qdrant_pb2_grpc.QdrantServicer):
    """``qdrant.Qdrant``'s ``HealthCheck``: the title and version ``GET /qdrant/`` answers, without an API key (Qdrant
    exempts its health checks from authentication)."""

    async def HealthCheck(self, req: g.HealthCheckRequest, ctx: Any) -> g.HealthCheckReply:
        """``qdrant.Qdrant/HealthCheck``: the answer of ``GET /qdrant/`` (the route's own function: open, unlike
        the route under an API key)."""
        info = json.loads(bytes((await root()).body))
        return R.convert_health_check_reply(rest.VersionInfo(title=info["title"], version=info["version"]))
