"""Domain fine-tuning of the bi-encoder on BEIR SciFact with and without 3R, several seeds each, the same budget:
dev nDCG@10 (model choice), test nDCG@10 and Recall@100 per run, and the paired difference (3R - plain, seed by
seed) with its 95 % t interval.

Each run is ``python -m training train --config CONFIG --seed S --output_dir ROOT/<config>-s<S>`` (configs
``configs/scifact_sup.yaml`` and ``configs/scifact_sup_3r.yaml``: data.mode retrieval, the train/dev split fixed by
``data.split_seed`` for every seed); runs go ``--parallel`` at a time (on a GPU several share it), and a run whose
``results.json`` exists is not run again (resumable).

    python -m bench.quality.scifact_finetune --root /work/runs/scifact_ft --seeds 1,2,3,4,5 --parallel 5 \\
        --train-arg=--threads=2 --json /work/runs/scifact_ft/summary.json

Prints the CPU (and GPU) and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lib import REPO
from bench.lib.machine import cpu_model, gpu_model, write_json

CONFIGS = {"plain": "configs/scifact_sup.yaml", "3r": "configs/scifact_sup_3r.yaml"}


def run_one(root: Path, name: str, config: str, seed: int, extra: list[str]) -> dict:
    """Train one (config, seed) unless its ``results.json`` exists; returns that file's content."""
    out = root / f"{name}-s{seed}"
    res = out / "results.json"
    if not res.is_file():
        out.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "training", "train", "--config", config, "--seed", str(seed),
               "--output_dir", str(out), "--export", "false", "--progress", "false", *extra]  # fmt: skip
        t0 = time.perf_counter()
        with open(out / "train.log", "w") as log:
            rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        print(f"{name} seed {seed}: exit {rc} in {time.perf_counter() - t0:.0f} s", flush=True)
        if rc != 0 or not res.is_file():
            return {"error": f"exit {rc}", "log": str(out / "train.log")}
    return json.loads(res.read_text())


def t_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of paired differences and its two-sided ``level`` Student-t interval."""
    from scipy import stats

    m = statistics.fmean(diffs)
    if len(diffs) < 2:
        return m, float("nan"), float("nan")
    half = stats.t.ppf(0.5 + level / 2, len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5
    return m, m - half, m + half


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=str(REPO.parent / "runs" / "scifact_ft"), help="run folders (resumable)")
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--configs", default="plain,3r", help=f"of {sorted(CONFIGS)}")
    ap.add_argument("--parallel", type=int, default=1, help="runs at a time")
    ap.add_argument("--train-arg", action="append", default=[], help="extra flag for every run (--train-arg=--x=1)")
    ap.add_argument("--json", help="write the table here too")
    a = ap.parse_args(argv)
    root, seeds, names = Path(a.root), [int(s) for s in a.seeds.split(",")], a.configs.split(",")
    print(f"CPU: {cpu_model()}; GPU: {gpu_model()}; load average before: {os.getloadavg()}", flush=True)
    jobs = [(n, s) for s in seeds for n in names]
    with ThreadPoolExecutor(a.parallel) as pool:
        got = dict(zip(jobs, pool.map(lambda j: run_one(root, j[0], CONFIGS[j[0]], j[1], a.train_arg), jobs)))
    print(f"load average after: {os.getloadavg()}\n")
    rows = []
    for (n, s), r in got.items():
        sc = r.get("scores", {})
        dev = next((v for k, v in sc.items() if k.endswith("-dev-ndcg@10")), None)
        test = next((v for k, v in sc.items() if k.endswith("-test-ndcg@10")), None)
        rec = next((v for k, v in sc.items() if "-test-recall" in k), None)
        rows.append({"config": n, "seed": s, "dev_ndcg@10": dev, "test_ndcg@10": test, "test_recall@100": rec,
                     "best_step": r.get("best_step"), "c_final": r.get("c_final"), "error": r.get("error")})  # fmt: skip
    print("| config | seed | dev nDCG@10 | test nDCG@10 | test Recall@100 | best step | c |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    fmt = lambda v: "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)  # noqa: E731
    for r in rows:
        cells = [r["config"], r["seed"], r["dev_ndcg@10"], r["test_ndcg@10"], r["test_recall@100"], r["best_step"]]
        print(
            "| " + " | ".join(fmt(v) for v in [*cells, r["c_final"]]) + " |" + (f" {r['error']}" if r["error"] else "")
        )
    summary = {}
    for n in names:
        t = [r["test_ndcg@10"] for r in rows if r["config"] == n and r["test_ndcg@10"] is not None]
        if t:
            summary[n] = {"mean": statistics.fmean(t), "sd": statistics.stdev(t) if len(t) > 1 else 0.0, "n": len(t)}
            print(f"{n}: test nDCG@10 mean {summary[n]['mean']:.2f} (sd {summary[n]['sd']:.2f}, {len(t)} seeds)")
    if {"plain", "3r"} <= set(names):
        by = {(r["config"], r["seed"]): r["test_ndcg@10"] for r in rows}
        diffs = [by["3r", s] - by["plain", s] for s in seeds if by.get(("3r", s)) is not None
                 and by.get(("plain", s)) is not None]  # fmt: skip
        if diffs:
            m, lo, hi = t_interval(diffs)
            summary["3r_minus_plain"] = {"mean": m, "ci95": [lo, hi], "n": len(diffs)}
            print(
                f"3R - plain, paired by seed: {m:+.2f} nDCG@10, 95 % interval [{lo:+.2f}, {hi:+.2f}] ({len(diffs)} seeds)"
            )
    write_json(a.json, [*rows, {"summary": summary}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
