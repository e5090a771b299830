"""The collections' backend interface: what the collection service, the re-embedder and the routes need from the
place where points live. Two backends implement it: ``embedded`` (SQLite + FAISS in this process, the default;
:mod:`.embedded`) and ``milvus`` (a Milvus server or cluster shared by several service replicas; :mod:`.milvus`).
``EMBED_COLLECTIONS_BACKEND`` chooses; ``service.collections.open_backend`` builds it.

Three roles:

* :class:`VectorBackend`: the set of collections (create, get, list, delete), a thread pool for blocking calls, and
  start/close.
* :class:`CollectionHandle`: one collection: upsert, delete, get, search, its model record and index spec, and
  :meth:`CollectionHandle.begin_reembed`.
* :class:`ReembedTarget`: one re-embedding of a collection towards another model, resumable: the points still
  lacking a vector of the target model, writing those vectors, and the atomic switch.

What a read asks for and answers (:class:`~.reads.Hit`, :class:`~.reads.ReadConsistency`,
:class:`~.reads.ResponseBudget`) is :mod:`.reads`'.

Every method of a handle or target blocks (SQLite, FAISS, network): call them through :meth:`VectorBackend.run`.
Every error is a domain exception of :mod:`.errors`.

Model records are dicts ``{name, version, sha256}``: vectors are only ever compared with vectors made by the same
artifact (:func:`same_model`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np

from service.collections.errors import InvalidCollectionRequest
from service.collections.filters import Filter
from service.collections.index import IndexSpec, QuantizationSearch
from service.collections.payload_indexes import PayloadIndex
from service.collections.reads import STRONG, Hit, ReadConsistency, ResponseBudget
from service.collections.schema import SparseVec, VectorsConfig, index_spec

T = TypeVar("T")

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # \Z, not $: "$" also matches before a final newline


def same_model(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two model records (``{name, version, sha256}``) denote the same artifact."""
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in ("name", "version", "sha256"))


def new_spec(name: str, kind: str, params: dict[str, Any] | None, metric: str, dimension: int) -> IndexSpec:
    """The index spec of a collection about to be created, every value checked (any backend).

    Raises:
        InvalidCollectionRequest: the name does not match :data:`NAME_RE`, or the index type, params or metric are
            invalid.
    """
    check_name(name)
    return index_spec(kind, params, metric, dimension, "params")


def single_config(
    name: str, kind: str, params: dict[str, Any] | None, metric: str, model: dict[str, Any], dimension: int
) -> VectorsConfig:
    """The vectors config of a collection with one model-bound unnamed vector (what every collection was before named
    vectors), every value checked (:func:`new_spec`).

    Raises:
        InvalidCollectionRequest: as :func:`new_spec`.
    """
    return VectorsConfig.single(new_spec(name, kind, params, metric, dimension), model)


def check_name(name: str) -> None:
    """Raises :class:`~.errors.InvalidCollectionRequest` unless ``name`` matches :data:`NAME_RE`."""
    if not NAME_RE.match(name):
        raise InvalidCollectionRequest(f"collection name {name!r} must match {NAME_RE.pattern}", param="name")


def model_id(model: dict[str, Any]) -> str:
    """``name:version`` of a model record."""
    return f"{model['name']}:{model['version']}"


class CollectionSettings:
    """The collection tuning knobs: a view of the service :class:`~service.settings.Settings`' ``collections_*`` fields.

    ``CollectionSettings(settings).snapshot_every`` is ``settings.collections_snapshot_every``
    (flag ``--collections-snapshot-every``, env ``EMBED_COLLECTIONS_SNAPSHOT_EVERY``).
    One settings object per package: the fields and their defaults live in ``service/settings.py``.
    """

    def __init__(self, settings: Any = None) -> None:
        from service.settings import Settings

        self._settings = settings if settings is not None else Settings()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._settings, f"collections_{name}")


class ReembedTarget(Protocol):
    """A resumable re-embedding of one collection towards ``model`` (dimension ``dimension``).

    ``status`` is the progress dict shown under ``reembedding`` in the collection's info:
    ``{state, target_model, dimension, done, total, rate_per_s, started_at, finished_at, error}``.
    """

    model: dict[str, Any]
    dimension: int
    status: dict[str, Any]

    def pending(self, cursor: Any, limit: int) -> tuple[list[tuple[Any, str]], Any]:
        """Up to ``limit`` live points with no target vector yet, after ``cursor`` (None: from the start):
        ``([(ref, text)], next cursor)``; an empty list means the sweep reached the end."""

    def write(self, refs: Sequence[Any], vectors: np.ndarray) -> None:
        """Store target vectors (float32 ``(n, dimension)``) for the points ``refs`` from :meth:`pending`."""

    def complete(self) -> bool:
        """Switch the collection to the target atomically when every live point has a target vector.

        Returns:
            True when switched; False when points still lack a target vector (sweep again).
        """

    def publish_status(self) -> None:
        """Make ``status`` visible to every reader of the collection (other replicas included)."""

    def renew(self) -> bool:
        """Extend this process's claim on the re-embedding; False when it was lost (stop working on it)."""

    def abandon(self, drop: bool) -> None:
        """Stop: detach from the collection (writes no longer go to the target); ``drop`` also deletes the target
        vectors, else they stay for a later resume."""


