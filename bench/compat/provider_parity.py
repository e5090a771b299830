"""Parity of served embeddings with the CPU fp32 reference on STS-B test: the check to run first on a GPU.

For each ``--artifact``, the real service (``python -m service --default-model <artifact> --providers <p>``) embeds
every distinct STS-B test sentence over HTTP (``POST /v1/embeddings``, base64, ``--batch`` inputs per request). The
reference is the fp32 artifact ``--reference`` in-process on ONNX Runtime's CPU provider
(:func:`training.evaluation.onnx_encode_fn`). Reported per artifact: the providers the service's ``/info`` names,
the minimum per-sentence cosine and the largest element difference between served and reference embeddings
(:func:`training.export.parity.measure_parity`, the figures an export's manifest records), STS-B test Spearman x100 of
the cosine scores of each (:func:`training.data.sts.cosine_spearman`) and their difference.

Bounds (the GPU issue's): min cosine >= ``--min-cosine`` (0.999) and |Spearman difference| <= ``--max-spearman-diff``
(0.1 points), and, with ``--expect-provider``, that provider first in ``/info``. Exit status 1 when an artifact
misses one (the table says which). An fp16 artifact loads only on the CUDA provider (the service refuses it on a CPU).

Usage::

    python -m bench.compat.provider_parity --artifact all-minilm-l6-v2 --artifact all-minilm-l6-v2-fp16 \\
        --providers cuda --expect-provider CUDAExecutionProvider --json $OUT/parity.json     # on a lent GPU
    python -m bench.compat.provider_parity --artifact all-minilm-l6-v2 --artifact all-minilm-l6-v2-int8 --providers cpu

Not a test (nothing here needs a GPU to be checked): it prints a table (``--json`` writes the numbers).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.lib import REPO
from bench.lib.machine import cpu_model
from bench.lib.server import run_server
from training.data.sts import cosine_spearman, load_stsb
from training.evaluation import onnx_encode_fn
from training.export.parity import measure_parity


def served(url: str, sentences: list[str], batch: int) -> np.ndarray:
    """``(len(sentences), D)`` float32 embeddings from the service at ``url`` (base64 answers)."""
    import httpx

    out = []
    with httpx.Client(base_url=url, timeout=300) as c:
        for i in range(0, len(sentences), batch):
            r = c.post("/v1/embeddings", json={"input": sentences[i : i + batch], "encoding_format": "base64"})
            r.raise_for_status()
            out += [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in r.json()["data"]]
    return np.stack(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models-dir", default=str(REPO / "models"))
    ap.add_argument("--artifact", action="append", required=True, help="an artifact to serve (repeatable)")
    ap.add_argument("--reference", default="all-minilm-l6-v2", help="the fp32 artifact run on the CPU")
    ap.add_argument("--providers", default="auto", help="the service's --providers")
    ap.add_argument("--expect-provider", default=None, help="fail unless /info names this provider first")
    ap.add_argument("--server-arg", action="append", default=[], help="an extra service flag (repeatable)")
    ap.add_argument("--batch", type=int, default=64, help="inputs per request")
    ap.add_argument("--min-cosine", type=float, default=0.999)
    ap.add_argument("--max-spearman-diff", type=float, default=0.1)
    ap.add_argument("--json")
    a = ap.parse_args()

    load0 = os.getloadavg()[0]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average {load0:.2f}")
    test = load_stsb("test")
    uniq = list(dict.fromkeys(test.sent1 + test.sent2))
    index = {s: i for i, s in enumerate(uniq)}
    i1, i2 = [index[s] for s in test.sent1], [index[s] for s in test.sent2]
    ref = onnx_encode_fn(str(Path(a.models_dir) / a.reference))(uniq)
    ref_spearman = cosine_spearman(ref[i1], ref[i2], test.scores)
    print(f"reference {a.reference} on the CPU: {len(uniq)} sentences, STS-B test Spearman {ref_spearman:.3f}")

    rows, failed = [], False
    for art in a.artifact:
        args = ["--default-model", art, "--providers", a.providers, "--log-level", "warning", *a.server_arg]
        try:
            with run_server(Path(a.models_dir), workdir=Path(tempfile.mkdtemp(prefix="parity-")), args=args) as srv:
                import httpx

                providers = httpx.get(f"{srv.url}/info", timeout=30).json()["providers"]
                got = served(srv.url, uniq, a.batch)
        except Exception as e:  # the service refused the artifact here (its log's last lines say why)
            lines = str(e).splitlines() or [repr(e)]
            why = next(
                (ln for ln in reversed(lines) if re.match(r"[\w.]+(Error|Unsupported|Exception): ", ln)), lines[-1]
            )
            rows.append({"artifact": art, "providers": [], "fails": [f"service did not start: {why.strip()[:300]}"]})
            failed = True
            continue
        par = measure_parity(ref, got, "STS-B test, every distinct sentence", providers[0])  # the export's figures
        sp = cosine_spearman(got[i1], got[i2], test.scores)
        why = [
            *([f"min cosine < {a.min_cosine}"] if par.min_cosine < a.min_cosine else []),
            *([f"|dSpearman| > {a.max_spearman_diff}"] if abs(sp - ref_spearman) > a.max_spearman_diff else []),
            *([f"runs on {providers}"] if a.expect_provider and providers[:1] != [a.expect_provider] else []),
        ]
        failed |= bool(why)
        rows.append({"artifact": art, "providers": providers, "min_cosine": par.min_cosine,
                     "max_abs_diff": par.max_abs_diff, "spearman": sp, "spearman_diff": sp - ref_spearman,
                     "fails": why})  # fmt: skip
    print(f"\nserved with --providers {a.providers}, {a.batch} inputs per request, against {a.reference} on the CPU")
    print("| artifact | /info providers | min cosine | max abs diff | STS-B test Spearman | difference | bounds |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "min_cosine" not in r:
            print(f"| {r['artifact']} | - | - | - | - | - | {r['fails'][0]} |")
            continue
        print(f"| {r['artifact']} | {', '.join(r['providers'])} | {r['min_cosine']:.6f} | {r['max_abs_diff']:.2e} "
              f"| {r['spearman']:.3f} | {r['spearman_diff']:+.3f} | {'; '.join(r['fails']) or 'met'} |")  # fmt: skip
    print(f"\nload average before {load0:.2f}, after {os.getloadavg()[0]:.2f}")
    if a.json:
        Path(a.json).write_text(
            json.dumps({"reference_spearman": ref_spearman, "rows": rows, "args": vars(a)}, indent=1)
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
