"""Loaded models by name, one of them active (the default for requests that name none).

Each :class:`LoadedModel` pairs an :class:`~service.inference.onnx_encoder.OnnxModel` with its own
:class:`~service.inference.batcher.Batcher`, so several models (or versions) can be served at
once. A request resolves its model once, at the start, and finishes on that object
even if the active model changes meanwhile (what hot swap needs).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from artifact_contract import ArtifactError, resolve_artifact
from service.inference.batcher import Batcher
from service.inference.onnx_encoder import ModelInfo, ModelLoadError, OnnxModel
from service.inference.onnx_reranker import WrongModelTask, open_model
from service.metrics import Metrics
from service.settings import Settings

log = logging.getLogger("service.inference.model_registry")


class ModelNotFound(LookupError):
    """No loaded model answers to the requested name; ``available`` lists those that do."""

    def __init__(self, name: str, available: list[str]) -> None:
        super().__init__(f"model {name!r} is not loaded (available: {', '.join(available) or 'none'})")
        self.name, self.available = name, available


@dataclass(eq=False)
class LoadedModel:
    """A model ready to serve: the ONNX backend and its batcher."""

    model: OnnxModel
    batcher: Batcher

    @property
    def info(self) -> ModelInfo:
        """The model's identity: name, version, sha256, full dimension, ``max_seq_length`` in tokens."""
        return self.model.info

    @property
    def is_reranker(self) -> bool:
        """A cross-encoder (manifest ``task: "reranker"``): served by the rerank routes only, never active."""
        return self.model.manifest.is_reranker


async def load_model(
    settings: Settings, metrics: Metrics, name: str, version: str | None = None, *, path: Path | None = None
) -> LoadedModel:
    """Locate ``name`` (latest version unless given) in ``settings.models_dir``, load, warm up, check the canary.

    Loading runs in a worker thread; the batcher is started on the running loop. ``path``: load that artifact
    directory instead (``name`` and ``version`` unused).

    Raises:
        ModelLoadError: not found, invalid, or failed warm-up/canary (message names the artifact).
    """
    try:
        where = path if path is not None else resolve_artifact(Path(settings.models_dir), name, version).path
    except ArtifactError as e:
        raise ModelLoadError(str(e)) from e

    def _load() -> OnnxModel:
        m = open_model(  # an OnnxReranker for a reranker artifact
            where,
            providers=settings.providers,
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
            spinning=settings.ort_spinning,
            arena_shrink_tokens=settings.ort_arena_shrink_tokens,
        )
        secs = m.warm_up(batch_size=min(8, settings.batching(m.providers)["max_batch_size"]))
        log.info("loaded %s from %s on %s (warm-up %.2fs)", m.info.id, where, m.providers, secs)
        return m

    model = await asyncio.to_thread(_load)
    batcher = Batcher(
        model,
        metrics,
        **settings.batching(model.providers),  # by the provider the model runs on, where not set
        max_queue_size=settings.max_queue_size,
        inference_workers=settings.inference_workers,
        tokenizer_threads=settings.tokenizer_threads,
        max_request_tokens=settings.max_request_tokens,
    )
    batcher.start()
    return LoadedModel(model, batcher)


def resolve_id(name: str | None, models: list[tuple[str, str]], active: str | None) -> str | None:
    """The ``name:version`` a request's ``model`` field names: :meth:`ModelRegistry.get`'s rule, on ids alone.

    Args:
        name: the request's ``model`` field (None or ``""``: the active model).
        models: ``(name:version, name)`` of the loaded models, in the order they were added.
        active: the active model's ``name:version``, or None.

    Returns:
        ``active`` for None / ``""``; ``name`` when it is a loaded ``name:version``; the active model when it has
        that name; else the last added version of that name; None when nothing answers to it.
    """
    if name is None or name == "":
        return active
    ids = dict(models)
    if name in ids:
        return name
    if active is not None and ids.get(active) == name:
        return active
    same = [k for k, n in models if n == name]
    return same[-1] if same else None


class ModelRegistry:
    """Loaded models keyed by ``name:version``; one is active.

    Lookup (:meth:`get`) accepts ``None`` (the active model), ``name`` (the active
    model if it has that name, else the newest loaded version of it) or ``name:version``
    (:func:`resolve_id`). ``listeners`` are called with the registry after every change (a model added, activated
    or removed), before the call that made it returns.
    """

    def __init__(self, metrics: Metrics) -> None:
        self._models: dict[str, LoadedModel] = {}
        self._active: str | None = None
        self._metrics = metrics
        self.listeners: list[Callable[[ModelRegistry], None]] = []

    def add(self, lm: LoadedModel, *, activate: bool = False) -> None:
        """Register a loaded model (replacing one with the same ``name:version``); optionally make it active."""
        self._models[lm.info.id] = lm
        if activate or self._active is None:
            self._active = lm.info.id
        self._changed()

    def set_active(self, model_id: str) -> LoadedModel:
        """Make a loaded model active (an atomic pointer swap; requests already running keep their model).

        Raises:
            ModelNotFound: ``model_id`` is not loaded.
            WrongModelTask: it is a reranker (the active model embeds requests and collections).
        """
        lm = self.get(model_id)
        if lm.is_reranker:
            raise WrongModelTask(lm.info.name, "reranker", "embedding")
        self._active = lm.info.id
        self._changed()
        return lm

    @property
    def active(self) -> LoadedModel | None:
        """The active model, or None before any is loaded."""
        return self._models.get(self._active) if self._active else None

    def in_order(self) -> list[LoadedModel]:
        """Loaded models in the order they were added (a model re-added with the same ``name:version`` keeps its
        place): the order :meth:`get` breaks ties by."""
        return list(self._models.values())

    def all(self) -> list[LoadedModel]:
        """Loaded models, active first."""
        act = self.active
        return ([act] if act else []) + [m for m in self._models.values() if m is not act]

    def get(self, name: str | None = None) -> LoadedModel:
        """Resolve a request's ``model`` field.

        Raises:
            ModelNotFound: nothing loaded answers to ``name``.
        """
        found = resolve_id(name, [(k, m.info.name) for k, m in self._models.items()], self._active)
        if found is None:
            if name is None or name == "":
                raise ModelNotFound("<default>", [])
            raise ModelNotFound(name, sorted({m.info.name for m in self._models.values()} | set(self._models)))
        return self._models[found]

    async def remove(self, model_id: str) -> None:
        """Unload a model after its queued work finishes. The active model cannot be removed.

        Raises:
            ModelNotFound: not loaded.
            ValueError: it is the active model.
        """
        lm = self.get(model_id)
        if lm.info.id == self._active:
            raise ValueError(f"{model_id} is the active model; activate another first")
        del self._models[lm.info.id]
        self._changed()
        await lm.batcher.close()

    async def close(self) -> None:
        """Drain and stop every model's batcher."""
        models, self._models, self._active = list(self._models.values()), {}, None
        for lm in models:
            await lm.batcher.close()
        self._changed()

    def _changed(self) -> None:
        """After every change: the models gauge, then the listeners."""
        self._metrics.set_models(self._model_rows())
        for listener in self.listeners:
            listener(self)

    def _model_rows(self) -> list[dict[str, str]]:
        rows = []
        for k, lm in self._models.items():
            i = lm.info
            rows.append(
                {
                    "name": i.name,
                    "version": i.version,
                    "sha256": i.sha256,
                    "quantization": i.quantization or "none",
                    "providers": ",".join(lm.model.providers),
                    "active": "true" if k == self._active else "false",
                }
            )
        return rows
