"""Request bodies of the Qdrant-compatible routes (pydantic), named and shaped as in Qdrant's REST API reference
(https://api.qdrant.tech/api-reference, schemas). Fields Qdrant defines that this surface does not map are accepted
when absent or null and refused with 422 otherwise (the routes say which); unknown fields are refused.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from service.collections.payload_checks import check_payload_values
from service.http.qdrant.ids import QdrantId

FiniteFloat = Annotated[float, Field(allow_inf_nan=False, strict=True)]
Vector = Annotated[list[FiniteFloat], Field(min_length=1)]
#: a multivector: one matrix of vectors (rows) for a vector with ``multivector_config``
MultiVector = Annotated[list[Vector], Field(min_length=1)]
Limit = Annotated[StrictInt, Field(ge=1)]
#: payload selection: true/false, a list of keys to include, or {"include": [...]} / {"exclude": [...]}
WithPayload = StrictBool | list[StrictStr] | dict[Literal["include", "exclude"], list[StrictStr]]
WithVector = StrictBool | list[StrictStr]


def _plain_json(v: dict[str, Any]) -> dict[str, Any]:
    check_payload_values(v)  # the native API's rule: finite numbers, 64-bit integers, bounded nesting
    return v


#: a point's payload, held to the same rules as the native API's (a 422 names the offending path)
Payload = Annotated[dict[str, Any], AfterValidator(_plain_json)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Document(_Body):
    """Qdrant's ``Document``: a text embedded here by the collection's model (``model`` must name it)."""

    text: Annotated[StrictStr, Field(min_length=1)]
    model: StrictStr
    options: dict[str, Any] | None = None


class SparseVector(_Body):
    """Qdrant's ``SparseVector``: ``indices`` (unsigned 32-bit, unique) and their ``values``."""

    indices: list[StrictInt]
    values: list[FiniteFloat]


VectorInput = Vector | MultiVector | Document | dict[StrictStr, Vector | MultiVector | Document | SparseVector]


class VectorParams(_Body):
    """Qdrant's ``VectorParams``: ``size``, ``distance`` (Cosine, Dot or Euclid). The first vector whose ``size`` is
    the active model's dimension is bound to it (the service embeds ``Document`` texts); others are the client's."""

    size: Annotated[StrictInt, Field(ge=1)]
    distance: Literal["Cosine", "Dot", "Euclid", "Manhattan"]
    hnsw_config: dict[str, Any] | None = None
    quantization_config: Any = None
    on_disk: StrictBool | None = None
    datatype: StrictStr | None = None
    multivector_config: Any = None
    memory: Any = None


class SparseVectorParams(_Body):
    """Qdrant's ``SparseVectorParams``: ``modifier`` (``none`` or ``idf``); ``index`` (storage tuning) accepted, no
    effect (search is exact)."""

    index: dict[str, Any] | None = None
    modifier: Literal["none", "idf"] | None = None


class CreateCollection(_Body):
    """Body of ``PUT /collections/{collection_name}`` (Qdrant's ``CreateCollection``)."""

    vectors: VectorParams | dict[StrictStr, VectorParams] | None = None
    hnsw_config: dict[str, Any] | None = None
    quantization_config: Any = None
    sparse_vectors: dict[StrictStr, SparseVectorParams] | None = None
    init_from: Any = None
    sharding_method: StrictStr | None = None
    # storage tuning of a Qdrant cluster: accepted, no effect here
    shard_number: StrictInt | None = None
    replication_factor: StrictInt | None = None
    write_consistency_factor: StrictInt | None = None
    on_disk_payload: StrictBool | None = None
    wal_config: dict[str, Any] | None = None
    optimizers_config: dict[str, Any] | None = None
    strict_mode_config: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class UpdateCollection(_Body):
    """Body of ``PATCH /collections/{collection_name}`` (Qdrant's ``UpdateCollection``); ``vectors`` maps a vector
    name to its ``VectorParamsDiff`` (``hnsw_config``, ``quantization_config``, ``on_disk``, ``memory``)."""

    vectors: dict[StrictStr, dict[str, Any]] | None = None
    optimizers_config: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    hnsw_config: dict[str, Any] | None = None
    quantization_config: Any = None
    sparse_vectors: dict[str, Any] | None = None
    strict_mode_config: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


class DenseVectorConfig(_Body):
    """Qdrant's ``DenseVectorConfig``: a dense vector added to a collection, ``size``, ``distance``,
    ``multivector_config``, ``datatype`` (float32 only here)."""

    size: Annotated[StrictInt, Field(ge=1)]
    distance: Literal["Cosine", "Dot", "Euclid", "Manhattan"]
    multivector_config: Any = None
    datatype: StrictStr | None = None


