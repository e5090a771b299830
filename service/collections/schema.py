"""The collections' data model: a point is ``{id, text, payload, vectors: {name: dense | sparse}}`` and a collection's
:class:`VectorsConfig` names its vectors (docs/architecture.md, "Named vectors"). Backend-independent: every backend
stores what this describes, and the native and Qdrant surfaces translate onto it.

* A **dense** vector (:class:`DenseVector`) has an index spec (index type, metric, params, dimension: the index
  registry checks them) and a binding: **model-bound** (``model`` is the ``{name, version, sha256}`` record of the
  served model that embeds the point's text; it follows the active model) or **client-supplied** (``model`` None: the
  client sends the vectors, any dimension, never re-embedded). At most one dense vector is model-bound.
* A **sparse** vector (:class:`SparseVector`) is ``{indices, values}`` (:class:`SparseVec`) scored by the exact dot
  product; ``modifier: idf`` weights each query term by its IDF over the collection (:func:`idf`), as Qdrant does
  (Qdrant documentation, "Sparse vectors", ``modifier``; ``SparseVectorParams`` in the API reference).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.collections.errors import InvalidCollectionRequest
from service.collections.index import IndexConfigError, IndexSpec, faiss_metric, normalize_params
from service.collections.vectors import query_problem

MAX_VECTORS = 16  # named dense vectors, and named sparse vectors, per collection (each)
MAX_SPARSE_INDEX = 2**32 - 1  # Qdrant's sparse indices are u32
MODIFIERS = ("none", "idf")
_VECTOR_NAME = re.compile(r"[^\x00-\x1f\"\\]{0,64}")


@dataclass(frozen=True)
class DenseVector:
    """A named dense vector: ``spec`` (index kind, metric, params, dimension) and ``model`` (the record of the model
    that embeds the texts: model-bound; None: client-supplied). ``multivector``: each point holds a matrix of such
    vectors (``(m, dimension)``, late interaction as ColBERT's) compared by MAX_SIM (Qdrant's ``multivector_config``
    with comparator ``max_sim``: the sum over a query's rows of their best similarity to the point's rows); searched
    exactly, without an index; client-supplied only."""

    name: str
    spec: IndexSpec
    model: dict[str, Any] | None = None
    multivector: bool = False

    @property
    def bound(self) -> bool:
        """Whether the service embeds this vector from the point's text (and re-embeds it on a model switch)."""
        return self.model is not None


@dataclass(frozen=True)
class SparseVector:
    """A named sparse vector: ``modifier`` (``none`` or ``idf``) and ``model`` (a server-side sparse model such as
    ``qdrant/bm25`` that makes it from the text; None: client-supplied)."""

    name: str
    modifier: str = "none"
    model: str | None = None


@dataclass(frozen=True)
class SparseVec:
    """One sparse vector: ``indices`` uint32 ``(nnz,)`` strictly increasing, ``values`` float32 ``(nnz,)`` finite."""

    indices: np.ndarray
    values: np.ndarray

    def to_json(self) -> dict[str, list]:
        """``{indices, values}`` as Qdrant's ``SparseVector``."""
        return {"indices": [int(i) for i in self.indices], "values": [float(v) for v in self.values]}


def sparse_vec(indices: Any, values: Any, param: str) -> SparseVec:
    """A checked :class:`SparseVec` from a request's ``indices`` and ``values`` (sorted by index; Qdrant sorts too).

    Raises:
        InvalidCollectionRequest: lengths differ, an index is not an integer in ``[0, 2**32)`` or repeats, a value is
            not a finite number.
    """
    if not isinstance(indices, list) or not isinstance(values, list) or len(indices) != len(values):
        raise InvalidCollectionRequest(f"{param}: indices and values must be lists of the same length", param)
    if not set(map(type, indices)) <= {int}:  # bool, float, str... (checked by type: bool is an int subclass)
        bad = next(i for i in indices if type(i) is not int)
        raise InvalidCollectionRequest(f"{param}.indices: {bad!r} is not an integer in [0, 2^32)", param)
    try:
        idx = np.asarray(indices, dtype=np.int64)
    except OverflowError:
        idx = None
    if idx is None or (len(idx) and (idx.min() < 0 or idx.max() > MAX_SPARSE_INDEX)):
        bad = next(i for i in indices if not 0 <= i <= MAX_SPARSE_INDEX)
        raise InvalidCollectionRequest(f"{param}.indices: {bad!r} is not an integer in [0, 2^32)", param)
    if not set(map(type, values)) <= {int, float}:  # the slow check only for other types (refused unless a float)
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise InvalidCollectionRequest(f"{param}.values: {v!r} is not a finite number", param)
    try:
        vals = np.asarray(values, dtype=np.float64)
        finite = bool(np.isfinite(vals).all())
    except OverflowError:  # an integer past float64's range
        finite = False
    if not finite:
        bad = next(v for v in values if not _finite(v))
        raise InvalidCollectionRequest(f"{param}.values: {bad!r} is not a finite number", param)
    order = np.argsort(idx, kind="stable")
    idx = idx[order]
    if len(idx) > 1 and np.any(idx[1:] == idx[:-1]):
        raise InvalidCollectionRequest(f"{param}.indices must be unique", param)
    return SparseVec(idx.astype(np.uint32), vals.astype(np.float32)[order])


