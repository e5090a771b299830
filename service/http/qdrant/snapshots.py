"""Collection snapshots through Qdrant's API, translated onto ``service.collections.snapshots``.

Qdrant API reference (https://api.qdrant.tech/api-reference), section "Snapshots", the collection routes:

* ``POST /collections/{collection_name}/snapshots`` (create; ``wait=false``: 202 ``{"result": null, "status":
  "accepted"}`` at once), ``GET .../snapshots`` (list), ``GET .../snapshots/{snapshot_name}`` (download),
  ``DELETE .../snapshots/{snapshot_name}``;
* ``PUT .../snapshots/recover`` ``{location, priority, checksum, api_key}``: replace the collection, or create it,
  from a ``file://`` snapshot inside the snapshots directory or an ``http(s)://`` URL (another server's download
  URL). ``priority`` (replica / snapshot / no_sync) concerns replica sets: accepted, no effect on one node. It needs
  global manage access, as in Qdrant: an admin key (``service.http.access``); a download is bounded
  (``service.collections.snapshot_fetch``), and a snapshot whose model is not loaded is refused (409: a recovery
  loads no model).

A snapshot is this service's archive (``service.collections.embedded.archive``), not Qdrant's storage format: a
snapshot made by Qdrant cannot be recovered here, nor one of this service by Qdrant. ``POST .../snapshots/upload``
(``?priority=&checksum=``, the file in the multipart field ``snapshot``) recovers from an uploaded file. Not served:
shard snapshots and whole-storage snapshots (``/snapshots``). The milvus backend keeps no snapshots (422).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from service.collections import snapshots
from service.collections.snapshot_fetch import MAX_LOCATION_CHARS
from service.http.access import require_admin
from service.http.errors import elapsed_s
from service.http.kit import JSONRoute, json_response
from service.http.qdrant.envelope import PREFIX, WRITES, Service, ok
from service.http.uploads import UPLOAD_BODY, Checksum, receive_upload, upload_limits

router = APIRouter(prefix=PREFIX, tags=["qdrant"], route_class=JSONRoute)
SNAPSHOTS = "/collections/{collection_name}/snapshots"
Wait = Annotated[bool, Query(description="false: answer 202 at once, the operation runs in the background")]


class SnapshotRecover(BaseModel):
    """Qdrant's ``SnapshotRecover`` (Qdrant API reference)."""

    model_config = ConfigDict(extra="forbid")
    location: StrictStr = Field(
        description="file:// inside the snapshots directory, or an http(s):// URL", max_length=MAX_LOCATION_CHARS
    )
    priority: Literal["replica", "snapshot", "no_sync"] | None = Field(None, description="no effect on one node")
    checksum: StrictStr | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$", description="SHA-256 hex to verify")
    api_key: StrictStr | None = Field(None, description="sent as the api-key header when downloading")


def _accepted(request: Request) -> Response:
    """Qdrant's answer to ``wait=false``: 202 ``{"result": null, "status": "accepted", "time"}``."""
    return json_response({"result": None, "status": "accepted", "time": round(elapsed_s(request.scope), 6)}, 202)


@router.post(SNAPSHOTS, dependencies=WRITES)
async def create_snapshot(request: Request, collection_name: str, svc: Service, wait: Wait = True) -> Response:
    """Qdrant's "Create collection snapshot": ``SnapshotDescription`` ``{name, creation_time, size, checksum}``."""
    store = snapshots.snapshot_store(svc.backend)
    svc.backend.get(collection_name)
    result, done = await snapshots.run_or_accept(store.create(collection_name), wait)
    return ok(request, result) if done else _accepted(request)


@router.get(SNAPSHOTS)
async def list_snapshots(request: Request, collection_name: str, svc: Service) -> Response:
    """Qdrant's "List collection snapshots"."""
    return ok(request, await snapshots.snapshot_store(svc.backend).list(collection_name))


@router.get(SNAPSHOTS + "/{snapshot_name}", response_class=FileResponse)
async def download_snapshot(collection_name: str, snapshot_name: str, svc: Service) -> Response:
    """Qdrant's "Download collection snapshot": the file."""
    path = snapshots.snapshot_store(svc.backend).path(collection_name, snapshot_name)
    return FileResponse(path, media_type="application/octet-stream", filename=snapshot_name)


@router.delete(SNAPSHOTS + "/{snapshot_name}", dependencies=WRITES)
async def delete_snapshot(
    request: Request, collection_name: str, snapshot_name: str, svc: Service, wait: Wait = True
) -> Response:
    """Qdrant's "Delete collection snapshot": ``true``."""
    await snapshots.snapshot_store(svc.backend).delete(collection_name, snapshot_name)
    return ok(request, True)


@router.put(SNAPSHOTS + "/recover", dependencies=WRITES)
async def recover_snapshot(
    request: Request, collection_name: str, body: SnapshotRecover, svc: Service, wait: Wait = True
) -> Response:
    """Qdrant's "Recover from a snapshot": ``true`` once the collection is replaced (or created). Global manage
    access, as Qdrant: an admin key (``service.http.access``)."""
    require_admin(request, "recovering a collection from a snapshot location")
    snapshots.snapshot_store(svc.backend)
    coro = svc.recovery.recover(collection_name, body.location, body.checksum, body.api_key)
    _, done = await snapshots.run_or_accept(coro, wait, detach=False)
    return ok(request, True) if done else _accepted(request)


@router.post(SNAPSHOTS + "/upload", dependencies=WRITES, openapi_extra=UPLOAD_BODY)
async def upload_snapshot(
    request: Request,
    collection_name: str,
    svc: Service,
    wait: Wait = True,
    priority: Annotated[Literal["replica", "snapshot", "no_sync"] | None, Query(description="no effect")] = None,
    checksum: Checksum = None,
) -> Response:
    """Qdrant's "Recover from an uploaded snapshot" (multipart field ``snapshot``): ``true`` once recovered."""
    store = snapshots.snapshot_store(svc.backend)
    snapshots.check_name(collection_name)
    path = await receive_upload(request, store.directory, *upload_limits(svc))
    coro = svc.recovery.recover_file(collection_name, path, checksum, remove=True, trusted=False)
    _, done = await snapshots.run_or_accept(coro, wait)
    return ok(request, True) if done else _accepted(request)
