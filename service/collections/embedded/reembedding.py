"""The re-embedding attached to an embedded collection (a part of :class:`~.collection.Collection`): the
:class:`~.target.EmbeddedTarget` towards another model that every upsert also writes, and the index of its vectors
built for the switch. Only the model-bound vector is re-embedded; the collection's other named vectors are the
client's and stay. The owning collection holds its locks around everything here and does the switch.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from service.collections.embedded.target import EmbeddedTarget
from service.collections.index import VectorIndex, get_type
from service.collections.vector_backend import model_id

log = logging.getLogger("service.collections")


class Reembedding:
    """The attached re-embedding target of one collection named ``name`` (``target``, None when none is attached)."""

    def __init__(self, name: str) -> None:
        self.name = name  # the collection's (for logs)
        self.target: EmbeddedTarget | None = None

    @property
    def model(self) -> dict[str, Any] | None:
        """The attached target's model (upserts must carry its vectors too), else None."""
        t = self.target
        return dict(t.model) if t is not None else None

    def attach(self, target: EmbeddedTarget) -> None:
        """Write ``target``'s vectors from now on; a target attached before is abandoned."""
        if self.target is not None:
            self.target.abandoned = True
        self.target = target

    def detach(self, target: EmbeddedTarget) -> None:
        """Stop writing ``target``'s vectors (if it is still the attached one)."""
        if self.target is target:
            self.target = None

    def ready(self, target: EmbeddedTarget) -> bool:
        """Whether ``target`` is the attached one and every live point has a target vector."""
        return self.target is target and not target.table.missing()

    @staticmethod
    def build(target: EmbeddedTarget, count: int) -> tuple[VectorIndex, float]:
        """``(index of the target vectors, seconds it took)``, trained on a sample of them when the index type trains
        and ``count`` (live points) suffices."""
        spec = target.spec
        n = get_type(spec.kind).train_sample_size(spec, count)
        t0 = time.monotonic()
        index = VectorIndex.build(spec, target.table.iter_vectors(), train_sample=target.table.sample(n) if n else None)
        return index, time.monotonic() - t0

    def finish(self, target: EmbeddedTarget, count: int, built: float) -> None:
        """Detach ``target`` once switched to and mark its status completed (``count`` points; its index was
        ``built`` in that many seconds)."""
        self.target = None
        target.status.update(state="completed", done=count, total=count, finished_at=time.time())
        log.info(
            "collection %s: switched to %s (%d points, dimension %d; index built in %.2fs)",
            self.name,
            model_id(target.model),
            count,
            target.spec.dimension,
            built,
        )