class SparseVectorConfig(_Body):
    """Qdrant's ``SparseVectorConfig``: a sparse vector added to a collection, ``modifier`` (``none`` or ``idf``),
    ``datatype`` (float32 only here)."""

    modifier: Literal["none", "idf"] | None = None
    datatype: StrictStr | None = None


class VectorNameConfig(_Body):
    """Body of ``PUT /collections/{collection_name}/vectors/{vector_name}``: Qdrant's ``VectorNameConfig``, one of
    ``{dense: DenseVectorConfig}`` and ``{sparse: SparseVectorConfig}``."""

    dense: DenseVectorConfig | None = None
    sparse: SparseVectorConfig | None = None


class PointStruct(_Body):
    """One point: ``id``, ``vector`` (floats or a ``Document``: the unnamed vector; or ``{name: floats | Document |
    SparseVector}``), ``payload``."""

    id: QdrantId
    vector: VectorInput = Field(default_factory=dict)
    payload: Payload | None = None


class Batch(_Body):
    """Qdrant's ``Batch`` (the ``batch`` of a ``PointsBatch``): ``ids``, one vector per id (floats or ``Document``;
    or ``{name: [one per id]}``), optional ``payloads`` one per id; other lengths are refused with 422."""

    ids: list[QdrantId] = Field(min_length=1)
    vectors: (
        list[Vector | MultiVector | Document] | dict[StrictStr, list[Vector | MultiVector | Document | SparseVector]]
    )
    payloads: list[Payload | None] | None = None


class UpsertPoints(_Body):
    """Body of ``PUT /collections/{collection_name}/points``: Qdrant's ``PointsList`` or ``PointsBatch``."""

    points: Annotated[list[PointStruct], Field(min_length=1)] | None = None
    batch: Batch | None = None
    shard_key: Any = None
    update_filter: dict[str, Any] | None = None
    update_mode: Literal["upsert", "insert_only", "update_only"] | None = None


class PointRequest(_Body):
    """Body of ``POST /collections/{collection_name}/points`` (retrieve)."""

    ids: list[QdrantId]
    with_payload: WithPayload | None = True
    with_vector: WithVector = False
    shard_key: Any = None


class DeletePoints(_Body):
    """Qdrant's ``PointsSelector``: ``points`` (ids) or ``filter``; the body of ``POST /collections/{collection_name}/
    points/delete`` and ``.../points/payload/clear``."""

    points: list[QdrantId] | None = None
    filter: dict[str, Any] | None = None
    shard_key: Any = None


class SetPayload(_Body):
    """Body of ``POST`` (merge) and ``PUT`` (replace) ``/collections/{collection_name}/points/payload``."""

    payload: Payload
    points: list[QdrantId] | None = None
    filter: dict[str, Any] | None = None
    key: StrictStr | None = None
    shard_key: Any = None


class DeletePayload(_Body):
    """Body of ``POST /collections/{collection_name}/points/payload/delete``: ``keys`` (dotted paths into nested
    objects), from the ``points`` (ids) or those matching ``filter``."""

    keys: list[StrictStr]
    points: list[QdrantId] | None = None
    filter: dict[str, Any] | None = None
    shard_key: Any = None


class UpdateOperations(_Body):
    """Body of ``POST /collections/{collection_name}/points/batch`` (Qdrant's ``UpdateOperations``): each operation
    is ``{name: body}``, validated by ``service.http.qdrant.batch`` against the body of that single operation."""

    operations: list[dict[StrictStr, Any]] = Field(min_length=1)


class ScrollRequest(_Body):
    """Body of ``POST /collections/{collection_name}/points/scroll``."""

    offset: QdrantId | None = None
    limit: Limit | None = None
    filter: dict[str, Any] | None = None
    with_payload: WithPayload | None = True
    with_vector: WithVector = False
    order_by: Any = None
    shard_key: Any = None


class CountRequest(_Body):
    """Body of ``POST /collections/{collection_name}/points/count`` (``exact`` accepted: counts are exact)."""

    filter: dict[str, Any] | None = None
    exact: StrictBool = True
    shard_key: Any = None


class LookupLocation(_Body):
    """Qdrant's ``LookupLocation``: where the point ids of a query are looked up, the ``collection`` (a name or alias)
    and its ``vector`` (None: the query's ``using``)."""

    collection: StrictStr
    vector: StrictStr | None = None
    shard_key: Any = None


class Prefetch(_Body):
    """Qdrant's ``Prefetch``: a sub-query whose hits the enclosing query fuses or re-scores (``prefetch`` nests)."""

    prefetch: list[Prefetch] | Prefetch | None = None
    query: Vector | MultiVector | QdrantId | Document | SparseVector | dict[StrictStr, Any] | None = None
    using: StrictStr | None = None
    filter: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    score_threshold: FiniteFloat | None = None
    limit: Limit | None = None
    lookup_from: LookupLocation | None = None


