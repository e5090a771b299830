"""What front processes take off the core's event loop, per request, measured without the server around it.

One request of ``--batch`` STS-B sentences: the work a single process's event loop does for ``POST /v1/embeddings``
that, with ``--api-workers`` N > 1, moves to a front (the JSON body parsed by orjson, validated by
``EmbeddingsRequest``, the answer built from a ``(batch, 384)`` float32 array by the route's own code: floats, or
base64 rows), against what the core's loop does instead for the same request (the internal request's JSON parsed,
``service.http.inference.internal.decode_request``, and the rows' bytes, ``tobytes``). CPU time of this thread
(``time.thread_time``), best of ``--repeat`` runs of ``--n`` requests each. The rest of a request's loop work (HTTP
parsing, the middleware, the batcher's hand-offs) stays on the core either way and is not measured here:
``bench/serving/gpu_serve.py`` measures the whole loop.

``--health URL PID``: instead, the event-loop CPU (``/proc``, the main thread of process ``PID``) per ``GET /health`` of
the service at ``URL`` (4 client threads, ``--n`` requests): what one request costs a loop in HTTP parsing, the
middleware, FastAPI's routing and a small JSON answer, with no work of its own (the price the core still pays for
each internal call of a front).

Usage: ``python -m bench.serving.loop_split [--batch 32] [--n 2000] [--health http://127.0.0.1:8000 PID]``
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import orjson

from bench.lib.machine import cpu_model
from training.data.sts import load_task


def best_ms(fn, n: int, repeat: int) -> float:
    """Best of ``repeat`` runs: the thread CPU milliseconds of one call of ``fn``, averaged over ``n`` calls."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.thread_time()
        for _ in range(n):
            fn()
        best = min(best, (time.thread_time() - t0) / n * 1000)
    return best


def health(url: str, pid: int, n: int) -> int:
    """Print the loop CPU milliseconds per ``GET /health`` of the service at ``url`` (process ``pid``)."""
    import threading

    import httpx

    from bench.serving.gpu_serve import loop_cpu_seconds

    def client() -> None:
        with httpx.Client(base_url=url) as c:
            for _ in range(n // 4):
                assert c.get("/health").status_code == 200

    c0 = loop_cpu_seconds(pid)
    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ms = 1000 * (loop_cpu_seconds(pid) - c0) / (n // 4 * 4)
    print(f"CPU: {cpu_model()}, load average {os.getloadavg()[0]:.2f}; GET /health: {ms:.3f} ms loop CPU per request")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--health", nargs=2, metavar=("URL", "PID"))
    a = ap.parse_args()
    if a.health:
        return health(a.health[0], int(a.health[1]), a.n)

    from service.http.inference.embeddings import b64_row
    from service.http.inference.internal import decode_request, encode_request
    from service.http.inference.schemas import EmbeddingsRequest, as_list
    from service.http.kit import json_response

    s = load_task("STSBenchmark")
    texts = list(dict.fromkeys(s.sent1))[: a.batch]
    rows = np.random.default_rng(0).standard_normal((a.batch, 384)).astype(np.float32)
    body = orjson.dumps({"input": texts, "encoding_format": "base64"})
    internal = encode_request(texts, {"model": None, "dimensions": None, "param": "input", "prompt_role": None})

    def parse_validate() -> None:
        EmbeddingsRequest.model_validate(orjson.loads(body)).input  # noqa: B018

    def answer(b64: bool):
        def build() -> None:
            emb = [b64_row(r) for r in rows] if b64 else list(rows)
            data = [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(emb)]
            usage = {"prompt_tokens": 400, "total_tokens": 400}
            json_response({"object": "list", "data": data, "model": "m", "model_version": "1", "usage": usage})

        return build

    def core_instead() -> None:
        decode_request(internal)
        rows.tobytes()

    as_list(texts)
    load = os.getloadavg()[0]
    print(f"CPU: {cpu_model()}, load average {load:.2f}; {a.batch} inputs per request, best of {a.repeat} x {a.n}")
    print("| work | thread CPU ms per request |\n|---|---|")
    for name, fn in (
        ("parse + validate the client's body", parse_validate),
        ("build the answer, floats", answer(False)),
        ("build the answer, base64", answer(True)),
        ("the core instead: internal request parsed, rows' bytes", core_instead),
    ):
        print(f"| {name} | {best_ms(fn, a.n, a.repeat):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
