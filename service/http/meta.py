"""``GET /v1/models``, ``/info``, ``/health``, ``/ready``, ``/metrics``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool

from service.http.errors import APIError
from service.http.kit import JSONRoute, json_response
from service.inference.model_registry import LoadedModel

router = APIRouter(route_class=JSONRoute)


def manifest_summary(lm: LoadedModel) -> dict[str, Any]:
    """The manifest as JSON, the canary's embeddings left out (only its sentence count kept)."""
    d = lm.model.manifest.model_dump(mode="json")
    if d.get("canary"):
        d["canary"] = {"n_sentences": len(d["canary"]["sentences"]), "atol": d["canary"]["atol"]}
    return d


@router.get("/v1/models")
async def list_models(request: Request) -> Response:
    """OpenAI model list of the *loaded* models; each entry also carries ``version``, ``active`` and the ``manifest``.

    ``available`` lists every artifact in ``models_dir`` (loaded or not):
    ``{id: "name:version", name, version, path, loaded, active, load_error}`` (see ``service.inference.model_control``).
    """
    reg = request.app.state.registry
    act = reg.active
    control = getattr(request.app.state, "model_control", None)
    data = [
        {
            "id": lm.info.name,
            "object": "model",
            "created": int(lm.model.manifest.created_at.timestamp()),
            "owned_by": "redundancy-embed",
            "version": lm.info.version,
            "active": lm is act,
            "manifest": manifest_summary(lm),
        }
        for lm in reg.all()
    ]
    body = {"object": "list", "data": data}
    if control is not None:
        body["available"] = control.available()
    return json_response(body)


@router.get("/info")
async def info(request: Request) -> Response:
    """Active model (manifest, providers) and the request/batching limits."""
    s = request.app.state.settings
    lm = request.app.state.registry.active
    if lm is None:
        raise APIError(503, "no model is loaded yet", code="model_not_ready")
    return json_response(
        {
            "model_id": lm.info.name,
            "model_version": lm.info.version,
            "model_sha256": lm.info.sha256,
            "dimension": lm.info.dimension,
            "max_seq_length": lm.info.max_seq_length,
            "providers": lm.model.providers,
            "manifest": manifest_summary(lm),
            "limits": s.limits(lm.model.providers),
            "loaded_models": [m.info.id for m in request.app.state.registry.all()],
            "auth": bool(s.api_keys),
        }
    )


@router.get("/health")
@router.get("/")  # TEI's liveness routes, for probes written for it
@router.get("/ping")
async def health() -> Response:
    """Liveness: 200 while the process serves HTTP (also ``GET /`` and ``GET /ping``, as TEI answers them)."""
    return json_response({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> Response:
    """Readiness: 200 once the model is loaded, warmed up and its canary checked; 503 otherwise (and while shutting down)."""
    if getattr(request.app.state, "draining", False):
        raise APIError(503, "draining: shutting down soon, still serving requests", code="draining")
    if not getattr(request.app.state, "ready", False):
        raise APIError(503, "not ready", code="not_ready")
    lm = request.app.state.registry.active
    return json_response({"status": "ready", "model": lm.info.name if lm else None})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition of the service's registry."""
    # collectors read every collection's info(): network calls on a shared backend, so off the event loop
    body, ctype = await run_in_threadpool(request.app.state.metrics.render)
    return Response(body, media_type=ctype)