class CollectionHandle(Protocol):
    """One collection. ``name``; ``spec`` (:class:`~.index.IndexSpec`: index kind, metric, params, dimension);
    ``model``: the record of the model that embedded its vectors."""

    name: str
    reembed_status: dict[str, Any] | None  # the last re-embedding's progress (see ReembedTarget.status)
    vectors: VectorsConfig  # the collection's named vectors (:mod:`.schema`)

    @property
    def spec(self) -> IndexSpec | None:
        """The model-bound vector's index spec: kind, metric, complete params, vector dimension (None without one)."""

    @property
    def model(self) -> dict[str, Any] | None:
        """The ``{name, version, sha256}`` record of the model that embedded the model-bound vectors (None: the
        collection has no model-bound vector)."""

    @property
    def count(self) -> int:
        """Live points."""

    @property
    def reembed_model(self) -> dict[str, Any] | None:
        """The target model of a running re-embedding (upserts must also carry its vectors), else None."""

    def info(self, consistency: ReadConsistency = STRONG) -> dict[str, Any]:
        """The description answered by ``GET /collections/{name}`` (its count read at ``consistency``)."""

    def upsert(
        self,
        ids: list[int | str],
        texts: list[str],
        payloads: list[dict[str, Any] | None],
        vectors: np.ndarray,
        *,
        model: dict[str, Any] | None = None,
        shadow_model: dict[str, Any] | None = None,
        shadow_vectors: np.ndarray | None = None,
        named: list[dict[str, np.ndarray | SparseVec]] | None = None,
    ) -> int:
        """Insert or replace points (a repeated id keeps its last occurrence); returns once durable and searchable.

        ``vectors``: float32 ``(n, dimension)`` of the model-bound vector, made by ``model`` (None: the collection
        has none); while a re-embedding runs, ``shadow_vectors`` (float32 ``(n, target dimension)``) made by its
        target ``shadow_model`` are written to it too. ``named``: per point, its other vectors by name (float32
        ``(d,)`` dense, :class:`~.schema.SparseVec` sparse; checked against :attr:`vectors` by the caller).

        Returns:
            the write's sequence number.

        Raises:
            CollectionClosed: the collection was deleted.
            ModelChanged: ``model`` is no longer the collection's, or a re-embedding runs and its vectors are
                missing (embed again and retry).
        """

    def delete(self, ids: list[int | str] | None = None, where: Filter | None = None) -> tuple[int, int]:
        """Delete by ids and/or payload filter; returns ``(deleted, sequence)`` once durable."""

    def get(
        self, point_id: int | str, with_vector: bool | list[str] = False, consistency: ReadConsistency = STRONG
    ) -> dict[str, Any] | None:
        """``{id, text, payload[, vector][, vectors]}`` or None, read at ``consistency``. ``with_vector``: True for
        every vector, or the names wanted: ``vector`` is the model-bound vector, ``vectors`` the other named ones
        the point holds (``{name: [float] | {indices, values}}``; present when the collection has any)."""

    def scroll(
        self,
        start: int | str | None,
        limit: int,
        where: Filter | None = None,
        with_vector: bool | list[str] = False,
        budget: ResponseBudget | None = None,
        with_text: bool = True,
        with_payload: bool = True,
    ) -> list[dict[str, Any]]:
        """Up to ``limit`` points ``{id, text, payload[, vector][, vectors]}`` (as :meth:`get`) matching ``where``, in
        id order, from the point whose id is ``start`` (inclusive; None: from the first). Embedded: Qdrant's order
        (integer ids numerically, then string ids by their UTF-8 bytes); Milvus: the stored keys' byte order
        (:func:`.ids.encode_id`: string ids before integer ids, integers as decimal text), the only order a Milvus
        2.3 query with a limit can walk. ``with_text``/``with_payload`` False: ``text``/``payload`` are None (not
        read). The points' bytes (:meth:`ResponseBudget.spend_point`: id, text and payload as read, the vectors
        asked for) are spent from ``budget`` before their texts, payloads and vectors are read where the backend can
        (embedded), else as they arrive.

        Raises:
            ResponseTooLarge: the points would exceed ``budget``.
        """

    def count_matching(self, where: Filter | None = None) -> int:
        """How many live points match ``where`` (None: all), counted exactly."""

    def search(
        self,
        queries: np.ndarray,
        top_k: int,
        where: Filter | None = None,
        score_threshold: float | None = None,
        with_payload: bool = True,
        with_text: bool = True,
        model: dict[str, Any] | None = None,
        budget: ResponseBudget | None = None,
        consistency: ReadConsistency = STRONG,
        using: str | None = None,
        exact: bool = False,
        quantization: QuantizationSearch | None = None,
        hnsw_ef: int | None = None,
    ) -> list[list[Hit]]:
        """The ``top_k`` best points among those matching ``where`` for each query by the vector ``using`` (None:
        the model-bound one; float32 ``(nq, d)`` dense queries, made by ``model`` for the model-bound vector, or a
        list of :class:`~.schema.SparseVec`), best first, without those scoring below (cosine/dot/sparse) or beyond
        (l2) the threshold, read at ``consistency``. A sparse search scores by the exact dot product and returns
        only points sharing a term with the query. ``exact``: score every stored vector (no approximate index), as
        Qdrant's ``params.exact`` asks; ``quantization``: how a quantized index is searched (Qdrant's
        ``params.quantization``; None: its defaults; no effect on an index that is not quantized); ``hnsw_ef``: an
        HNSW graph's search breadth (Qdrant's ``params.hnsw_ef``, at least ``top_k``; None: the index's ``ef_search``;
        no effect on other index types).
        The hits' bytes are spent from ``budget`` before their texts and payloads are read where the backend can
        (embedded), else as they arrive.

        Raises:
            ModelChanged: ``model`` is no longer the collection's.
            ResponseTooLarge: the hits would exceed ``budget``.
        """

    def create_payload_index(self, index: PayloadIndex) -> None:
        """Index the payload key ``index.key`` (:mod:`.payload_indexes`), replacing another index of it; built and
        durable when it returns. Filters answer as without it (an index only makes them cheaper); ``info()``
        reports it under ``payload_indexes`` (``{key: {data_type, params?, points}}``) where the backend keeps it."""

    def delete_payload_index(self, key: str) -> bool:
        """Drop the index of payload ``key``; False when there was none."""

    def begin_reembed(self, model: dict[str, Any], dimension: int, owner: str) -> ReembedTarget | None:
        """Claim and attach the re-embedding towards ``model``: resumes an unfinished one for the same model
        (another target's vectors are discarded). None when another owner holds a live claim on it.

        Raises:
            InvalidCollectionRequest: the index params cannot be carried to ``dimension``.
        """


