"""Admin routes: model control, behind an admin API key.

=====================================  =============================================================
``POST /admin/models/{name}/load``      body ``{"version": "2"}`` optional (default: newest on disk);
                                        load, warm up, check the canary; do not activate
``POST /admin/models/{name}/activate``  body ``{"version": ...}`` optional; load if needed, persist,
                                        swap atomically; collections start re-embedding
``POST /admin/models/{name}/unload``    body ``{"version": ...}`` optional (default: every non-active
                                        loaded version of ``name``)
``POST /admin/models/reload``           rescan ``models_dir``: list what appeared (poll mode: also activate
                                        a newly published newer version, as the watcher does)
=====================================  =============================================================

Auth: ``Authorization: Bearer <key>`` with a key of ``admin_api_keys``, or of ``api_keys``
when no admin keys are set. With neither configured the admin routes answer 403
``admin_disabled`` (model control is never open to anonymous callers).

Errors: 401 ``invalid_api_key``, 403 ``admin_disabled`` / ``insufficient_permissions`` (a valid user key that
is not an admin key), 404 ``model_not_found``,
409 ``model_in_use``, 422 ``model_load_failed`` (the message says what failed; the
active model is unchanged and keeps serving), 500 ``persist_failed``.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from service.http.errors import APIError
from service.http.kit import JSONRoute, json_response
from service.http.middleware import bearer_token, key_matches
from service.inference.model_control import ModelControl, ModelInUse
from service.inference.model_registry import LoadedModel, ModelNotFound
from service.inference.onnx_encoder import ModelInfo, ModelLoadError

router = APIRouter(prefix="/admin", tags=["admin"], route_class=JSONRoute)


class VersionBody(BaseModel):
    """Optional body of the per-model admin routes."""

    model_config = ConfigDict(extra="forbid")
    version: str | None = Field(None, min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_admin(request: Request) -> None:
    s = request.app.state.settings
    keys = [k.encode() for k in (s.admin_api_keys or s.api_keys)]
    if not keys:
        raise APIError(
            403, "admin API disabled: start the service with --admin-api-keys (or --api-keys)", code="admin_disabled"
        )
    token = bearer_token(request.headers.get("authorization", "").encode("latin-1"))
    if key_matches(token, keys):
        return
    if key_matches(token, [k.encode() for k in s.api_keys]):
        raise APIError(
            403,
            "this API key is valid but lacks admin rights: /admin routes need one of the admin_api_keys",
            code="insufficient_permissions",
        )
    raise APIError(
        401,
        "admin routes need 'Authorization: Bearer <admin key>'",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )


def control_of(request: Request) -> ModelControl:
    """``app.state.model_control`` (503 while starting)."""
    mc = getattr(request.app.state, "model_control", None)
    if mc is None:
        raise APIError(503, "service is starting", code="model_not_ready")
    return mc


async def _body(request: Request) -> VersionBody:
    raw = await request.body()
    if not raw.strip():
        return VersionBody()
    try:
        return VersionBody.model_validate_json(raw)
    except Exception as e:
        raise APIError(
            422, f'body must be {{"version": "<version>"}} or empty: {e}', param="version", code="invalid_value"
        ) from e


def model_json(info: ModelInfo) -> dict[str, Any]:
    """``{id, name, version, sha256, dimension, max_seq_length, quantization}`` of a loaded model."""
    return {
        "id": info.id,
        "name": info.name,
        "version": info.version,
        "sha256": info.sha256,
        "dimension": info.dimension,
        "max_seq_length": info.max_seq_length,
        "quantization": info.quantization,
    }


def _map(e: Exception) -> APIError:
    if isinstance(e, ModelNotFound):
        return APIError(404, str(e), param="name", code="model_not_found")
    if isinstance(e, ModelLoadError):
        return APIError(422, f"load failed, the active model is unchanged: {e}", code="model_load_failed")
    if isinstance(e, ModelInUse):
        return APIError(409, str(e), code="model_in_use")
    if isinstance(e, OSError):
        return APIError(500, f"could not persist the active model: {e}", code="persist_failed", type="server_error")
    raise e


@router.post("/models/reload")
async def reload_models(request: Request) -> Response:
    """Rescan ``models_dir``; answers ``{available, new, activated, errors}`` (see ``ModelControl.rescan``).

    In ``explicit`` mode nothing is loaded or activated; in ``poll`` mode a newly published, newer
    version of the active model is activated, as the watcher would.
    """
    _check_admin(request)
    return json_response(await control_of(request).rescan())


@router.post("/models/{name}/load")
async def load(name: str, request: Request) -> Response:
    """Load without activating; ``{"loaded": model}``."""
    _check_admin(request)
    body = await _body(request)
    try:
        lm: LoadedModel = await control_of(request).load(name, body.version)
    except (ModelNotFound, ModelLoadError) as e:
        raise _map(e) from e
    return json_response({"loaded": model_json(lm.info)})


@router.post("/models/{name}/activate")
async def activate(name: str, request: Request) -> Response:
    """Load if needed, then activate; ``{"active": model, "previous": model or null}``."""
    _check_admin(request)
    body = await _body(request)
    try:
        lm, prev = await control_of(request).activate(name, body.version)
    except (ModelNotFound, ModelLoadError, OSError) as e:
        raise _map(e) from e
    return json_response({"active": model_json(lm.info), "previous": model_json(prev) if prev else None})


@router.post("/models/{name}/unload")
async def unload(name: str, request: Request) -> Response:
    """Unload (after queued work finishes); ``{"unloaded": [ids]}``."""
    _check_admin(request)
    body = await _body(request)
    try:
        ids = await control_of(request).unload(name, body.version)
    except (ModelNotFound, ModelInUse) as e:
        raise _map(e) from e
    return json_response({"unloaded": ids})
