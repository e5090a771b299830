"""A Qdrant-compatible REST surface over the collections, under :data:`~.envelope.PREFIX` (``/qdrant``): unchanged
Qdrant clients (qdrant-client over REST, LangChain's ``QdrantVectorStore``, LlamaIndex's ``QdrantVectorStore``)
create collections, upsert points (vectors, or ``Document`` texts embedded here), query, scroll, count and delete.

A translation layer only: every route calls ``service.collections.CollectionService`` (storage, filters and search
are the collections', on either backend); the native ``/collections`` API is unchanged. Modules:

* :mod:`.envelope`: Qdrant's ``{result, status, time}`` envelope and ``{status: {error}, time}`` error shape;
* :mod:`.ids`: Qdrant point ids (unsigned integers, UUIDs) onto the collections' ids;
* :mod:`.filters`: Qdrant filters onto the collections' filter grammar;
* :mod:`.models`: request bodies; :mod:`.results`: ``Record`` and ``ScoredPoint``;
* :mod:`.collections`, :mod:`.points`, :mod:`.batch`, :mod:`.query`, :mod:`.groups`, :mod:`.facet`, :mod:`.snapshots`, :mod:`.aliases`: the routes, each citing the Qdrant API
  reference route it follows (https://api.qdrant.tech/api-reference).

Clients: ``QdrantClient(url="http://host:port/qdrant", prefer_grpc=False)`` (the URL's path is the prefix; gRPC is
not served), with ``cloud_inference=True`` to send ``Document`` objects for embedding here.
"""

from __future__ import annotations

from service.http.qdrant.aliases import router as aliases_router
from service.http.qdrant.batch import router as batch_router
from service.http.qdrant.collections import router as collections_router
from service.http.qdrant.envelope import PREFIX, error_body
from service.http.qdrant.facet import router as facet_router
from service.http.qdrant.groups import router as groups_router
from service.http.qdrant.matrix import router as matrix_router
from service.http.qdrant.points import router as points_router
from service.http.qdrant.query import router as query_router
from service.http.qdrant.snapshots import router as snapshots_router

ROUTERS = (
    collections_router,
    points_router,
    batch_router,
    query_router,
    groups_router,
    matrix_router,
    facet_router,
    snapshots_router,
    aliases_router,
)

__all__ = ["PREFIX", "ROUTERS", "error_body"]
