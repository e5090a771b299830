"""A named vector added to, or deleted from, an existing collection (Qdrant API reference: "Create vector name",
``PUT /collections/{collection_name}/vectors/{vector_name}``, and "Delete vector name", ``DELETE`` on the same path;
qdrant-client's ``create_vector_name`` / ``delete_vector_name``). The new vectors config is computed here
(:func:`with_vector`, :func:`without_vector`) and applied by the backend (:meth:`~.backend.VectorBackend.
update_vectors`) under the collection's write lock, atomically and durably.

As in Qdrant (and qdrant-client's local mode):

* the points already stored hold no value of a vector added (``$has_vector`` does not match them; a later write may
  give it);
* adding a vector the collection has with the same definition (size, distance, multivector; modifier) changes
  nothing, with another definition (or of the other kind) is refused;
* deleting a vector drops its definition and every stored value of it (a vector added again under that name starts
  empty); deleting a name the collection lacks changes nothing; the unnamed vector cannot be deleted while it is the
  only dense one.

Here, moreover: a vector added is the client's (a model-bound one would have to embed every stored text: create the
collection with it) or a sparse vector made by a server-side sparse model (``qdrant/bm25``: for the points written
after); the model-bound vector cannot be deleted (the collection's model, its re-embedding and the native ``vector``
are its). The milvus backend holds one vector per collection and refuses every change (422 ``unsupported``).
"""

from __future__ import annotations

from typing import Any

from service.collections.errors import InvalidCollectionRequest
from service.collections.schema import MAX_VECTORS, DenseVector, SparseVector, VectorsConfig, new_vectors_config


def _same(a: DenseVector | SparseVector, b: DenseVector | SparseVector) -> bool:
    """Whether two vectors have the same definition, as Qdrant compares them (not the index: Qdrant infers it)."""
    if isinstance(a, DenseVector) and isinstance(b, DenseVector):
        return (a.spec.dimension, a.spec.metric, a.multivector) == (b.spec.dimension, b.spec.metric, b.multivector)
    return (
        isinstance(a, SparseVector) and isinstance(b, SparseVector) and (a.modifier, a.model) == (b.modifier, b.model)
    )


def with_vector(
    cfg: VectorsConfig,
    name: str,
    dense: dict[str, Any] | None = None,
    sparse: dict[str, Any] | None = None,
    sparse_models: tuple[str, ...] = (),
) -> VectorsConfig | None:
    """``cfg`` with the vector ``name`` added: ``dense`` ``{size, metric, index, params, multivector}`` or ``sparse``
    ``{modifier, model}``, as :func:`~.schema.new_vectors_config` takes them; None when ``cfg`` has it already with
    the same definition (nothing to change).

    Raises:
        InvalidCollectionRequest: not exactly one of ``dense`` and ``sparse``; ``dense`` bound to the model; a bad
            name, size, metric, index, modifier or sparse model; ``name`` taken by a vector of another definition;
            :data:`~.schema.MAX_VECTORS` of that kind already.
    """
    if (dense is None) == (sparse is None):
        raise InvalidCollectionRequest("give exactly one of 'dense' and 'sparse'", "vector_config")
    if dense is not None and dense.get("bound"):
        raise InvalidCollectionRequest(
            f"vector {name!r}: a vector added to an existing collection is supplied by the client (binding one to the "
            "model would embed every stored text): create the collection with it",
            "model",
        )
    one = new_vectors_config({name: dense} if dense else {}, {name: sparse} if sparse else {}, None, 0, sparse_models)
    new = one.dense[name] if dense else one.sparse[name]
    old = cfg.dense.get(name) or cfg.sparse.get(name)
    if old is not None:
        if _same(old, new):
            return None
        kind = "dense" if isinstance(old, DenseVector) else "sparse"
        raise InvalidCollectionRequest(
            f"the collection has a {kind} vector named {name!r} of another definition: delete it first", "vector_name"
        )
    if len(cfg.dense if dense else cfg.sparse) >= MAX_VECTORS:
        raise InvalidCollectionRequest(
            f"at most {MAX_VECTORS} {'dense' if dense else 'sparse'} vectors per collection", "vector_name"
        )
    return VectorsConfig({**cfg.dense, **one.dense}, {**cfg.sparse, **one.sparse}, cfg.metadata)


def without_vector(cfg: VectorsConfig, name: str) -> VectorsConfig | None:
    """``cfg`` without the vector ``name``; None when it has no such vector (nothing to change).

    Raises:
        InvalidCollectionRequest: ``name`` is the model-bound vector, or the unnamed vector and the only dense one.
    """
    if name not in cfg.dense and name not in cfg.sparse:
        return None
    if (b := cfg.bound) is not None and b.name == name:
        raise InvalidCollectionRequest(
            f"{name!r} is the model-bound vector (the service embeds it from each point's text; the collection's model "
            "and its re-embedding are its): it cannot be deleted",
            "vector_name",
        )
    if name == "" and set(cfg.dense) == {""}:
        raise InvalidCollectionRequest(
            "the unnamed vector is the only dense vector: it cannot be deleted", "vector_name"
        )
    return VectorsConfig(
        {n: v for n, v in cfg.dense.items() if n != name},
        {n: v for n, v in cfg.sparse.items() if n != name},
        cfg.metadata,
    )
