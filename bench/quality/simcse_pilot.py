"""SimCSE pilot on raw encoders (not in CI): does unsupervised SimCSE lift each encoder, and by how much?

For every encoder given (Hugging Face directories made by ``python -m training pretrain``):

1. STS-B dev (Spearman × 100 of cosine similarity, truncation at 32 tokens) and alignment/uniformity of the
   untrained encoder, with [CLS] and with mean pooling (``python -m training eval``);
2. 100 steps of SimCSE's unsupervised recipe (``configs/raw_small_simcse.yaml``: [CLS] + MLP head, batch 64,
   lr 3e-5, temperature 0.05; Gao et al., arXiv:2104.08821) with STS-B dev every 25 steps, and the same with mean
   pooling and no head;
3. the encoder's held-out masked-token accuracy, read from its ``pretrain_recipe.json``.

Each step's result is cached under ``--out`` (finished steps are skipped, so the table grows over sittings) and the
table of docs/results.md ("A stronger encoder hurts less") is printed: untrained score, the four evaluations, and
the change after 100 steps (positive = SimCSE lifts the encoder).

Usage::

    python -m bench.quality.simcse_pilot ~/.cache/redundancy-embed/raw_small/encoder \\
        ~/.cache/redundancy-embed/raw_small_more/encoder ~/.cache/redundancy-embed/raw_small_long/encoder
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.lib import REPO

DEV = "STSBenchmark-dev"
#: pilot name -> (pooling evaluated untrained, extra ``train`` flags)
PILOTS = {"cls_head": ("cls", []), "mean": ("mean", ["--pooling", "mean", "--mlp_head", "false"])}


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as f:
        subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, check=True)


def untrained(enc: str, pooling: str, out: Path, threads: int) -> dict:
    """STS-B dev + alignment/uniformity of the untrained encoder (cached in ``out/untrained_<pooling>.json``)."""
    js = out / f"untrained_{pooling}.json"
    if not js.is_file():
        cmd = [sys.executable, "-m", "training", "eval", "--model", enc, "--pooling", pooling, "--tasks", DEV,
               "--align-uniform", "--max-seq-length", "32", "--threads", str(threads), "--json", str(js)]  # fmt: skip
        _run(cmd, out / "pilot.log")
    return json.loads(js.read_text())


def pilot(enc: str, name: str, flags: list[str], out: Path, steps: int, threads: int) -> dict:
    """``steps`` SimCSE steps with STS-B dev every ``steps // 4``; returns InfoNCE at step 0 / last, dev scores."""
    run = out / name
    metrics = run / "metrics.jsonl"
    done = run / "pilot.json"
    if done.is_file():
        return json.loads(done.read_text())
    cmd = [sys.executable, "-m", "training", "train", "--config", "configs/raw_small_simcse.yaml",
           "--model_name_or_path", enc, "--max_steps", str(steps), "--eval_every", str(max(steps // 4, 1)),
           "--final_eval", "false", "--export", "false", "--progress", "false", "--threads", str(threads),
           "--save_every", "0", "--resume", "false", "--output_dir", str(run), *flags]  # fmt: skip
    _run(cmd, out / "pilot.log")
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    train = [r for r in rows if r.get("kind") == "train"]
    dev = {r["step"]: r[DEV] for r in rows if r.get("kind") == "eval" and DEV in r and r["step"] > 0}
    rec = {"infonce_first": train[0]["loss"], "infonce_last": train[-1]["loss"], "dev": dev}
    done.write_text(json.dumps(rec, indent=2))
    return rec


def mlm_accuracy(enc: str) -> float | None:
    """Held-out masked-token accuracy (%) recorded by ``python -m training pretrain``, if any."""
    from training.pretrain.loop import RECIPE_FILE

    p = Path(enc) / RECIPE_FILE
    return 100 * json.loads(p.read_text())["final"]["heldout_accuracy"] if p.is_file() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("encoders", nargs="+", help="Hugging Face encoder directories")
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "redundancy-embed" / "simcse_pilot"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()}  ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())})")
    lines = ["| encoder (masked-token acc.) | pooling | untrained | STS-B dev during SimCSE | change | InfoNCE |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for enc in (str(Path(e).expanduser()) for e in args.encoders):
        out = Path(args.out).expanduser() / Path(enc).parent.name / f"steps{args.steps}"
        out.mkdir(parents=True, exist_ok=True)
        acc = mlm_accuracy(enc)
        label = f"{Path(enc).parent.name} ({acc:.1f} %)" if acc is not None else Path(enc).parent.name
        for name, (pooling, flags) in PILOTS.items():
            base = untrained(enc, pooling, out, args.threads)[DEV]
            rec = pilot(enc, name, flags, out, args.steps, args.threads)
            dev = [rec["dev"][k] for k in sorted(rec["dev"], key=int)]
            during = " / ".join(f"{v:.1f}" for v in dev)
            lines.append(f"| {label} | {name} | {base:.2f} | {during} | {dev[-1] - base:+.1f} | "
                         f"{rec['infonce_first']:.2f} → {rec['infonce_last']:.3f} |")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