def _finite(v: int | float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def idf(n_points: int, df: np.ndarray) -> np.ndarray:
    """Inverse document frequency of terms found in ``df`` (int ``(t,)``) of ``n_points`` points holding the vector:
    ``ln(1 + (N - df + 0.5) / (df + 0.5))`` (BM25's IDF, Robertson & Zaragoza, "The Probabilistic Relevance
    Framework: BM25 and Beyond", eq. 3.3 with Lucene's +1; what Qdrant's ``modifier: idf`` computes). float32."""
    d = np.asarray(df, dtype=np.float64)
    return np.log1p((n_points - d + 0.5) / (d + 0.5)).astype(np.float32)


@dataclass
class VectorsConfig:
    """The vectors of a collection: ``dense`` and ``sparse`` by name (see the module docstring); ``metadata``: the
    client's JSON object kept with them (Qdrant's collection ``metadata``; None: never given)."""

    dense: dict[str, DenseVector] = field(default_factory=dict)
    sparse: dict[str, SparseVector] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None

    @property
    def bound(self) -> DenseVector | None:
        """The model-bound dense vector, or None."""
        return next((v for v in self.dense.values() if v.bound), None)

    def client_dense(self) -> list[DenseVector]:
        """The client-supplied dense vectors."""
        return [v for v in self.dense.values() if not v.bound]

    def default_using(self) -> str | None:
        """The vector a search uses when it names none: the model-bound one, else the only dense one, else None."""
        if (b := self.bound) is not None:
            return b.name
        return next(iter(self.dense)) if len(self.dense) == 1 else None

    def kind_of(self, name: str, param: str) -> str:
        """``dense`` or ``sparse``: the kind of the vector ``name``.

        Raises:
            InvalidCollectionRequest: the collection has no such vector (``vector_not_found``).
        """
        if name in self.dense:
            return "dense"
        if name in self.sparse:
            return "sparse"
        have = sorted(self.dense) + sorted(self.sparse)
        raise InvalidCollectionRequest(
            f"{param}: the collection has no vector named {name!r} (it has {have})", param, "vector_not_found"
        )

    def with_bound_spec(self, spec: IndexSpec, model: dict[str, Any]) -> VectorsConfig:
        """This config with the model-bound vector's spec and model replaced (a re-embedding's switch)."""
        b = self.bound
        dense = dict(self.dense)
        if b is not None:
            dense[b.name] = DenseVector(b.name, spec, dict(model))
        return VectorsConfig(dense, dict(self.sparse), self.metadata)

    def with_metadata(self, update: dict[str, Any]) -> VectorsConfig:
        """This config with ``update`` merged into its metadata (Qdrant's collection update: a key given replaces
        the one kept, a key given as null is removed; the whole of ``update`` when none was kept, as qdrant-client's
        local mode keeps it)."""
        if self.metadata is None:
            merged = dict(update)
        else:
            merged = {k: v for k, v in {**self.metadata, **update}.items() if not (k in update and v is None)}
        return VectorsConfig(dict(self.dense), dict(self.sparse), merged)

    def to_json(self) -> dict[str, Any]:
        """The stored and reported form: ``{dense: {name: {index, metric, params, dimension, model}}, sparse: {name:
        {modifier, model}}[, metadata]}``."""
        out = {
            "dense": {
                n: {
                    "index": v.spec.kind,
                    "metric": v.spec.metric,
                    "params": v.spec.params,
                    "dimension": v.spec.dimension,
                    "model": v.model,
                    **({"multivector": True} if v.multivector else {}),
                }
                for n, v in self.dense.items()
            },
            "sparse": {n: {"modifier": v.modifier, "model": v.model} for n, v in self.sparse.items()},
        }
        return {**out, "metadata": self.metadata} if self.metadata is not None else out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> VectorsConfig:
        """The inverse of :meth:`to_json`."""
        dense = {
            n: DenseVector(
                n,
                IndexSpec(d["index"], d["metric"], d["params"], int(d["dimension"])),
                d["model"],
                bool(d.get("multivector")),
            )
            for n, d in raw.get("dense", {}).items()
        }
        sparse = {n: SparseVector(n, s["modifier"], s.get("model")) for n, s in raw.get("sparse", {}).items()}
        return cls(dense, sparse, raw.get("metadata"))

    @classmethod
    def single(cls, spec: IndexSpec, model: dict[str, Any], name: str = "") -> VectorsConfig:
        """One model-bound vector ``name`` (unnamed by default: the config of every collection made before named
        vectors)."""
        return cls({name: DenseVector(name, spec, dict(model))})


def index_spec(kind: str, params: dict[str, Any] | None, metric: str, dimension: int, param: str) -> IndexSpec:
    """A checked index spec (the index registry fills in and validates the params).

    Raises:
        InvalidCollectionRequest: an unknown index type or metric, or bad params (naming ``param``).
    """
    try:
        faiss_metric(metric)
        return IndexSpec(kind, metric, normalize_params(kind, params, dimension), dimension)
    except IndexConfigError as e:
        raise InvalidCollectionRequest(f"{param}: {e}" if param != "params" else str(e), param) from e


def _name(name: Any, param: str, allow_empty: bool) -> str:
    if not isinstance(name, str) or not _VECTOR_NAME.fullmatch(name) or (not name and not allow_empty):
        raise InvalidCollectionRequest(
            f"{param}: vector name {name!r} must be 1-64 characters without quotes, backslashes or control characters",
            param,
        )
    return name


def new_vectors_config(
    dense: dict[str, dict[str, Any]],
    sparse: dict[str, dict[str, Any]],
    model: dict[str, Any] | None,
    model_dimension: int,
    sparse_models: tuple[str, ...] = (),
    metadata: dict[str, Any] | None = None,
) -> VectorsConfig:
    """A checked :class:`VectorsConfig` for a new collection.

    Args:
        dense: ``{name: {bound, size, metric, index, params, multivector}}``: ``bound`` True makes it model-bound
            (``size``, if given, must be ``model_dimension``); else ``size`` (1 to 65536) is required; ``multivector``
            True: a matrix per point (:class:`DenseVector`; not model-bound, its index ``flat``).
        sparse: ``{name: {modifier, model}}``; ``model`` one of ``sparse_models`` or None.
        model: the active model's record (what a model-bound vector is bound to).
        model_dimension: its embedding dimension.
        sparse_models: the server-side sparse models the service offers.
        metadata: the client's JSON object kept with the vectors (:class:`VectorsConfig`), or None.

    A collection with no vector at all holds payloads only (Qdrant allows it).

    Raises:
        InvalidCollectionRequest: too many vectors, a bad name, two model-bound vectors, a bad size, metric,
            index type or params (``param`` names the field), an unknown modifier or sparse model.
    """
    for what, given in (("vectors", dense), ("sparse_vectors", sparse)):
        if len(given) > MAX_VECTORS:
            raise InvalidCollectionRequest(f"{what}: at most {MAX_VECTORS} per collection", what)
    if metadata is not None and not isinstance(metadata, dict):
        raise InvalidCollectionRequest("metadata must be a JSON object", "metadata")
    out = VectorsConfig(metadata=metadata)
    for name, d in dense.items():
        param = f"vectors.{name}" if name else "vectors"
        _name(name, param, allow_empty=True)
        bound, size = bool(d.get("bound")), d.get("size")
        if bound:
            if out.bound is not None:
                raise InvalidCollectionRequest(f"{param}: at most one vector is bound to the model", param)
            if size not in (None, model_dimension):
                raise InvalidCollectionRequest(
                    f"{param}.size is {size}, but the model embeds {model_dimension} dimensions",
                    f"{param}.size",
                    "wrong_dimension",
                )
            size = model_dimension
        elif isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 65536:
            raise InvalidCollectionRequest(f"{param}.size must be an integer in [1, 65536]", f"{param}.size")
        multi = bool(d.get("multivector"))
        if multi and bound:
            raise InvalidCollectionRequest(f"{param}: a multivector is the client's (not bound to the model)", param)
        kind, params = ("flat", None) if multi else (d.get("index", "flat"), d.get("params"))
        spec = index_spec(kind, params, d.get("metric", "cosine"), size, param)
        out.dense[name] = DenseVector(name, spec, dict(model) if bound and model else None, multi)
    for name, s in sparse.items():
        param = f"sparse_vectors.{name}"
        _name(name, param, allow_empty=False)
        if name in out.dense:
            raise InvalidCollectionRequest(f"{param}: a dense vector has that name", param)
        modifier, smodel = s.get("modifier") or "none", s.get("model")
        if modifier not in MODIFIERS:
            raise InvalidCollectionRequest(f"{param}.modifier must be one of {MODIFIERS}", f"{param}.modifier")
        if smodel is not None and smodel not in sparse_models:
            raise InvalidCollectionRequest(
                f"{param}.model must be one of {list(sparse_models)} (server-side sparse models) or absent",
                f"{param}.model",
            )
        out.sparse[name] = SparseVector(name, modifier, smodel)
    return out


def dense_value(v: Any, spec: IndexSpec, multivector: bool, param: str) -> np.ndarray:
    """A checked dense value: float32 ``(d,)``, or ``(m, d)`` (``m >= 1``) for a multivector.

    Raises:
        InvalidCollectionRequest: another shape (``wrong_dimension``), not finite, zero for cosine.
    """
    try:
        x = np.asarray(v, dtype=np.float32)
    except (TypeError, ValueError):
        x = np.zeros(0, np.float32)  # ragged rows
    want = "rows of" if multivector else "dimension"
    if x.shape[-1:] != (spec.dimension,) or x.ndim != (2 if multivector else 1) or not x.size:
        raise InvalidCollectionRequest(f"{param} must be {want} {spec.dimension} floats", param, "wrong_dimension")
    for row in x.reshape(-1, spec.dimension):
        if (problem := query_problem(row, spec.metric)) is not None:
            raise InvalidCollectionRequest(problem.replace("query vector", "vector"), param)
    return x


def point_vectors(cfg: VectorsConfig, named: Sequence[dict[str, Any] | None]) -> list[dict[str, Any]]:
    """Per point, its named vectors other than the model-bound one (``{name: [float] | {indices, values} |
    SparseVec}``), checked against the collection's ``cfg``: float32 ``(d,)`` dense, :class:`SparseVec` sparse (one
    given as a :class:`SparseVec`, which only a server-side sparse model makes, is kept as it is: its names are
    checked, not its values).

    Raises:
        InvalidCollectionRequest: an unknown or model-bound name (``vector_not_found``), a dense vector of the
            wrong dimension (``wrong_dimension``) or not finite (zero for cosine), a malformed sparse vector.
    """
    out: list[dict[str, Any]] = []
    for i, vecs in enumerate(named):
        row: dict[str, Any] = {}
        for n, v in (vecs or {}).items():
            param = f"points[{i}].vectors.{n}"
            if cfg.kind_of(n, param) == "sparse":
                if isinstance(v, SparseVec):  # made by a server-side model (sparse_inputs), checked there
                    row[n] = v
                    continue
                if not isinstance(v, dict) or set(v) != {"indices", "values"}:
                    raise InvalidCollectionRequest(f"{param} is sparse: give {{indices, values}}", param)
                row[n] = sparse_vec(v["indices"], v["values"], param)
                continue
            spec = cfg.dense[n].spec
            if cfg.dense[n].bound:
                raise InvalidCollectionRequest(f"{param} is the model-bound vector: give it as 'vector'", param)
            row[n] = dense_value(v, spec, cfg.dense[n].multivector, param)
        out.append(row)
    return out
