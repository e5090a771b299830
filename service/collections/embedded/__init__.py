"""The embedded collections backend: SQLite (the truth) plus FAISS indexes, in the service's own process.

* :mod:`.store`: one SQLite file per collection (points, removals, meta; a re-embedding's target vectors).
* :mod:`.snapshots`: FAISS index snapshots and the replay of later writes at open.
* :mod:`.collection`: a store plus its index, with the locking that keeps searches consistent.
* :mod:`.target`: a re-embedding's target vectors and the switch.
* :mod:`.backend`: every collection under ``<data_dir>/collections/`` and background upkeep.
"""

from service.collections.embedded.backend import EmbeddedBackend
from service.collections.embedded.collection import Collection

__all__ = ["Collection", "EmbeddedBackend"]
