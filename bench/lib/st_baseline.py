"""The sentence-transformers baseline the serving benchmarks compare the service with: one timed ``encode``."""

from __future__ import annotations

import time


def best_encode_seconds(model, texts: list[str], batch_size: int, repeats: int = 3) -> float:
    """Best wall-clock seconds of ``repeats`` ``model.encode(texts, batch_size=batch_size)`` calls, after a warm-up
    on the first ``4 * batch_size`` texts; on CUDA the device is synchronised around each call (kernels run
    asynchronously).

    Args:
        model: a ``sentence_transformers.SentenceTransformer`` (any device and dtype).
        texts: the sentences, encoded in this order (``SentenceTransformer.encode`` sorts them by length itself).
    """
    import torch

    cuda = str(model.device).startswith("cuda")
    model.encode(texts[: 4 * batch_size], batch_size=batch_size)  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.encode(texts, batch_size=batch_size, convert_to_numpy=True)
        if cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best
