"""The model artifact contract: the one seam between ``training`` and ``service``.

An artifact is a directory holding ``model.onnx``, the tokenizer files
(``tokenizer.json`` plus its Hugging Face companions) and ``manifest.json``.
Artifacts live in the models directory either flat, ``models/<name>/``, or
versioned, ``models/<name>/<version>/``. See ``models/README.md`` for the full
contract; this module implements it and is the only code both packages share.

Where pooling and normalisation happen (documented once, here):

* **Pooling** (mean over non-padding tokens, or the ``[CLS]`` vector) is inside
  the ONNX graph. ``model.onnx`` takes ``input_ids`` and ``attention_mask``
  (int64, shape ``(batch, seq)``) and returns ``sentence_embedding`` with shape
  ``(batch, dimension)``, pooled but *not* normalised.
* **Normalisation** and Matryoshka-style truncation are applied to that output
  by :func:`postprocess`, which both the service and ONNX evaluation call.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from artifact_contract.fsio import atomic_write_text

MANIFEST_FILE = "manifest.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
INPUT_NAMES = ("input_ids", "attention_mask")
OUTPUT_NAME = "sentence_embedding"
#: the output of a reranker's graph (``task: "reranker"``): raw relevance logits, float32 ``(batch, 1)``
RERANK_OUTPUT_NAME = "logits"
SCHEMA_VERSION = 1

__all__ = [
    "ArtifactError",
    "ArtifactRef",
    "Canary",
    "Manifest",
    "Parity",
    "INPUT_NAMES",
    "OUTPUT_NAME",
    "RERANK_OUTPUT_NAME",
    "MANIFEST_FILE",
    "MODEL_FILE",
    "TOKENIZER_FILE",
    "find_artifacts",
    "load_manifest",
    "postprocess",
    "resolve_artifact",
    "sha256_file",
    "validate_artifact",
    "write_manifest",
]


class ArtifactError(ValueError):
    """An artifact is missing, malformed or inconsistent; the message names what is wrong."""


class Parity(BaseModel):
    """Export parity of ONNX against the torch model on real sentences.

    ``max_abs_diff`` is the largest absolute element difference of the pooled
    embeddings; ``min_cosine`` the smallest per-sentence cosine similarity. For a reranker (``task: "reranker"``)
    ``n_sentences`` counts held-out (query, passage) pairs, ``max_abs_diff`` is the largest |ONNX raw score -
    ``CrossEncoder.predict`` raw score| and ``min_cosine`` is None (scores are not vectors).
    """

    model_config = ConfigDict(extra="forbid")
    n_sentences: int = Field(gt=0)
    max_abs_diff: float = Field(ge=0)
    min_cosine: float | None = None
    source: str = Field(description="where the parity sentences came from, and what was compared with what")
    provider: str | None = Field(
        default=None, description="ONNX Runtime execution provider the ONNX side ran on (None: not recorded)"
    )


class Canary(BaseModel):
    """Sentences and the normalised embeddings the artifact gave at export time.

    A loader re-embeds ``sentences`` and compares with ``embeddings``
    (shape ``(len(sentences), dimension)``) within ``atol`` to prove the
    artifact it opened is the artifact that was exported.

    A reranker's canary holds pairs: ``queries[i]`` with ``sentences[i]`` (the passage), and ``embeddings[i]`` is
    the pair's raw score as a one-column row (``dimension`` is 1).
    """

    model_config = ConfigDict(extra="forbid")
    sentences: list[str] = Field(min_length=1)
    embeddings: list[list[float]]
    atol: float = 1e-3
    queries: list[str] | None = Field(default=None, description="a reranker's canary: the query of each pair")


class Manifest(BaseModel):
    """``manifest.json``: everything needed to serve and to audit an artifact.

    ``prompts`` and ``default_prompt_name`` follow sentence-transformers (``SentenceTransformer(prompts=...,
    default_prompt_name=...)``, stored in ``config_sentence_transformers.json``): a prompt is prepended to the input
    text before tokenisation, so truncation and token counts include it.

    Raises (on validation, as :class:`pydantic.ValidationError`; :func:`load_manifest` turns it into
    :class:`ArtifactError`): ``default_prompt_name`` not a key of ``prompts``, a prompt name empty or not a string,
    a reranker with prompts, and the other field rules.
    """

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    schema_version: int = SCHEMA_VERSION
    task: Literal["reranker"] | None = Field(
        default=None,
        description="what the graph computes: absent/null = an embedding model (output sentence_embedding); "
        "'reranker' = a cross-encoder scoring (query, passage) pairs (output logits (batch, 1), dimension 1, "
        "pooling cls: its classification head reads the first token; never served for embeddings)",
    )
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    version: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    created_at: datetime
    base_model: str = Field(min_length=1)
    training: dict[str, Any] | None = Field(
        default=None, description="training recipe (config, steps, seed); null for an untrained export"
    )
    pooling: Literal["mean", "cls"]
    normalize: bool
    max_seq_length: int = Field(gt=0, le=8192)
    dimension: int = Field(gt=0)
    onnx_opset: int = Field(gt=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    quantization: Literal["int8"] | None = None
    dtype: Literal["fp32", "fp16"] = Field(
        default="fp32",
        description="floating-point precision of model.onnx's weights and arithmetic; inputs (int64) and the "
        "sentence_embedding output (float32) are the same for both. fp16 artifacts are for GPU serving",
    )
    fusion: Literal["onnxruntime-bert"] | None = Field(
        default=None,
        description="graph rewritten by ONNX Runtime's transformer optimizer (model_type bert) into its fused "
        "com.microsoft ops (Attention, SkipLayerNormalization, EmbedLayerNormalization, BiasGelu): it runs on ONNX "
        "Runtime only; null for a plain ONNX graph",
    )
    scores: dict[str, float] = Field(
        default_factory=dict,
        description="Spearman x100 per STS task (e.g. 'STS12', 'STSBenchmark', 'mean', 'STSBenchmark-dev')",
    )
    parity: Parity | None = None
    canary: Canary | None = None
    files: list[str] = Field(default_factory=lambda: [MODEL_FILE, TOKENIZER_FILE])
    prompts: dict[Annotated[str, Field(min_length=1)], str] | None = Field(
        default=None,
        description="sentence-transformers' prompts (config_sentence_transformers.json): prompt name -> the text "
        "prepended to an input before tokenisation (e.g. {'query': 'query: ', 'passage': 'passage: '}); absent/null "
        "or empty = the model takes none. An embedding model's only",
    )
    default_prompt_name: str | None = Field(
        default=None,
        description="sentence-transformers' default_prompt_name: the prompt applied when a request names none; a "
        "key of prompts",
    )
    activation: Literal["sigmoid", "identity"] | None = Field(
        default=None,
        description="a reranker's only: the function sentence-transformers' CrossEncoder.predict applies to the raw "
        "score (its activation_fn): 'sigmoid' (CrossEncoder's default for one label) or 'identity' (the raw logit "
        "is the score); absent/null = sigmoid",
    )

    @field_validator("scores")
    @classmethod
    def _scores_finite(cls, v: dict[str, float]) -> dict[str, float]:
        for k, s in v.items():
            if not np.isfinite(s) or not -100.0 <= s <= 100.0:
                raise ValueError(f"score {k}={s} is not a Spearman x100 in [-100, 100]")
        return v

    @model_validator(mode="after")
    def _one_precision(self) -> Manifest:
        if self.quantization is not None and self.dtype != "fp32":
            raise ValueError(f"quantization {self.quantization} applies to fp32 graphs, dtype is {self.dtype}")
        return self

    @model_validator(mode="after")
    def _task_fields(self) -> Manifest:
        rerank = self.task == "reranker"
        if rerank and (self.dimension != 1 or self.normalize):
            raise ValueError("a reranker has dimension 1 (one raw score per pair) and normalize false")
        if self.parity is not None and not rerank and self.parity.min_cosine is None:
            raise ValueError("an embedding model's parity needs min_cosine")
        if self.canary is not None and (self.canary.queries is not None) != rerank:
            raise ValueError("canary.queries is given for a reranker's pairs, and only then")
        if not rerank and self.activation is not None:
            raise ValueError("activation is a reranker's (the function applied to its raw score)")
        if rerank and (self.prompts or self.default_prompt_name is not None):
            raise ValueError("a reranker takes no prompts (prompts and default_prompt_name are an embedding model's)")
        return self

    @model_validator(mode="after")
    def _default_prompt_is_a_prompt(self) -> Manifest:
        name = self.default_prompt_name
        if name is not None and name not in (self.prompts or {}):
            have = ", ".join(map(repr, sorted(self.prompts or {}))) or "none"
            raise ValueError(f"default_prompt_name {name!r} is not a key of prompts (prompts: {have})")
        return self

    @property
    def is_reranker(self) -> bool:
        """The artifact is a cross-encoder (``task == "reranker"``), not an embedding model."""
        return self.task == "reranker"


@dataclass(frozen=True)
class ArtifactRef:
    """A located artifact: its name, version and directory."""

    name: str
    version: str
    path: Path


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def load_manifest(artifact_dir: str | os.PathLike) -> Manifest:
    """Parse ``manifest.json`` of an artifact directory.

    Raises:
        ArtifactError: the file is missing, is not JSON, or breaks the schema
            (the message lists each offending field).
    """
    path = Path(artifact_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ArtifactError(f"{path}: manifest missing")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ArtifactError(f"{path}: not readable JSON ({e})") from e
    try:
        return Manifest.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or '<root>'}: {err['msg']}" for err in e.errors())
        raise ArtifactError(f"{path}: invalid manifest: {problems}") from e


def validate_artifact(artifact_dir: str | os.PathLike, check_hash: bool = True) -> Manifest:
    """Load the manifest and check the files it promises.

    Checks: every listed file exists; ``model.onnx`` hashes to ``sha256``;
    the canary (if any) has ``dimension`` columns. Opening the ONNX graph and
    checking its inputs/outputs is the loader's job (it needs onnxruntime).

    Raises:
        ArtifactError: naming the artifact path and what is wrong.
    """
    d = Path(artifact_dir)
    m = load_manifest(d)
    for f in set(m.files) | {MODEL_FILE, TOKENIZER_FILE}:
        if not (d / f).is_file():
            raise ArtifactError(f"{d}: file {f!r} listed by the manifest is missing")
    if check_hash:
        actual = sha256_file(d / MODEL_FILE)
        if actual != m.sha256:
            raise ArtifactError(f"{d}: sha256 of {MODEL_FILE} is {actual}, manifest says {m.sha256}")
    if m.canary is not None:
        for row in m.canary.embeddings:
            if len(row) != m.dimension:
                raise ArtifactError(
                    f"{d}: canary embedding has {len(row)} dimensions, manifest dimension is {m.dimension}"
                )
        if m.canary.queries is not None and len(m.canary.queries) != len(m.canary.sentences):
            raise ArtifactError(
                f"{d}: canary has {len(m.canary.queries)} queries for {len(m.canary.sentences)} passages"
            )
        if len(m.canary.embeddings) != len(m.canary.sentences):
            raise ArtifactError(
                f"{d}: canary has {len(m.canary.sentences)} sentences but {len(m.canary.embeddings)} embeddings"
            )
    return m


def write_manifest(artifact_dir: str | os.PathLike, manifest: Manifest) -> Path:
    """Write ``manifest.json`` atomically and durably (see :mod:`artifact_contract.fsio`); an embedding model's
    manifest is written without the reranker-only fields (``task``, ``canary.queries``), and a manifest without
    prompts without ``prompts`` and ``default_prompt_name`` and one without ``activation`` without it, as before those
    fields existed."""
    exclude: dict = {}
    if manifest.task is None:
        exclude = {"task": True, "canary": {"queries"}} if manifest.canary is not None else {"task": True}
    if manifest.prompts is None:
        exclude["prompts"] = True
    if manifest.default_prompt_name is None:
        exclude["default_prompt_name"] = True
    if manifest.activation is None:
        exclude["activation"] = True
    return atomic_write_text(Path(artifact_dir) / MANIFEST_FILE, manifest.model_dump_json(indent=2, exclude=exclude))


def now_utc() -> datetime:
    """Timezone-aware current time, for ``created_at``."""
    return datetime.now(timezone.utc)


def _version_key(v: str) -> tuple:
    parts = []
    for p in v.replace("-", ".").split("."):
        parts.append((0, int(p), "") if p.isdigit() else (1, 0, p))
    return tuple(parts)


def find_artifacts(models_dir: str | os.PathLike) -> list[ArtifactRef]:
    """All artifacts under ``models_dir`` (flat ``<name>/`` or versioned ``<name>/<version>/``).

    Directories without a ``manifest.json`` are skipped; manifests are not
    validated here (use :func:`validate_artifact`). The version of a flat
    artifact is read from its manifest. Sorted by name, then version.
    """
    root = Path(models_dir)
    refs: list[ArtifactRef] = []
    if not root.is_dir():
        return refs
    for name_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if (name_dir / MANIFEST_FILE).is_file():
            try:
                version = json.loads((name_dir / MANIFEST_FILE).read_text())["version"]
            except Exception:
                version = "unknown"
            refs.append(ArtifactRef(name_dir.name, str(version), name_dir))
            continue
        for vdir in name_dir.iterdir():
            if vdir.is_dir() and not vdir.name.startswith(".") and (vdir / MANIFEST_FILE).is_file():
                refs.append(ArtifactRef(name_dir.name, vdir.name, vdir))
    refs.sort(key=lambda r: (r.name, _version_key(r.version)))
    return refs


def resolve_artifact(models_dir: str | os.PathLike, name: str, version: str | None = None) -> ArtifactRef:
    """Locate artifact ``name`` (latest version unless ``version`` is given).

    Raises:
        ArtifactError: no such artifact or version; the message lists what exists.
    """
    refs = [r for r in find_artifacts(models_dir) if r.name == name]
    if version is not None:
        refs = [r for r in refs if r.version == version]
    if not refs:
        have = sorted({f"{r.name}:{r.version}" for r in find_artifacts(models_dir)})
        want = f"{name}:{version}" if version else name
        raise ArtifactError(f"no artifact {want!r} in {models_dir} (available: {', '.join(have) or 'none'})")
    return refs[-1]


def postprocess(pooled: np.ndarray, normalize: bool = True, dimensions: int | None = None) -> np.ndarray:
    """Turn the graph's pooled output into served embeddings.

    Args:
        pooled: ``(batch, dimension)`` float array, the ``sentence_embedding`` output.
        normalize: L2-normalise each row (rows of zero norm stay zero).
        dimensions: if given, keep the first ``dimensions`` columns, then
            L2-renormalise (OpenAI's ``dimensions``; always renormalised, as OpenAI does).

    Returns:
        ``(batch, dimensions or dimension)`` float32 array.

    Raises:
        ValueError: ``dimensions`` is not in ``[1, dimension]``.
    """
    x = np.asarray(pooled, dtype=np.float32)
    if dimensions is not None:
        if not 1 <= dimensions <= x.shape[1]:
            raise ValueError(f"dimensions must be between 1 and {x.shape[1]}, got {dimensions}")
        x = x[:, :dimensions]
        normalize = True
    if normalize:
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        x = x / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(x, dtype=np.float32)
