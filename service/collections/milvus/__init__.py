"""The milvus collections backend: collections in a Milvus server or cluster, shared by several service replicas.

* :mod:`.catalog`: the shared registry (collection records, re-embedding status, claims, retired collections).
* :mod:`.schema`: the physical Milvus collections' fields, index mapping and scores.
* :mod:`.physical`: the physical Milvus collections (names, aliases, retirement, the sweep of what a crash left).
* :mod:`.lifecycle`: creating and deleting a collection, safe with several replicas and crashes.
* :mod:`.expr`: payload filters as Milvus expressions.
* :mod:`.collection`: one collection (points, search, the record view).
* :mod:`.target`: re-embedding safe with several replicas (claim, dual writes, sweep, atomic switch).
* :mod:`.backend`: the backend composing them (connect, refresh, calls on its threads).
"""

from service.collections.milvus.backend import MilvusBackend

__all__ = ["MilvusBackend"]
