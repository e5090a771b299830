"""Benchmark of methods (not in CI): InforMin-CL, SSCL, MSSE, each alone and + 3R.

Same protocol as ``bench/quality/train_bench.py`` (the SimCSE/3R bench), whose ``run_one`` it
reuses: from the default encoder, ``python -m training train`` in a subprocess per run, batch 64,
``--steps`` steps, the given seeds, final STS suite on a fixed ``--eval-limit`` subsample per task,
one JSON line per run in ``<out>/runs.jsonl``. Each setting is one of ``configs/<name>.yaml``
(``simcse``/``simcse_3r`` are B's settings, included for a same-machine reference).

SparseCSE has its own sweep command (``python -m training sparse sweep``, see docs/results.md).

Usage::

    python -m bench.quality.methods_bench --out /tmp/methods_bench --steps 25 --seeds 0
    python -m bench.quality.methods_bench --out /tmp/methods_bench --report
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from bench.lib.train_runs import SETTINGS, TASKS, append_run, done_runs, run_baseline, run_one

METHODS = {
    "informin": ["--config", "configs/informin.yaml"],
    "informin_3r": ["--config", "configs/informin_3r.yaml"],
    "sscl": ["--config", "configs/sscl.yaml"],
    "sscl_3r": ["--config", "configs/sscl_3r.yaml"],
    "msse": ["--config", "configs/msse.yaml"],
    "msse_3r": ["--config", "configs/msse_3r.yaml"],
}
REFERENCE = {"simcse": SETTINGS["simcse"], "simcse_3r": SETTINGS["simcse_3r"]}


def report(out: Path) -> str:
    """Markdown table: mean ± std over seeds per setting and task, plus loss terms and speed."""
    recs = [json.loads(l) for l in (out / "runs.jsonl").read_text().splitlines() if l.strip()]
    ok = [r for r in recs if r.get("returncode") == 0 and r.get("scores")]
    short = {"STSBenchmark": "STS-B", "SICKRelatedness": "SICK-R"}
    cols = TASKS + ["mean", "STSBenchmark-dev"]
    lines = [
        "| setting | seeds | " + " | ".join(short.get(t, t) for t in cols) + " | loss step 0 → last | steps/s |",
        "|---|---|" + "---|" * len(cols) + "---|---|",
    ]
    for s in ["none", *REFERENCE, *METHODS]:
        rs = [r for r in ok if r["setting"] == s]
        if not rs:
            continue
        cells = []
        for t in cols:
            v = [r["scores"][t] for r in rs if t in r["scores"]]
            cells.append(
                "-" if not v else (f"{np.mean(v):.2f}" if len(v) == 1 else f"{np.mean(v):.2f} ± {np.std(v):.2f}")
            )
        seeds = ",".join(str(r["seed"]) for r in rs) if s != "none" else "-"
        loss = "-" if s == "none" else "; ".join(f"{r['loss_first']:.3g} → {r['loss_last']:.3g}" for r in rs)
        sps = "-" if s == "none" else f"{np.mean([r['steps_per_second'] for r in rs]):.3f}"
        lines.append(f"| {s} | {seeds} | " + " | ".join(cells) + f" | {loss} | {sps} |")
    failed = [r for r in recs if r.get("returncode") not in (0, None)]
    if failed:
        lines += ["", "Failed runs: " + ", ".join(f"{r['setting']} seed {r['seed']}" for r in failed)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/methods_bench")
    ap.add_argument("--steps", type=int, default=25)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--settings", nargs="+", default=[*REFERENCE, *METHODS])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--eval-limit", type=int, default=500)
    ap.add_argument("--no-baseline", action="store_true", help="skip the untrained-encoder evaluation")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.report:
        print(report(out))
        return 0
    SETTINGS.update(METHODS)  # run_one looks settings up by name
    done = done_runs(out)
    if not a.no_baseline and ("none", -1, 0) not in done:
        append_run(out, run_baseline(out, a.threads, a.eval_limit or None))
    for seed in a.seeds:
        for s in a.settings:
            if (s, seed, 64) in done:
                continue
            rec = run_one(out, s, seed, a.steps, 64, 0, a.threads, True, [], a.eval_limit or None)
            append_run(out, rec)
            print(json.dumps({k: rec.get(k) for k in ("setting", "seed", "returncode", "wall_seconds")}), flush=True)
    print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
