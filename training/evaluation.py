"""STS evaluation ("all" setting) and alignment/uniformity, for torch models and ONNX artifacts.

* STS: Spearman ×100 of cosine similarity vs gold per task (SentEval "all" setting: one
  correlation per STS12–16 year over its concatenated subsets; STS-B test; SICK-R test) and
  the mean of the seven (``"mean"``). Loaders: :mod:`training.data.sts`.
* Alignment and uniformity (Wang & Isola, 2020), on L2-normalised embeddings, as in SimCSE §6:
  alignment = E_(x,y)∈pos ‖f(x) − f(y)‖² over STS-B test pairs with gold score > 4;
  uniformity = log E_(x,y) exp(−2 ‖f(x) − f(y)‖²) over all pairs of distinct STS-B test sentences.
  Lower is better for both.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from training.data.sts import TEST_TASKS, STSPairs, cosine_spearman, load_task

EncodeFn = Callable[[Sequence[str]], np.ndarray]  # sentences -> (N, D) float32


def unique_encode(encode: EncodeFn, sentences: Iterable[str]) -> dict[str, np.ndarray]:
    """Encode each distinct sentence once; returns sentence -> ``(D,)`` embedding."""
    uniq = list(dict.fromkeys(sentences))
    emb = encode(uniq)
    return {s: emb[i] for i, s in enumerate(uniq)}


def subsample(d: STSPairs, limit: int | None, seed: int = 0) -> STSPairs:
    """A fixed random subsample of ``limit`` pairs (``default_rng(seed)``, original order kept); all if None."""
    if not limit or limit >= len(d):
        return d
    idx = np.sort(np.random.default_rng(seed).choice(len(d), size=limit, replace=False))
    return STSPairs(d.name, [d.sent1[i] for i in idx], [d.sent2[i] for i in idx], d.scores[idx])


def evaluate_sts(
    encode: EncodeFn, tasks: Sequence[str] = tuple(TEST_TASKS), with_mean: bool = True, limit: int | None = None
) -> dict[str, float]:
    """Spearman ×100 per task (each distinct sentence encoded once). Adds ``"mean"`` over ``tasks``
    when ``with_mean`` and ``tasks`` include the seven test tasks. ``limit``: a fixed random subsample of N
    pairs per task (:func:`subsample`; for smoke tests and CPU benchmarks, never for headline numbers)."""
    data = {t: subsample(load_task(t), limit) for t in tasks}
    table = unique_encode(encode, (s for d in data.values() for s in (*d.sent1, *d.sent2)))
    scores = {}
    for t, d in data.items():
        a = np.stack([table[s] for s in d.sent1])
        b = np.stack([table[s] for s in d.sent2])
        scores[t] = cosine_spearman(a, b, d.scores)
    if with_mean and set(TEST_TASKS) <= set(tasks):
        scores["mean"] = float(np.mean([scores[t] for t in TEST_TASKS]))
    return scores


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def alignment_uniformity(
    encode: EncodeFn, task: str = "STSBenchmark", pos_threshold: float = 4.0, limit: int | None = None
) -> dict[str, float]:
    """Wang & Isola (2020) alignment (α=2) and uniformity (t=2) on ``task`` (see module docstring).

    ``limit``: a fixed random subsample of N pairs (:func:`subsample`). Returns ``{"alignment": float, "uniformity": float}``.
    """
    d = subsample(load_task(task), limit)
    table = unique_encode(encode, (*d.sent1, *d.sent2))
    pos = d.scores > pos_threshold
    a = _normalize(np.stack([table[s] for s, p in zip(d.sent1, pos) if p]).astype(np.float64))
    b = _normalize(np.stack([table[s] for s, p in zip(d.sent2, pos) if p]).astype(np.float64))
    align = float(np.mean(np.sum((a - b) ** 2, axis=1)))
    x = _normalize(np.stack(list(table.values())).astype(np.float64))
    sq = np.maximum(2.0 - 2.0 * (x @ x.T), 0.0)
    iu = np.triu_indices(len(x), k=1)
    vals = -2.0 * sq[iu]
    m = vals.max()
    unif = float(m + np.log(np.mean(np.exp(vals - m))))
    return {"alignment": align, "uniformity": unif}


# ---------------------------------------------------------------------------------------
# Encoders for a path: HF / sentence-transformers directory (torch) or ONNX artifact.
# ---------------------------------------------------------------------------------------


def is_onnx_artifact(path: str | os.PathLike) -> bool:
    """True when ``path`` holds ``model.onnx`` and ``manifest.json`` (the artifact contract)."""
    from artifact_contract import MANIFEST_FILE, MODEL_FILE

    p = Path(path)
    return (p / MODEL_FILE).is_file() and (p / MANIFEST_FILE).is_file()


def torch_encode_fn(
    model_dir: str, max_seq_length: int = 128, batch_size: int = 128, pooling: str | None = None, device=None
) -> EncodeFn:
    """Encode with :class:`training.encoder.SentenceEncoder` (eval mode, no gradient; a saved ``Dense`` head is
    applied, a train-only head is not), on ``device`` (None: the CPU)."""
    from training.encoder import SentenceEncoder

    enc = SentenceEncoder(model_dir, pooling=pooling, max_seq_length=max_seq_length)
    if device is not None:
        enc.to(device)
    enc.eval()
    return lambda sents: enc.encode(sents, batch_size=batch_size, max_seq_length=max_seq_length)


def onnx_encode_fn(
    artifact_dir: str, max_seq_length: int | None = None, batch_size: int = 128, threads: int | None = None
) -> EncodeFn:
    """Encode with an ONNX artifact (:class:`training.onnx_encoder.OnnxArtifactEncoder`: onnxruntime on CPU,
    ``tokenizers``, :func:`artifact_contract.postprocess` with the manifest's ``normalize``).

    ``max_seq_length`` defaults to the manifest's. Raises ``ArtifactError`` for an invalid artifact.
    """
    from artifact_contract import validate_artifact
    from training.onnx_encoder import OnnxArtifactEncoder

    man = validate_artifact(artifact_dir)
    enc = OnnxArtifactEncoder(artifact_dir, intra_op_threads=threads or 0, max_seq_length=max_seq_length)
    return lambda sents: enc.encode(list(sents), batch_size=batch_size, normalize=man.normalize)


def encode_fn_for(
    path: str,
    max_seq_length: int | None = 128,
    batch_size: int = 128,
    pooling: str | None = None,
    threads: int | None = None,
) -> EncodeFn:
    """An :data:`EncodeFn` for an ONNX artifact directory (pooling is inside its graph) or an HF /
    sentence-transformers directory (``pooling``: ``cls``/``mean``; None: its sentence-transformers config, else mean).
    ``threads``: onnxruntime's intra-op threads for an artifact (None: one per core); torch's are the caller's.
    """
    if is_onnx_artifact(path):
        return onnx_encode_fn(path, max_seq_length, batch_size, threads)
    return torch_encode_fn(path, max_seq_length or 128, batch_size, pooling=pooling)


def format_table(scores: dict[str, float], extra: dict[str, float] | None = None) -> str:
    """A plain-text table: STS Spearman ×100, then transfer accuracy ×100 (MRPC-f1: F1 ×100), in reporting order."""
    short = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R", "STSBenchmark-dev": "STS-B dev"}
    keys = [k for k in [*TEST_TASKS, "mean", "STSBenchmark-dev"] if k in scores]
    keys += [k for k in scores if k not in keys]
    lines = [f"{'task':<12} {'score x100':>14}"]
    lines += [f"{short.get(k, k):<12} {scores[k]:>14.2f}" for k in keys]
    for k, v in (extra or {}).items():
        lines.append(f"{k:<12} {v:>14.4f}")
    return "\n".join(lines)
