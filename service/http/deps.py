"""FastAPI dependencies that every collections dialect (native, Qdrant) shares: the collection service, the read
consistency a request asks for, the marker of the routes that write, and the timer of collection requests."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import Depends, Query, Request

from service.collections.errors import CollectionsNotReady
from service.collections.reads import CONSISTENCY_LEVELS, ReadConsistency
from service.collections.service import CollectionService
from service.http.kit import mark_write
from service.metrics import CollectionTimer, open_collections


def collection_service(request: Request) -> CollectionService:
    """Dependency: the :class:`CollectionService` on ``app.state.collection_service``.

    Raises:
        CollectionsNotReady: the collections are not started yet.
    """
    svc = getattr(request.app.state, "collection_service", None)
    if svc is None:
        raise CollectionsNotReady("collections are not available yet")
    return svc


Service = Annotated[CollectionService, Depends(collection_service)]


def read_consistency(
    svc: Annotated[CollectionService, Depends(collection_service)],
    consistency: Annotated[
        Literal[CONSISTENCY_LEVELS] | None,
        Query(
            description="strong | bounded | eventual (default: collections_read_consistency); the embedded "
            "backend is always strong"
        ),
    ] = None,
    after_sequence: Annotated[
        int | None,
        Query(ge=0, le=2**63 - 1, description="a write's 'sequence': the read sees that write, on any replica"),
    ] = None,
) -> ReadConsistency:
    """Dependency: the read consistency a request asks for (Qdrant API reference: the ``consistency`` query
    parameter of reads; Milvus consistency levels); see :class:`~.backend.ReadConsistency`."""
    return svc.read_consistency(consistency, after_sequence)


Consistency = Annotated[ReadConsistency, Depends(read_consistency)]

#: the dependencies of a route that changes stored data: past its time budget, it answers that the write may have
#: been applied (:func:`service.http.kit.mark_write`)
WRITES = [Depends(mark_write)]


def collection_timer(request: Request) -> CollectionTimer:
    """Dependency: a :class:`~service.metrics.CollectionTimer` on the app's metrics and collections."""
    state = request.app.state
    return CollectionTimer(state.metrics, lambda: open_collections(state))


Timer = Annotated[CollectionTimer, Depends(collection_timer)]  # latency histograms by index type (service.metrics)
