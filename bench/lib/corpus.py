"""The corpus sentences' embeddings (``../shared/data/corpus/en_sentences.txt`` by the default artifact, cached):
real 384-d text vectors for the search and backend benchmarks."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from bench.lib import REPO


def corpus_embeddings(cache_dir: Path, limit: int | None, artifact: Path) -> tuple[np.ndarray, float]:
    """Embeddings of the corpus (first ``limit`` lines), cached; returns ``(X, seconds spent embedding or 0 if cached)``."""
    lines = (REPO.parent / "shared" / "data" / "corpus" / "en_sentences.txt").read_text(encoding="utf-8").split("\n")
    lines = [s for s in lines if s.strip()]
    if limit:
        lines = lines[:limit]
    path = cache_dir / f"corpus_{len(lines)}_{artifact.name}.npy"
    if path.exists():
        return np.load(path), 0.0
    from tqdm import tqdm

    from training.onnx_encoder import OnnxArtifactEncoder

    enc = OnnxArtifactEncoder(artifact, intra_op_threads=2)
    t0 = time.perf_counter()
    parts = []
    for i in tqdm(range(0, len(lines), 4096), desc="embedding corpus", unit="chunk"):
        parts.append(enc.encode(lines[i : i + 4096], batch_size=128))
    X = np.concatenate(parts).astype(np.float32)
    secs = time.perf_counter() - t0
    cache_dir.mkdir(parents=True, exist_ok=True)
    np.save(path, X)
    print(f"embedded {len(lines)} sentences in {secs:.0f}s ({len(lines) / secs:.0f}/s) -> {path}")
    return X, secs
