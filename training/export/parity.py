"""What every export is checked against, and the manifest it ends with.

* Parity sentences: real ones (the first unique STS-B dev sentences), or a built-in list of 16 when the shared
  data is absent (e.g. inside a Docker build); ``parity.source`` in the manifest says which.
* Parity figures (:func:`measure_parity`): the largest absolute element difference and the smallest per-sentence
  cosine between a reference embedding matrix and the exported graph's.
* The canary: four sentences embedded at export time, re-embedded by every loader (``artifact_contract.Canary``).
* :func:`write_artifact_manifest`: the one place a manifest is completed (time, hash, canary, files) and written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from artifact_contract import MODEL_FILE, Canary, Manifest, Parity, now_utc, sha256_file, write_manifest

#: fp32 export tolerance against the torch model: max |diff| and per-sentence cosine
PARITY_MAX_ABS = 1e-4
PARITY_MIN_COS = 0.9999
CANARY_SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome and the actors are great.",
    "Stocks fell sharply on Tuesday after the central bank raised interest rates.",
    "Cats sleep most of the day.",
]
FALLBACK_SENTENCES = CANARY_SENTENCES + [
    "Two dogs are running through a field of tall grass.",
    "The committee postponed its decision until next week.",
    "She poured the milk into a large glass bowl.",
    "What is the capital city of Australia?",
    "Heavy rain caused flooding in several coastal towns overnight.",
    "He is not sure whether the train leaves at seven or at eight.",
    "A woman is slicing an onion.",
    "The results suggest that the treatment reduces symptoms in most patients.",
    "I loved this film, although the ending felt rushed.",
    "Researchers measured the temperature of the lake every hour for a month.",
    "Ok.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of the old house.",
]


class ExportError(RuntimeError):
    """Export failed (parity out of tolerance, unreadable model directory, bad options)."""


def parity_sentences(n: int = 256) -> tuple[list[str], str]:
    """``n`` real sentences (STS-B dev, first unique ones) for the parity check, and their source.

    Falls back to a fixed list of 16 sentences when the shared data is absent
    (e.g. inside a Docker build); the manifest's ``parity.source`` says which.
    """
    from training.data.sts import load_task

    try:
        pairs = load_task("STSBenchmark-dev")
    except (FileNotFoundError, OSError):
        return list(FALLBACK_SENTENCES), "built-in sentences (shared data not found)"
    uniq = list(dict.fromkeys(pairs.sent1 + pairs.sent2))
    return uniq[:n], f"STS-B dev, first {min(n, len(uniq))} unique sentences"


def measure_parity(ref: np.ndarray, got: np.ndarray, source: str, provider: str | None = None) -> Parity:
    """Parity of ``got`` against ``ref`` (both ``(n, dim)``): max |diff| and min per-row cosine; ``provider`` is
    the ONNX Runtime execution provider ``got`` came from."""
    cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    max_abs = float(np.abs(ref - got).max())
    return Parity(
        n_sentences=len(ref), max_abs_diff=max_abs, min_cosine=float(cos.min()), source=source, provider=provider
    )


def fp32_parity_failure(parity: Parity) -> str | None:
    """Why ``parity`` misses the fp32 export tolerance (max |diff| <= :data:`PARITY_MAX_ABS`, min cosine >=
    :data:`PARITY_MIN_COS`), or None when it holds."""
    if parity.max_abs_diff <= PARITY_MAX_ABS and parity.min_cosine >= PARITY_MIN_COS:
        return None
    return (
        f"parity max |diff| {parity.max_abs_diff:.3g} (limit {PARITY_MAX_ABS}), "
        f"min cosine {parity.min_cosine:.6f} (limit {PARITY_MIN_COS})"
    )


def stsb_dev(encoder) -> float:
    """STS-B dev Spearman ×100 of an encoder with an ``encode(sentences) -> (n, dim)`` method."""
    from training.evaluation import evaluate_sts

    return evaluate_sts(encoder.encode, ["STSBenchmark-dev"])["STSBenchmark-dev"]


def write_artifact_manifest(
    out: Path,
    fields: dict[str, Any],
    encoder,
    *,
    parity: Parity,
    scores: dict[str, float],
    canary_atol: float = Canary.model_fields["atol"].default,
) -> Manifest:
    """Complete and write ``out/manifest.json`` (atomically, last): ``fields`` (identity, pooling, dimension, ...)
    plus ``created_at``, the SHA-256 of ``model.onnx``, ``parity``, ``scores``, the canary embedded by
    ``encoder`` (an :class:`~training.onnx_encoder.OnnxArtifactEncoder` on ``out``; loaders must agree within
    ``canary_atol``) and the file list.

    Raises:
        pydantic.ValidationError: a field breaks the contract.
    """
    manifest = Manifest(
        **fields,
        created_at=now_utc(),
        sha256=sha256_file(out / MODEL_FILE),
        scores=scores,
        parity=parity,
        canary=Canary(
            sentences=CANARY_SENTENCES, embeddings=encoder.encode(CANARY_SENTENCES).tolist(), atol=canary_atol
        ),
        files=sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")),
    )
    write_manifest(out, manifest)
    return manifest
