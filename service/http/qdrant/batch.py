"""Several point updates in one request, translated onto the single operations of :mod:`.points`.

Qdrant API reference (https://api.qdrant.tech/api-reference), "Points": ``POST /collections/{collection_name}/points/
batch`` with ``{"operations": [UpdateOperation, ...]}``, each one of ``{"upsert": PointInsertOperations}``,
``{"delete": PointsSelector}``, ``{"set_payload": SetPayload}``, ``{"overwrite_payload": SetPayload}``,
``{"delete_payload": DeletePayload}``, ``{"clear_payload": PointsSelector}``, ``{"update_vectors": UpdateVectors}``,
``{"delete_vectors": DeleteVectors}``; answers one ``UpdateResult`` per operation, in order.

Every operation's body is validated before the first one runs (a malformed one changes nothing); they then run in
order, each durable when the next starts. An operation refused while running (a missing collection, a ``Document`` of
another model, a payload too large) answers that error, naming ``operations[i]``; the operations before it stay
applied, as in Qdrant, where the operations of a batch are not one transaction.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ValidationError

from service.collections.errors import CollectionError, InvalidCollectionRequest
from service.collections.service import CollectionService
from service.http.kit import JSONRoute
from service.http.qdrant import points
from service.http.qdrant.envelope import PREFIX, WRITES, Service, ok, update_result
from service.http.qdrant.models import (
    DeletePayload,
    DeletePoints,
    DeleteVectors,
    SetPayload,
    UpdateOperations,
    UpdateVectors,
    UpsertPoints,
)

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)

Operation = Callable[[CollectionService, str, Any], Awaitable[int]]
#: operation name -> (its body's model, the single operation it runs)
OPERATIONS: dict[str, tuple[type[BaseModel], Operation]] = {
    "upsert": (UpsertPoints, points.upsert),
    "delete": (DeletePoints, points.delete),
    "set_payload": (SetPayload, points.set_payload),
    "overwrite_payload": (SetPayload, points.overwrite_payload),
    "delete_payload": (DeletePayload, points.delete_payload),
    "clear_payload": (DeletePoints, points.clear_payload),
    "update_vectors": (UpdateVectors, points.update_vectors),
    "delete_vectors": (DeleteVectors, points.delete_vectors),
}


def parse(raw: dict[str, Any], i: int) -> tuple[str, BaseModel]:
    """The name and validated body of operation ``i``.

    Raises:
        InvalidCollectionRequest: not one known operation, or a malformed body (naming ``operations[i]...``).
    """
    where = f"operations[{i}]"
    if len(raw) != 1:
        raise InvalidCollectionRequest(f"{where} must have exactly one of {sorted(OPERATIONS)}", param=where)
    ((kind, body),) = raw.items()
    if kind not in OPERATIONS:
        raise InvalidCollectionRequest(f"{where}: unknown operation {kind!r}; one of {sorted(OPERATIONS)}", where)
    try:
        return kind, OPERATIONS[kind][0].model_validate(body)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join([where, kind, *(str(x) for x in err["loc"])])
        raise InvalidCollectionRequest(f"{field}: {err['msg']}", param=field) from None


@router.post("/collections/{collection_name}/points/batch", dependencies=WRITES)
async def batch_update(collection_name: str, body: UpdateOperations, request: Request, svc: Service) -> Response:
    """Qdrant API reference: ``POST /collections/{collection_name}/points/batch`` -> ``[UpdateResult]``, one per
    operation (module docstring). Errors: those of each operation, the message prefixed with ``operations[i]``."""
    ops = [parse(raw, i) for i, raw in enumerate(body.operations)]
    results = []
    for i, (kind, op) in enumerate(ops):
        try:
            results.append(update_result(await OPERATIONS[kind][1](svc, collection_name, op)))
        except CollectionError as e:
            where = f"operations[{i}].{kind}"
            e.args = (f"{where}: {e}",)
            e.param = f"{where}.{e.param}" if e.param and e.param != "name" else e.param
            raise
    return ok(request, results)
