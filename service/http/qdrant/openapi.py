"""The Qdrant-compatible surface's part of the OpenAPI contract (:mod:`service.http.openapi`): Qdrant's envelope, error
shape and the result schemas of its operations (Qdrant API reference, https://api.qdrant.tech/api-reference)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class QdrantErrorStatus(BaseModel):
    """The ``status`` object of a Qdrant error body (Qdrant API reference, ``ErrorResponse``)."""

    error: str = Field(description="what was wrong, for a person")


class QdrantError(BaseModel):
    """Every 4xx/5xx body under /qdrant: ``{"status": {"error": message}, "time": seconds}`` (Qdrant's shape)."""

    status: QdrantErrorStatus
    time: float


def qdrant_envelope(result: Any, name: str) -> Any:
    """Qdrant's success envelope ``{result, status: "ok", time}`` around ``result``."""
    return create_model(name, result=(result, ...), status=(Literal["ok"], ...), time=(float, ...))


class QdrantUpdate(BaseModel):
    """Qdrant's ``UpdateResult`` (Qdrant API reference): always ``completed`` here, the write being durable and
    searchable when answered; ``operation_id`` is the write's sequence number."""

    operation_id: int | None = None
    status: Literal["acknowledged", "completed"]


class QdrantRecord(_Open):
    """Qdrant's ``Record`` (Qdrant API reference): a point's ``id``, ``payload`` and ``vector`` as selected by
    ``with_payload`` / ``with_vector``."""

    id: int | str
    payload: dict[str, Any] | None = None
    vector: list[float] | dict[str, list[float]] | None = None


class QdrantScored(QdrantRecord):
    """Qdrant's ``ScoredPoint`` (Qdrant API reference): a ``Record`` with ``score`` (cosine/dot similarity, or Euclid
    distance) and ``version`` (always 0 here)."""

    version: int
    score: float


class QdrantPoints(BaseModel):
    """Qdrant's ``QueryResponse`` (Qdrant API reference): the ``ScoredPoint`` results of one universal query."""

    points: list[QdrantScored]


class QdrantGroup(BaseModel):
    """Qdrant's ``PointGroup`` (Qdrant API reference): the group's payload value ``id``, its ``hits`` best first, and
    ``lookup`` (the ``with_lookup`` collection's point whose id is the value, or null)."""

    id: int | str
    hits: list[QdrantScored]
    lookup: QdrantRecord | None = None


class QdrantFacetHit(BaseModel):
    """Qdrant's ``FacetValueHit`` (Qdrant API reference): a payload value and how many points have it."""

    value: bool | int | str
    count: int


class QdrantFacet(BaseModel):
    """Qdrant's ``FacetResponse`` (Qdrant API reference)."""

    hits: list[QdrantFacetHit]


class QdrantGroups(BaseModel):
    """Qdrant's ``GroupsResult`` (Qdrant API reference)."""

    groups: list[QdrantGroup]


class QdrantScroll(BaseModel):
    """Qdrant's ``ScrollResult`` (Qdrant API reference): one page of ``Record`` points; ``next_page_offset`` is the
    ``offset`` of the next page, null on the last."""

    points: list[QdrantRecord]
    next_page_offset: int | str | None = None


class QdrantMatrixPair(BaseModel):
    """Qdrant's ``SearchMatrixPair`` (Qdrant API reference): ``b`` is among the nearest sampled points of ``a``."""

    a: int | str
    b: int | str
    score: float


class QdrantMatrixPairs(BaseModel):
    """Qdrant's ``SearchMatrixPairsResponse`` (Qdrant API reference)."""

    pairs: list[QdrantMatrixPair]


class QdrantMatrixOffsets(BaseModel):
    """Qdrant's ``SearchMatrixOffsetsResponse`` (Qdrant API reference): ``scores[k]`` is the score of ``ids[offsets_col
    [k]]`` as a neighbour of ``ids[offsets_row[k]]``."""

    offsets_row: list[int]
    offsets_col: list[int]
    scores: list[float]
    ids: list[int | str]