class VectorBackend(Protocol):
    """The collections of one service (or, for a shared backend, of every replica)."""

    settings: Any
    #: the collections' snapshots (:class:`~.snapshots.SnapshotStore`), or None where the backend keeps none
    snapshots: Any
    #: the collection aliases (:class:`~.aliases.Aliases`); :meth:`get` resolves them
    aliases: Any

    async def update_aliases(self, actions: list[dict[str, Any]]) -> None:
        """Apply Qdrant's alias actions, all or none (:func:`~.aliases.apply_actions` lists the errors)."""

    async def start(self) -> None:
        """Open (or connect to) the collections and start background upkeep."""

    async def close(self) -> None:
        """Stop upkeep and release everything (durable state stays)."""

    async def run(self, fn: Callable[..., T], *args: Any, **kw: Any) -> T:
        """Run blocking ``fn(*args, **kw)`` on the backend's worker threads."""

    def applied(self, consistency: ReadConsistency) -> str:
        """The consistency a read asking for ``consistency`` gets (the embedded backend: always ``strong``)."""

    def get(self, name: str) -> CollectionHandle:
        """Raises :class:`~.errors.CollectionNotFound`."""

    def list(self) -> list[CollectionHandle]:
        """Every collection, sorted by name."""

    async def create(self, name: str, vectors: VectorsConfig) -> CollectionHandle:
        """Create collection ``name`` holding the (checked) ``vectors``.

        Raises:
            InvalidCollectionRequest: a bad name, or vectors the backend cannot hold (``unsupported``).
            CollectionExists: the name is taken.
        """

    async def update_vectors(self, name: str, change: Callable[[VectorsConfig], VectorsConfig | None]) -> None:
        """Make ``change(its vectors)`` (None: unchanged) the vectors of collection ``name``, atomically and durably:
        a vector dropped loses its values, one added is held by no point (:mod:`.vector_names`). Raises
        CollectionNotFound, what ``change`` raises, InvalidCollectionRequest (``unsupported``: the backend cannot)."""

    async def delete(self, name: str) -> None:
        """Raises :class:`~.errors.CollectionNotFound`."""