class QueryRequest(Prefetch):
    """One universal query (Qdrant's ``QueryRequest``: a ``Prefetch``'s fields and these): ``query`` is a dense or
    sparse vector, a point id, a ``Document``, ``{"nearest": one of those}``, a fusion or a recommendation; no query
    pages through the points in id order."""

    offset: Annotated[StrictInt, Field(ge=0)] | None = None
    with_vector: WithVector | None = None
    with_payload: WithPayload | None = None
    shard_key: Any = None


#: one example of a recommendation: a vector, a multivector's rows, a point id (its stored vector) or a ``Document``
Example = Vector | MultiVector | QdrantId | SparseVector | Document


class RecommendInput(_Body):
    """Qdrant's ``RecommendInput`` (``{"recommend": ...}`` of a universal query): ``positive`` and ``negative``
    examples and the ``strategy`` (only ``average_vector``, Qdrant's default, is served)."""

    positive: list[Example] | None = None
    negative: list[Example] | None = None
    strategy: Literal["average_vector", "best_score", "sum_scores"] | None = None


class QueryGroupsRequest(QueryRequest):
    """Body of ``POST /collections/{collection_name}/points/query/groups`` (Qdrant's ``QueryGroupsRequest``): a
    universal query whose hits are grouped by the payload value at ``group_by``; ``limit`` groups (default 10) of at
    most ``group_size`` hits (default 3). ``offset`` is not one of its fields (422)."""

    group_by: Annotated[StrictStr, Field(min_length=1)]
    group_size: Limit | None = None
    with_lookup: Any = None


class FacetRequest(_Body):
    """Body of ``POST /collections/{collection_name}/facet`` (Qdrant's ``FacetRequest``): the ``limit`` (default 10)
    most frequent values at the payload ``key`` among the points matching ``filter``; ``exact`` is accepted (counts
    are always exact here)."""

    key: Annotated[StrictStr, Field(min_length=1)]
    limit: Limit | None = None
    filter: dict[str, Any] | None = None
    exact: StrictBool | None = None
    shard_key: Any = None


class QueryBatch(_Body):
    """Body of ``POST /collections/{collection_name}/points/query/batch``."""

    searches: list[QueryRequest]  # an empty batch answers [] (as Qdrant does)


class NamedVector(_Body):
    """Qdrant's ``NamedVector`` of a legacy search: the dense vector ``name``."""

    name: StrictStr
    vector: Vector


class NamedSparseVector(_Body):
    """Qdrant's ``NamedSparseVector`` of a legacy search: the sparse vector ``name``."""

    name: StrictStr
    vector: SparseVector


class SearchRequest(_Body):
    """The legacy search (Qdrant's ``SearchRequest``): ``vector`` (floats or ``{name, vector}``), ``limit``."""

    vector: Vector | NamedVector | NamedSparseVector
    limit: Limit
    filter: dict[str, Any] | None = None
    params: dict[str, Any] | None = None
    offset: Annotated[StrictInt, Field(ge=0)] | None = None
    with_payload: WithPayload | None = None
    with_vector: WithVector | None = None
    score_threshold: FiniteFloat | None = None
    shard_key: Any = None


class SearchBatch(_Body):
    """Body of ``POST /collections/{collection_name}/points/search/batch``."""

    searches: list[SearchRequest]  # an empty batch answers []


class PointVectors(_Body):
    """One point of an ``UpdateVectors``: its ``id`` and the vectors to set (the others it holds stay)."""

    id: QdrantId
    vector: VectorInput


class UpdateVectors(_Body):
    """Body of ``PUT /collections/{collection_name}/points/vectors`` (Qdrant's ``UpdateVectors``)."""

    points: list[PointVectors] = Field(min_length=1)
    shard_key: Any = None
    update_filter: dict[str, Any] | None = None


class DeleteVectors(_Body):
    """Body of ``POST /collections/{collection_name}/points/vectors/delete`` (Qdrant's ``DeleteVectors``): the named
    ``vector`` names to remove from the ``points`` (ids) or those matching ``filter``."""

    points: list[QdrantId] | None = None
    filter: dict[str, Any] | None = None
    vector: list[StrictStr] = Field(min_length=1)
    shard_key: Any = None


class CreateFieldIndex(_Body):
    """Body of ``PUT /collections/{collection_name}/index``: the key and Qdrant's ``PayloadFieldSchema`` (a type name
    or a params object; checked by :func:`service.collections.payload_indexes.payload_index`)."""

    field_name: StrictStr
    field_schema: Any = None
