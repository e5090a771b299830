"""Model control: load, activate, unload and rescan artifacts while serving.

:class:`ModelControl` sits on top of :class:`~service.inference.model_registry.ModelRegistry` and owns
the policy the registry does not know about:

* **Load** (:meth:`ModelControl.load`): locate ``models/<name>/<version>/`` (or the flat
  layout), then :func:`~service.inference.model_registry.load_model` validates the manifest, opens the
  ONNX session and tokenizer, warms up and checks the canary (finite, dimension equal
  to the manifest's, agreeing with the manifest's recorded canary embeddings). The
  manifest's ``name``/``version`` must also match the directory it was found in. Any
  failure raises :class:`~service.inference.onnx_encoder.ModelLoadError` naming what failed and leaves
  the registry untouched, so the current model keeps serving.
* **Activate** (:meth:`ModelControl.activate`): load if needed, persist the choice to
  ``<data_dir>/active_model.json`` (atomically: temporary file, fsync, rename), then swap
  the registry's active pointer. A request resolves its model once, when it starts, so
  work already queued finishes on the model it started with and new requests use the
  new one. Listeners (the collections re-embedder) are told afterwards.
* **Unload**: refused for the active model and for a model a collection still searches with.
* **Rescan** (:meth:`ModelControl.rescan`) and the ``--model-control poll`` watcher: a
  version of the active model's name that *appears* in the directory after start-up and
  is newer than the active one is loaded and activated; a failed load is recorded
  (``GET /v1/models`` shows it) and not retried until its manifest changes.
* **Restart**: :meth:`ModelControl.startup` loads the persisted active version when there
  is one, else ``settings.default_model``.

All mutating operations are serialised by one asyncio lock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifact_contract import MANIFEST_FILE, ArtifactError, ArtifactRef, _version_key, find_artifacts, resolve_artifact
from service.inference.model_registry import LoadedModel, ModelNotFound, ModelRegistry, WrongModelTask, load_model
from service.inference.onnx_encoder import ModelInfo, ModelLoadError
from service.metrics import Metrics
from service.settings import Settings
from service.tasks import cancel_and_wait

log = logging.getLogger("service.inference.model_control")

ACTIVE_FILE = "active_model.json"

# async callback(previous active ModelInfo or None, new active ModelInfo)
Listener = Callable[[ModelInfo | None, ModelInfo], Awaitable[None]]


class ModelInUse(RuntimeError):
    """The model cannot be unloaded: it is active, or collections still search with it."""


@dataclass
class LoadFailure:
    """The last failed load of an artifact: the error message and when (Unix seconds)."""

    error: str
    at: float
    manifest_mtime: float


def version_key(v: str) -> tuple:
    """Sort key of a version string (numeric parts compare as numbers): ``"10" > "9"``."""
    return _version_key(v)


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temporary file in the same directory, fsync, rename, fsync dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:  # pragma: no cover - some filesystems cannot fsync directories
        pass


def _mtime(ref: ArtifactRef) -> float:
    try:
        return (ref.path / MANIFEST_FILE).stat().st_mtime
    except OSError:
        return 0.0


class ModelControl:
    """Load/activate/unload/rescan policy over a :class:`ModelRegistry`.

    Args:
        settings: the service settings (``models_dir``, ``data_dir``, ``default_model``,
            ``model_control``, ``model_poll_interval_s``).
        registry: the registry that serves requests.
        metrics: passed to :func:`load_model`.
    """

    def __init__(self, settings: Settings, registry: ModelRegistry, metrics: Metrics) -> None:
        self.settings = settings
        self.registry = registry
        self.metrics = metrics
        self.models_dir = Path(settings.models_dir)
        self.state_path = Path(settings.data_dir) / ACTIVE_FILE
        self.failures: dict[str, LoadFailure] = {}
        self.listeners: list[Listener] = []
        # users (the collections) register a callable returning ``{(user, model_id)}`` pairs they still need
        self.in_use: list[Callable[[], set[tuple[str, str]]]] = []
        self._lock = asyncio.Lock()
        self._seen: dict[str, float] = {}
        self._poll_task: asyncio.Task | None = None
        self.last_poll: float | None = None

    # ------------------------------------------------------------------ state
    def read_persisted(self) -> tuple[str, str] | None:
        """``(name, version)`` of the last activated model, or None (no file, or unreadable: logged)."""
        try:
            d = json.loads(self.state_path.read_text(encoding="utf-8"))
            return str(d["name"]), str(d["version"])
        except FileNotFoundError:
            return None
        except Exception as e:
            log.error("%s is unreadable (%s); ignoring it", self.state_path, e)
            return None

    def persist(self, info: ModelInfo) -> None:
        """Record ``info`` as the active model in ``<data_dir>/active_model.json`` (atomic)."""
        write_json_atomic(
            self.state_path,
            {
                "name": info.name,
                "version": info.version,
                "sha256": info.sha256,
                "activated_at": time.time(),
            },
        )

    # ------------------------------------------------------------------ lifecycle
    async def startup(self) -> LoadedModel:
        """Load and activate the persisted active model, else ``settings.default_model``; load the rerankers of
        ``settings.rerank_models``; start polling if asked.

        A persisted model that no longer loads, or is no longer in ``models_dir``, is logged and the default model
        is used instead.

        Raises:
            ModelLoadError: the model to start with, or a reranker to load, cannot be loaded.
            ModelNotFound: a reranker named in ``rerank_models`` is not in ``models_dir``.
        """
        lm: LoadedModel | None = None
        persisted = self.read_persisted()
        if persisted is not None:
            name, version = persisted
            try:
                lm = await self._load_unlocked(name, version)
                log.info("restored active model %s from %s", lm.info.id, self.state_path)
            except (ModelLoadError, ModelNotFound) as e:  # no longer loads, or no longer on disk
                log.error(
                    "persisted active model %s:%s cannot be loaded (%s); starting with %s",
                    name,
                    version,
                    e,
                    self.settings.default_model,
                )
        if lm is None:
            lm = await self._load_unlocked(self.settings.default_model, None)
        self.registry.set_active(lm.info.id)
        for name in self.settings.rerank_models:  # served by the rerank routes beside the active model
            await self._load_unlocked(name, None)
        self._seen = {f"{r.name}:{r.version}": _mtime(r) for r in find_artifacts(self.models_dir)}
        if self.settings.model_control == "poll":
            self._poll_task = asyncio.get_running_loop().create_task(self._poll(), name="model-control-poll")
        return lm

    async def close(self) -> None:
        """Stop the poll watcher (the registry is closed by the app)."""
        await cancel_and_wait(self._poll_task)
        self._poll_task = None

    # ------------------------------------------------------------------ operations
    def _resolve(self, name: str, version: str | None) -> ArtifactRef:
        try:
            return resolve_artifact(self.models_dir, name, version)
        except ArtifactError as e:
            raise ModelNotFound(f"{name}:{version}" if version else name, self._available_ids()) from e

    def _available_ids(self) -> list[str]:
        return [f"{r.name}:{r.version}" for r in find_artifacts(self.models_dir)]

    async def _load_unlocked(self, name: str, version: str | None) -> LoadedModel:
        ref = self._resolve(name, version)
        model_id = f"{ref.name}:{ref.version}"
        try:
            existing = self.registry.get(model_id)
        except ModelNotFound:
            existing = None
        if existing is not None and existing.info.id == model_id:
            return existing
        try:
            lm = await load_model(self.settings, self.metrics, ref.name, ref.version)
        except ModelLoadError as e:
            self.failures[model_id] = LoadFailure(str(e), time.time(), _mtime(ref))
            log.error("load of %s failed: %s", model_id, e)
            raise
        if (lm.info.name, lm.info.version) != (ref.name, ref.version):
            await lm.batcher.close()
            msg = (
                f"{ref.path}: manifest says {lm.info.name}:{lm.info.version}, but the artifact sits at "
                f"{model_id}; fix the manifest or move the directory"
            )
            self.failures[model_id] = LoadFailure(msg, time.time(), _mtime(ref))
            raise ModelLoadError(msg)
        self.failures.pop(model_id, None)
        self.registry.add(lm, activate=False)
        log.info("loaded %s (%d dims) from %s", model_id, lm.info.dimension, ref.path)
        return lm

    async def load(self, name: str, version: str | None = None) -> LoadedModel:
        """Load ``name`` (newest version unless ``version``) without activating it; a no-op when already loaded.

        Raises:
            ModelNotFound: no such artifact in ``models_dir``.
            ModelLoadError: invalid manifest, unopenable ONNX, tokenizer, warm-up or canary failure.
        """
        async with self._lock:
            return await self._load_unlocked(name, version)

    async def activate(self, name: str, version: str | None = None) -> tuple[LoadedModel, ModelInfo | None]:
        """Make ``name`` (``version``, else its newest version on disk) the active model, loading it first if needed.

        Returns:
            ``(new active model, previous active ModelInfo or None)``.

        Raises:
            ModelNotFound, ModelLoadError: as :meth:`load`; the active model is unchanged.
            WrongModelTask: ``name`` is a reranker (it is loaded, never active); the active model is unchanged.
            OSError: the choice could not be persisted; the active model is unchanged.
        """
        async with self._lock:
            lm = await self._load_unlocked(name, version)
            if lm.is_reranker:  # checked before anything is persisted
                raise WrongModelTask(lm.info.name, "reranker", "embedding")
            prev = self.registry.active
            prev_info = prev.info if prev is not None else None
            self.persist(lm.info)
            self.registry.set_active(lm.info.id)
        log.info("activated %s (previous: %s)", lm.info.id, prev_info.id if prev_info else None)
        if prev_info is None or prev_info.id != lm.info.id or prev_info.sha256 != lm.info.sha256:
            for cb in list(self.listeners):
                try:
                    await cb(prev_info, lm.info)
                except Exception:
                    log.exception("activation listener failed")
        return lm, prev_info

    def users_of(self, model_id: str) -> set[str]:
        """Names of collections (or other users) that still need ``model_id`` loaded."""
        out: set[str] = set()
        for fn in self.in_use:
            try:
                out |= {u for u, mid in fn() if mid == model_id}
            except Exception:
                log.exception("in-use callback failed")
        return out

    async def unload(self, name: str, version: str | None = None) -> list[str]:
        """Unload ``name:version`` (every non-active loaded version of ``name`` when no version); returns their ids.

        Waits for each model's queued work to finish.

        Raises:
            ModelNotFound: nothing matching is loaded.
            ModelInUse: it is the active model, or collections still search with it.
        """
        async with self._lock:
            act = self.registry.active
            if version is not None:
                targets = [m for m in self.registry.all() if m.info.name == name and m.info.version == version]
            else:
                targets = [m for m in self.registry.all() if m.info.name == name and m is not act]
                if not targets and act is not None and act.info.name == name:
                    targets = [act]
            if not targets:
                raise ModelNotFound(f"{name}:{version}" if version else name, [m.info.id for m in self.registry.all()])
            for m in targets:
                if m is act:
                    raise ModelInUse(f"{m.info.id} is the active model; activate another one first")
                users = self.users_of(m.info.id)
                if users:
                    raise ModelInUse(
                        f"{m.info.id} is still used by collections {sorted(users)} "
                        f"(re-embedding to the active model is not finished)"
                    )
            for m in targets:
                await self.registry.remove(m.info.id)
                log.info("unloaded %s", m.info.id)
            return [m.info.id for m in targets]

    async def rescan(self, activate_new: bool | None = None) -> dict[str, Any]:
        """Re-read ``models_dir``: forget failures of artifacts that changed or vanished, and report what appeared.

        With ``activate_new`` (default: ``model_control == "poll"``), a version of the active model's name
        that appeared since the last scan and is newer than the active one is loaded and activated (the
        newest that loads; a failure is recorded and reported, never raised).

        Returns:
            ``{"available": [ids], "new": [ids], "activated": id or None, "errors": {id: message}}``.
        """
        refs = find_artifacts(self.models_dir)
        now = {f"{r.name}:{r.version}": (r, _mtime(r)) for r in refs}
        new = [k for k, (_, mt) in now.items() if self._seen.get(k) != mt]
        for k in list(self.failures):
            if k not in now or now[k][1] != self.failures[k].manifest_mtime:
                del self.failures[k]
        self._seen = {k: mt for k, (_, mt) in now.items()}
        activated = None
        errors: dict[str, str] = {}
        act = self.registry.active
        if activate_new is None:
            activate_new = self.settings.model_control == "poll"
        if act is not None and activate_new:
            candidates = sorted(
                (
                    now[k][0]
                    for k in new
                    if now[k][0].name == act.info.name
                    and version_key(now[k][0].version) > version_key(act.info.version)
                    and k not in self.failures
                ),
                key=lambda r: version_key(r.version),
                reverse=True,
            )
            for ref in candidates:
                try:
                    lm, _ = await self.activate(ref.name, ref.version)
                    activated = lm.info.id
                    break
                except (ModelLoadError, ModelNotFound, OSError) as e:
                    errors[f"{ref.name}:{ref.version}"] = str(e)
        self.last_poll = time.time()
        return {"available": list(now), "new": new, "activated": activated, "errors": errors}

    async def _poll(self) -> None:
        interval = self.settings.model_poll_interval_s
        while True:
            await asyncio.sleep(interval)
            try:
                res = await self.rescan()
                if res["activated"] or res["errors"]:
                    log.info("model poll: %s", res)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("model poll failed")

    # ------------------------------------------------------------------ reporting
    def available(self) -> list[dict[str, Any]]:
        """Every artifact in ``models_dir``: ``{id, name, version, path, loaded, active, load_error}``."""
        act = self.registry.active
        loaded = {m.info.id: m for m in self.registry.all()}
        out = []
        for r in find_artifacts(self.models_dir):
            k = f"{r.name}:{r.version}"
            f = self.failures.get(k)
            out.append(
                {
                    "id": k,
                    "name": r.name,
                    "version": r.version,
                    "path": str(r.path),
                    "loaded": k in loaded,
                    "active": act is not None and act.info.id == k,
                    "load_error": f.error if f else None,
                }
            )
        return out
