"""Domain exceptions of the collections. ``service.http.errors.ERROR_TABLE`` maps each to its HTTP answer; nothing in
this package builds an HTTP error itself."""

from __future__ import annotations


class CollectionError(Exception):
    """Base of the collections' domain errors. ``param``: the request field at fault, if any."""

    param: str | None = None

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        if param is not None:
            self.param = param


class CollectionsNotReady(CollectionError):
    """The collections subsystem is not started yet (or is shutting down)."""


class CollectionNotFound(CollectionError):
    """No collection of that name (or it was deleted while the request waited)."""

    param = "name"


class CollectionClosed(CollectionNotFound):
    """The collection was deleted or closed while an operation waited."""


class CollectionExists(CollectionError):
    """A collection of that name exists already."""

    param = "name"


class InvalidCollectionRequest(CollectionError):
    """A value the collections cannot accept (name, index params, filter, query, top_k).

    Args:
        code: ``invalid_value``, ``invalid_filter`` or ``wrong_dimension``.
    """

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_value") -> None:
        super().__init__(message, param)
        self.code = code


class TooManyItems(CollectionError):
    """More points, searches or examples in one request than the configured maximum. ``code``: ``too_many_points``,
    ``too_many_searches`` or ``too_many_examples``."""

    def __init__(self, message: str, param: str, code: str) -> None:
        super().__init__(message, param)
        self.code = code


class ResponseTooLarge(CollectionError):
    """A search's hits (texts and payloads included) exceed ``collections_max_response_bytes``."""


class AliasNotFound(CollectionError):
    """No collection alias of that name."""

    param = "alias_name"


class SnapshotNotFound(CollectionError):
    """No snapshot of that name for the collection."""

    param = "snapshot_name"


class PointNotFound(CollectionError):
    """No point with that id."""

    param = "id"


class BackendUnavailable(CollectionError):
    """The shared vector store (Milvus) cannot be reached or is still loading a collection; the request did nothing
    that is not safe to retry (a write may or may not have been applied: upserts and deletes are idempotent).

    Args:
        retry_after_s: seconds the client should wait before retrying.
    """

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class RegistryIncomplete(BackendUnavailable):
    """The milvus backend's registry has no record for a collection that Milvus still holds (its alias exists): a
    registry read that came back short (e.g. while Milvus reloads after a restart). Answered as
    :class:`BackendUnavailable` (503, retry), never as "not found"."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"the registry of collections has no row for {name!r} although Milvus holds it (registry not fully "
            "loaded?); retry shortly",
            2.0,
        )


class ModelUnavailable(CollectionError):
    """The exact model (name, version, sha256) that embedded the collection is not loaded."""


class ReembeddingInProgress(CollectionError):
    """A write the running re-embedding cannot follow (a point given as a vector without text: its vector for the
    target model cannot be made); retry once the re-embedding completes."""


class ModelChanged(CollectionError):
    """The collection's model, or its re-embedding target, changed since the caller embedded; embed again and
    retry (up to :data:`RETRIES` times)."""


RETRIES = 3  # attempts of an operation that a re-embedding swap interrupts (ModelChanged), each with the new model


class ModelNotReady(CollectionError):
    """Inference is not ready: the service is starting and no model is loaded yet (the port's error)."""


class ModelNotFound(CollectionError):
    """No loaded model answers to the requested name (the port's error); ``param``: the request field naming it."""

    param = "model"


class RerankerNotLoaded(ModelNotFound):
    """A rerank named no model and no reranker is loaded (the port's error)."""


class InferenceOverloaded(CollectionError):
    """The model's queue is full: the request was not taken; retry later (the port's error)."""
