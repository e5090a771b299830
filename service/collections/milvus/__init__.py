"""The milvus collections backend: collections in a Milvus server or cluster, shared by several service replicas.

* :mod:`.registry`: the shared records (collection, re-embedding status, claims, retired collections).
* :mod:`.schema`: the physical Milvus collections' fields, index mapping and scores.
* :mod:`.expr`: payload filters as Milvus expressions.
* :mod:`.collection`: one collection (points, search, the record view).
* :mod:`.target`: re-embedding safe with several replicas (claim, dual writes, sweep, atomic switch).
* :mod:`.backend`: the backend (connect, refresh, create, delete).
"""

from service.collections.milvus.backend import MilvusBackend

__all__ = ["MilvusBackend"]
