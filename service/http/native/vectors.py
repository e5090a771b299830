"""HTTP routes that change what an existing collection indexes: add or delete a named vector (Qdrant's "Create
vector name" and "Delete vector name"; :mod:`.vector_names` has the semantics), create or drop a payload index
(Qdrant's "Create index for field" and "Delete index for field"; :mod:`.payload_indexes`).

===============================================  ==============================================================
``PUT    /collections/{name}/vectors/{vector}``  ``{dense: {size, metric, index, params, multivector}}`` or
                                                 ``{sparse: {modifier, model}}``: the vector added (client-supplied
                                                 dense, or sparse), held by none of the stored points -> info
``DELETE /collections/{name}/vectors/{vector}``  the vector and its stored values dropped (not the model-bound
                                                 one; a name the collection lacks changes nothing) -> info
``PUT    /collections/{name}/payload-indexes/    ``{schema: "keyword" | {type, ...params}}``: payload ``key``
{key}``                                          indexed (built when answered; replaces another index of it) ->
                                                 info, whose ``payload_indexes`` lists ``{data_type, params?,
                                                 points}`` by key
``DELETE /collections/{name}/payload-indexes/    the index dropped (none: nothing changes) -> info
{key}``
===============================================  ==============================================================

Errors: 404 ``collection_not_found``, 422 ``invalid_value`` (a bad definition, a name taken by a vector of another
definition, the model-bound vector, a bad payload key or schema) or ``unsupported`` (the milvus backend: one vector
per collection; a ``geo`` payload index). The milvus backend accepts payload indexes with no effect and lists none.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from service.http.deps import WRITES, Service
from service.http.kit import JSONRoute, json_response
from service.http.native.models import DenseVectorIn, SparseVectorIn

router = APIRouter(tags=["collections"], route_class=JSONRoute)


class AddVector(BaseModel):
    """Body of ``PUT /collections/{name}/vectors/{vector}``: exactly one of ``dense`` (:class:`~.models.DenseVectorIn`,
    not bound to the model) and ``sparse`` (:class:`~.models.SparseVectorIn`)."""

    model_config = ConfigDict(extra="forbid")
    dense: DenseVectorIn | None = None
    sparse: SparseVectorIn | None = None


@router.put("/collections/{name}/vectors/{vector}", dependencies=WRITES)
async def add_vector(name: str, vector: str, body: AddVector, svc: Service) -> Response:
    """Add the named vector ``vector`` to collection ``name`` (Qdrant API reference: ``PUT
    /collections/{collection_name}/vectors/{vector_name}``); answers the collection's info.

    Raises:
        CollectionNotFound, InvalidCollectionRequest (:func:`.vector_names.with_vector`).
    """
    d = body.dense
    dense = (
        None
        if d is None
        else {
            "bound": d.model,
            "size": d.size,
            "metric": d.metric,
            "index": d.index,
            "params": d.params,
            "multivector": d.multivector,
        }
    )
    sparse = None if body.sparse is None else {"modifier": body.sparse.modifier, "model": body.sparse.model}
    await svc.create_vector_name(name, vector, dense, sparse)
    return json_response(await svc.info(name))


@router.delete("/collections/{name}/vectors/{vector}", dependencies=WRITES)
async def drop_vector(name: str, vector: str, svc: Service) -> Response:
    """Delete the named vector ``vector`` and its stored values from collection ``name`` (Qdrant API reference:
    ``DELETE /collections/{collection_name}/vectors/{vector_name}``); answers the collection's info.

    Raises:
        CollectionNotFound, InvalidCollectionRequest (:func:`.vector_names.without_vector`).
    """
    await svc.delete_vector_name(name, vector)
    return json_response(await svc.info(name))


class PayloadIndexIn(BaseModel):
    """Body of ``PUT /collections/{name}/payload-indexes/{key}``: ``schema``, Qdrant's ``field_schema`` (a type name
    of :data:`~service.collections.payload_indexes.DATA_TYPES` or ``{type, ...params}``)."""

    model_config = ConfigDict(extra="forbid")
    schema_: Any = Field(alias="schema")


@router.put("/collections/{name}/payload-indexes/{key}", dependencies=WRITES)
async def create_payload_index(name: str, key: str, body: PayloadIndexIn, svc: Service) -> Response:
    """Index payload ``key`` of collection ``name`` (Qdrant API reference: ``PUT /collections/{collection_name}/index``);
    answers the collection's info.

    Raises:
        CollectionNotFound, InvalidCollectionRequest (:func:`.payload_indexes.payload_index`).
    """
    await svc.create_payload_index(name, key, body.schema_)
    return json_response(await svc.info(name))


@router.delete("/collections/{name}/payload-indexes/{key}", dependencies=WRITES)
async def drop_payload_index(name: str, key: str, svc: Service) -> Response:
    """Drop the index of payload ``key`` of collection ``name`` (Qdrant API reference: ``DELETE
    /collections/{collection_name}/index/{field_name}``); answers the collection's info.

    Raises:
        CollectionNotFound.
    """
    await svc.delete_payload_index(name, key)
    return json_response(await svc.info(name))
