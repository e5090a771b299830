"""HTTP routes of collection snapshots (Qdrant's names; :mod:`.snapshots` has the semantics).

===========================================================  ===============================================
``POST   /collections/{name}/snapshots``                     snapshot it now -> ``{name, creation_time, size,
                                                             checksum}``
``GET    /collections/{name}/snapshots``                     ``{"snapshots": [...]}``, oldest first
``GET    /collections/{name}/snapshots/{snapshot_name}``     the file (``application/octet-stream``)
``DELETE /collections/{name}/snapshots/{snapshot_name}``     delete it
``PUT    /collections/{name}/snapshots/recover``             ``{location, checksum, api_key}``: replace or create
                                                             the collection from a snapshot -> its info (an
                                                             admin key: ``service.http.access``)
``POST   /collections/{name}/snapshots/upload``              the same from an uploaded file (multipart field
                                                             ``snapshot``; ``?checksum=``)
===========================================================  ===============================================

``?wait=false`` on the writes answers 202 ``{"status": "accepted"}`` at once and runs the operation in the
background; a snapshot or a recovery that was begun completes even if its request times out or the client leaves (a
download or an upload stops with it: ``service.collections.snapshot_fetch``, ``service.http.uploads``).
Errors: 401/403 (recovery from a location without an admin key), 404 ``collection_not_found`` /
``snapshot_not_found``, 408 ``upload_timeout``, 409 ``model_unavailable`` (the snapshot's model is not loaded: a
recovery loads none), 413 ``payload_too_large``, 422 ``invalid_snapshot`` / ``checksum_mismatch`` /
``snapshot_unreachable`` / ``invalid_value`` / ``unsupported`` (the milvus backend).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, ConfigDict, Field, StrictStr
from starlette.responses import Response

from service.collections import snapshots
from service.collections.snapshot_fetch import MAX_LOCATION_CHARS
from service.http.access import require_admin
from service.http.deps import WRITES, Service
from service.http.kit import JSONRoute, json_response
from service.http.uploads import UPLOAD_BODY, Checksum, receive_upload, upload_limits

router = APIRouter(tags=["collections"], route_class=JSONRoute)
Wait = Annotated[bool, Query(description="false: answer 202 at once, the operation runs in the background")]


class RecoverSnapshot(BaseModel):
    """Body of ``PUT /collections/{name}/snapshots/recover`` (Qdrant's ``SnapshotRecover``)."""

    model_config = ConfigDict(extra="forbid")
    location: StrictStr = Field(
        description="file:// URL inside the snapshots directory, or http(s):// URL (another server's download URL)",
        max_length=MAX_LOCATION_CHARS,
    )
    checksum: StrictStr | None = Field(None, pattern=r"^[0-9a-fA-F]{64}$", description="SHA-256 hex to verify")
    api_key: StrictStr | None = Field(None, description="sent as the api-key header when downloading")


@router.post("/collections/{name}/snapshots", dependencies=WRITES)
async def create_snapshot(name: str, svc: Service, wait: Wait = True) -> Response:
    """Snapshot the collection as of now (writes go on meanwhile); answers its description."""
    store = snapshots.snapshot_store(svc.backend)
    svc.backend.get(name)  # 404 now, not in the background
    result, done = await snapshots.run_or_accept(store.create(name), wait)
    return json_response(result) if done else json_response({"status": "accepted"}, 202)


@router.get("/collections/{name}/snapshots")
async def list_snapshots(name: str, svc: Service) -> Response:
    """The collection's snapshots (also after the collection was deleted)."""
    return json_response({"snapshots": await snapshots.snapshot_store(svc.backend).list(name)})


@router.get("/collections/{name}/snapshots/{snapshot_name}", response_class=FileResponse)
async def download_snapshot(name: str, snapshot_name: str, svc: Service) -> Response:
    """The snapshot file, streamed."""
    path = snapshots.snapshot_store(svc.backend).path(name, snapshot_name)
    return FileResponse(path, media_type="application/octet-stream", filename=snapshot_name)


@router.delete("/collections/{name}/snapshots/{snapshot_name}", dependencies=WRITES)
async def delete_snapshot(name: str, snapshot_name: str, svc: Service) -> Response:
    """Delete the snapshot file."""
    await snapshots.snapshot_store(svc.backend).delete(name, snapshot_name)
    return json_response({"deleted": True, "name": snapshot_name})


@router.put("/collections/{name}/snapshots/recover", dependencies=WRITES)
async def recover_snapshot(
    name: str, body: RecoverSnapshot, request: Request, svc: Service, wait: Wait = True
) -> Response:
    """Replace the collection (or create it) from the snapshot at ``location`` (an admin key); answers its info."""
    require_admin(request, "recovering a collection from a snapshot location")
    snapshots.snapshot_store(svc.backend)  # 422 unsupported now, not in the background
    coro = svc.recovery.recover(name, body.location, body.checksum, body.api_key)
    c, done = await snapshots.run_or_accept(coro, wait, detach=False)
    return json_response(await svc.backend.run(c.info)) if done else json_response({"status": "accepted"}, 202)


@router.post("/collections/{name}/snapshots/upload", dependencies=WRITES, openapi_extra=UPLOAD_BODY)
async def upload_snapshot(
    name: str, request: Request, svc: Service, wait: Wait = True, checksum: Checksum = None
) -> Response:
    """Replace the collection (or create it) from the snapshot file uploaded in the form field ``snapshot``."""
    store = snapshots.snapshot_store(svc.backend)
    snapshots.check_name(name)  # before the upload
    path = await receive_upload(request, store.directory, *upload_limits(svc))
    c, done = await snapshots.run_or_accept(
        svc.recovery.recover_file(name, path, checksum, remove=True, trusted=False), wait
    )
    return json_response(await svc.backend.run(c.info)) if done else json_response({"status": "accepted"}, 202)
