"""The core's loaded models, published to the fronts that run models themselves (``front_inference``).

The core writes :data:`MODELS_FILE` in the supervisor's private runtime directory after every change of its
:class:`~service.inference.model_registry.ModelRegistry` (a model added, activated or removed), before the call that
made the change returns: an activation answered by ``/admin`` is already in the file. The file names the active
model and every loaded one (``name:version``, name, sha256, artifact directory, whether it is a reranker), in the
order they were added, so a front resolves a request's ``model`` field exactly as the core would
(:func:`~service.inference.model_registry.resolve_id`). It is replaced whole (``artifact_contract.fsio``: a new inode), so a
front sees a change with one ``stat`` per request. A front that cannot read it runs nothing itself.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from artifact_contract.fsio import atomic_write_json
from service.inference.model_registry import LoadedModel, ModelRegistry, resolve_id

log = logging.getLogger("service.front")

#: the published models' file, in the supervisor's runtime directory
MODELS_FILE = "models.json"


@dataclass(frozen=True)
class PublishedModel:
    """One model the core has loaded: ``id`` is its ``name:version``; ``path`` its artifact directory."""

    id: str
    name: str
    version: str
    sha256: str
    path: str
    reranker: bool


@dataclass(frozen=True)
class Published:
    """The core's registry as published: its models in the order they were added, and the active one's id."""

    active: str | None
    models: tuple[PublishedModel, ...]

    def resolve(self, name: str | None) -> PublishedModel | None:
        """The model the core would run for a request's ``model`` field (None: the field names nothing loaded)."""
        found = resolve_id(name, [(m.id, m.name) for m in self.models], self.active)
        return next((m for m in self.models if m.id == found), None)


NOTHING = Published(None, ())


def publish(path: Path, registry: ModelRegistry) -> None:
    """Write ``registry`` to ``path`` (:data:`MODELS_FILE`), replacing it whole. If that fails the file is removed
    (a front then runs nothing itself) and the error logged: a stale file would let a front run a model the core
    no longer does."""
    active = registry.active
    models = [_entry(lm) for lm in registry.in_order()]
    body = {"active": active.info.id if active is not None else None, "models": models}
    try:
        atomic_write_json(path, body, indent=None, mode=0o600)
    except OSError as e:
        log.error("could not publish the loaded models to %s (%s); the fronts run no model themselves", path, e)
        path.unlink(missing_ok=True)


def _entry(lm: LoadedModel) -> dict[str, object]:
    i = lm.info
    return {
        "id": i.id,
        "name": i.name,
        "version": i.version,
        "sha256": i.sha256,
        "path": os.path.abspath(lm.model.path),
        "reranker": lm.is_reranker,
    }


def read(path: Path) -> Published:
    """The models published at ``path``; :data:`NOTHING` when it is missing or unreadable."""
    try:
        body = json.loads(path.read_text())
        return Published(body["active"], tuple(PublishedModel(**m) for m in body["models"]))
    except (OSError, ValueError, KeyError, TypeError) as e:
        if not isinstance(e, FileNotFoundError):
            log.warning("front: cannot read the published models at %s (%s); running none here", path, e)
        return NOTHING
