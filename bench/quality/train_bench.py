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

    python -m bench.quality.train_bench --out /tmp/train_bench --steps 25 --seeds 0 1 2
    python -m bench.quality.train_bench --out /tmp/train_bench --report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench.lib.train_runs import SETTINGS, TASKS, append_run, done_runs, run_baseline, run_one


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
        "command": f"python -m bench.quality.train_bench --out {out} --overhead {steps}",
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
        append_run(out, rec)
        print(json.dumps(rec))
        return 0
    done = done_runs(out)
    if ("none", -1, 0) not in done:
        append_run(out, run_baseline(out, a.threads, a.eval_limit or None))
    for i, seed in enumerate(a.seeds):
        for s in a.settings:
            if (s, seed, 64) not in done:
                rec = run_one(out, s, seed, a.steps, 64, 0, a.threads, True, a.extra, a.eval_limit or None)
                append_run(out, rec)
                print(
                    json.dumps({k: rec.get(k) for k in ("setting", "seed", "returncode", "wall_seconds")}), flush=True
                )
        if i == 0:
            for b in a.big_batches:
                if ("simcse", seed, b) not in done:
                    rec = run_one(
                        out, "simcse", seed, a.big_steps, b, a.chunk, a.threads, False, a.extra, a.eval_limit or None
                    )
                    append_run(out, rec)
                    print(json.dumps({k: rec.get(k) for k in ("setting", "batch_size", "returncode")}), flush=True)
    print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
