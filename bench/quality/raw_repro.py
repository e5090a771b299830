"""Raw-encoder reproduction (not in CI): SimCSE vs SimCSE + 3R on the raw encoder pretrained here, N seeds.

The papers' regime at a 2-core-CPU scale: the encoder of ``configs/pretrain_raw_small.yaml`` (MLM only, never
sentence-tuned), SimCSE's unsupervised recipe (``configs/raw_small_simcse*.yaml``: [CLS] + MLP head at training,
[CLS] at test, length 32, batch 64, lr 3e-5, temperature 0.05, STS-B dev every 125 steps, best checkpoint kept).

For each setting and seed: ``python -m training train`` (the exact command is recorded), then the best checkpoint's
STS "all" (7 tasks + mean), alignment/uniformity, and optionally the SentEval transfer tasks
(``python -m training eval --tasks transfer``). 3R's internals over training (c, |S|, sigma's quantiles, loss) are
summarised from ``metrics.jsonl``. ``--baseline`` also scores the untrained raw encoder with [CLS] and with mean
pooling. One JSON line per finished run goes to ``<out>/runs.jsonl``; finished runs are skipped and unfinished
ones resume from their checkpoints, so a table can be built over several sittings.

``--report`` prints the markdown tables: mean ± std per setting, and the paired per-seed differences of the STS
mean (every setting − SimCSE; each method + 3R − the method alone, see :func:`bases`) with their 95 % t-intervals.
SparseCSE settings score the SimCSE run of the same seed, which runs first.

Usage::

    python -m bench.quality.raw_repro --out ~/.cache/redundancy-embed/raw_repro --seeds 0 1 2 3 4 --baseline
    python -m bench.quality.raw_repro --out ~/.cache/redundancy-embed/raw_repro --report
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from bench.lib import REPO

TASKS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness"]
TRANSFER = ["MR", "CR", "SUBJ", "MPQA", "SST2", "TREC", "MRPC"]
_S, _R = "configs/raw_small_simcse.yaml", "configs/raw_small_simcse_3r.yaml"
_SIMCSE = {"type": "simcse", "weight": 1.0, "params": {"temperature": 0.05}}
_INFORMIN = {"type": "informin", "weight": 1.0, "params": {"lam": 0.4, "beta": 0.0}}
_MSSE = {"type": "msse", "weight": 1.0, "params": {"mu": 0.8, "gamma": 0.2, "dcm_reduction": "sum"}}
_SSCL = {"type": "sscl", "weight": 1.0, "params": {"form": "authors", "temperature": 0.05, "layer": -2}}
# setting -> (base config, overrides); ``losses`` in the overrides replaces the base's loss terms
SETTINGS: dict[str, tuple[str, dict]] = {
    "simcse": (_S, {}),
    "simcse_3r": (_R, {}),
    # 3R's threshold c with the sigmoid straight-through surrogate (beta 0.02) and the previous c_lr
    "simcse_3r_sigmoid": (_R, {"three_r": {"c_estimator": "sigmoid", "c_lr": 1.0e-3}}),
    # the 3R paper's Table 3 variants
    # dynamic mask: c inside sigma's range at step 0 (~0.16-0.29, 10-90 %; above every sigma every embedding is
    # zeroed, a point no gradient leaves) and the sigmoid estimator (the identity one gives c exactly no gradient
    # under this variant): training/three_r.py refuses both
    "simcse_3r_dynamic": (_R, {"three_r": {"variant": "dynamic_mask", "c_init": 0.2, "c_estimator": "sigmoid"}}),
    "simcse_3r_overall": (_R, {"three_r": {"variant": "overall_subtraction"}}),
    "simcse_3r_token": (_R, {"three_r": {"variant": "token_subtraction"}}),
    "simcse_3r_static": (_R, {"three_r": {"variant": "static_identification"}}),
    # the relatives, alone and + 3R
    "informin": (_S, {"losses": {"simcse": _SIMCSE, "informin": _INFORMIN}}),
    "informin_3r": (_R, {"losses": {"simcse": _SIMCSE, "informin": _INFORMIN}}),
    "msse": (_S, {"losses": {"simcse": _SIMCSE, "msse": _MSSE}}),
    "msse_3r": (_R, {"losses": {"simcse": _SIMCSE, "msse": _MSSE}}),
    "sscl": (_S, {"losses": {"sscl": _SSCL}}),
    "sscl_3r": (_R, {"losses": {"sscl": _SSCL}}),
    # SparseCSE: the same training as simcse / simcse_3r, but of the raw encoder pruned by importance scored on the
    # SimCSE run of the same seed, its kept units rewound to the raw encoder (see _pruned_encoder)
    "sparsecse": (_S, {}),
    "sparsecse_3r": (_R, {}),
}
SPARSE = ("sparsecse", "sparsecse_3r")


def bases(setting: str) -> list[str]:
    """What a setting is compared with, seed by seed: every setting with SimCSE; a method + 3R also with the method
    alone (``informin_3r`` with ``informin``)."""
    if setting == "simcse" or setting.startswith("untrained"):
        return []
    alone = setting[: -len("_3r")] if setting.endswith("_3r") and setting != "simcse_3r" else None
    return ["simcse"] + ([alone] if alone else [])


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out.get(k) or {}, v) if isinstance(v, dict) and k != "losses" else v
    return out


def config_for(out: Path, setting: str) -> str:
    """The config file of ``setting``: its base config, or the base merged with its overrides (written once)."""
    import yaml

    base, over = SETTINGS[setting]
    if not over:
        return base
    path = out / "configs" / f"{setting}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = _merge(yaml.safe_load((REPO / base).read_text()), over)
    merged["output_dir"] = f"runs/raw_small_{setting}"
    path.write_text(f"# {base} with {json.dumps(over)}\n" + yaml.safe_dump(merged, sort_keys=False))
    return str(path)


def _runs(out: Path) -> list[dict]:
    f = out / "runs.jsonl"
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []


def _append(out: Path, rec: dict) -> None:
    with open(out / "runs.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _rewrite(out: Path, runs: list[dict]) -> None:
    tmp = out / "runs.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in runs))
    os.replace(tmp, out / "runs.jsonl")


def _run(cmd: list[str], log: Path) -> int:
    with open(log, "a") as f:
        return subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env={**os.environ}).returncode


def _internals(metrics: Path) -> dict:
    """3R's c, |S|, sigma quantiles and the loss at the first, middle and last logged training steps."""
    rows = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r.get("kind") == "train"]
    if not rows:
        return {}
    keys = ["step", "loss", "c", "c_grad", "n_redundant_dims", "sigma_q10", "sigma_q50", "sigma_q90"]
    pick = [rows[0], rows[len(rows) // 2], rows[-1]]
    return {"trajectory": [{k: r[k] for k in keys if k in r} for r in pick]}


def _pruned_encoder(out: Path, run_dir: Path, seed: int, args: argparse.Namespace) -> str | None:
    """SparseCSE's starting point for one seed (SparseCSE §2): importance of every head and FFN neuron scored on
    the unsupervised-SimCSE model of the same seed (its best checkpoint; λ 0.5, STS-B train positives, §2.3), the
    fraction ``--sparsity`` with the lowest scores removed, the kept units rewound to the raw encoder (§2.1).
    Returns the pruned directory, or None when a step failed (its log is ``run_dir/bench.log``)."""
    pruned = run_dir / "pruned"
    if (pruned / "sparse_structure.json").is_file():
        return str(pruned)
    scored = out / "runs" / f"simcse-s{seed}" / "best"
    imp = run_dir / "importance.json"
    score = [sys.executable, "-m", "training", "sparse", "score", "--model", str(scored), "--output", str(imp)]
    prune = [sys.executable, "-m", "training", "sparse", "prune", "--importance", str(imp),
             "--sparsity", str(args.sparsity), "--rewind-to", args.encoder, "--output", str(pruned)]  # fmt: skip
    if not scored.is_dir() or _run(score, run_dir / "bench.log") or _run(prune, run_dir / "bench.log"):
        return None
    return str(pruned)


def run_one(out: Path, setting: str, seed: int, args: argparse.Namespace) -> dict:
    run_dir = out / "runs" / f"{setting}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    encoder = _pruned_encoder(out, run_dir, seed, args) if setting in SPARSE else args.encoder
    if encoder is None:
        return {"setting": setting, "seed": seed, "returncode": 1, "error": "SparseCSE scoring or pruning failed"}
    cmd = [sys.executable, "-m", "training", "train", "--config", config_for(out, setting), "--seed", str(seed),
           "--output_dir", str(run_dir), "--export", "false", "--progress", "false", "--threads", str(args.threads),
           "--model_name_or_path", encoder]  # fmt: skip
    if args.max_steps:
        cmd += ["--max_steps", str(args.max_steps)]
    if args.eval_limit:
        cmd += ["--eval_limit", str(args.eval_limit)]
    t0 = time.time()
    rc = _run(cmd, run_dir / "bench.log")
    rec = {"setting": setting, "seed": seed, "returncode": rc, "wall_seconds": round(time.time() - t0, 1),
           "command": " ".join(["python", *cmd[1:]])}  # fmt: skip
    if rc != 0:
        return rec
    res = json.loads((run_dir / "results.json").read_text())
    rec.update({k: res.get(k) for k in ("best_step", "steps", "alignment", "uniformity", "c_final", "train_seconds")})
    rec["scores"] = {k.split("@")[0]: v for k, v in res.get("scores", {}).items()}
    rec.update(_internals(run_dir / "metrics.jsonl"))
    rec["max_steps"] = args.max_steps
    if args.transfer:
        _transfer(rec, run_dir, args)
    return rec


def _transfer(rec: dict, run_dir: Path, args: argparse.Namespace) -> None:
    js = run_dir / "transfer.json"
    ev = [sys.executable, "-m", "training", "eval", "--model", str(run_dir / "best"), "--tasks", "transfer",
          "--kfold", str(args.kfold), "--json", str(js)]  # fmt: skip
    t0 = time.time()
    if _run(ev, run_dir / "bench.log") == 0:
        rec["transfer"] = json.loads(js.read_text())
        rec["transfer_seconds"] = round(time.time() - t0, 1)


def add_transfer(out: Path, args: argparse.Namespace) -> None:
    """The SentEval transfer tasks for every finished run that lacks them (a separate, resumable pass)."""
    for i, rec in enumerate(runs := _runs(out)):
        if rec.get("seed") is None or rec.get("returncode") != 0 or "transfer_avg" in rec.get("transfer", {}):
            continue
        _transfer(rec, out / "runs" / f"{rec['setting']}-s{rec['seed']}", args)
        runs[i] = rec
        _rewrite(out, runs)
        print(json.dumps({"setting": rec["setting"], "seed": rec["seed"], "transfer": rec.get("transfer_seconds")}))


def baseline(out: Path, args: argparse.Namespace) -> None:
    """The untrained raw encoder's STS "all" with [CLS] and with mean pooling (and transfer if asked)."""
    done = {r["setting"] for r in _runs(out)}
    for pooling in ("cls", "mean"):
        name = f"untrained_{pooling}"
        if name in done:
            continue
        js = out / f"{name}.json"
        tasks = "all" if args.transfer else "sts"
        cmd = [sys.executable, "-m", "training", "eval", "--model", args.encoder, "--pooling", pooling,
               "--tasks", tasks, "--kfold", str(args.kfold), "--json", str(js)]  # fmt: skip
        if args.eval_limit:
            cmd += ["--limit", str(args.eval_limit)]
        if _run(cmd, out / "bench.log") == 0:
            scores = json.loads(js.read_text())
            rec = {"setting": name, "seed": None, "scores": {k: v for k, v in scores.items() if k not in TRANSFER}}
            rec["transfer"] = {k: v for k, v in scores.items() if k in TRANSFER or k == "transfer_avg"}
            rec["command"] = " ".join(["python", *cmd[1:]])
            _append(out, rec)


def _ms(xs: list[float]) -> str:
    return f"{np.mean(xs):.2f} ± {np.std(xs, ddof=1):.2f}" if len(xs) > 1 else f"{xs[0]:.2f}"


def report(out: Path) -> str:
    """Markdown: per-setting mean ± std (STS tasks, mean, transfer average, alignment, uniformity, c), then the
    paired 3R − SimCSE difference of the STS mean per seed with its 95 % t-interval."""
    from scipy import stats

    runs = [r for r in _runs(out) if r.get("returncode", 0) == 0]
    lines = ["| setting | seeds | " + " | ".join(TASKS) + " | mean | transfer avg | align | uniform | c final |",
             "|---" * (len(TASKS) + 7) + "|"]  # fmt: skip
    by: dict[str, list[dict]] = {}
    for r in runs:
        by.setdefault(r["setting"], []).append(r)
    for setting, rs in by.items():
        cells = [_ms([r["scores"][t] for r in rs]) for t in [*TASKS, "mean"]]
        tr = [r["transfer"]["transfer_avg"] for r in rs if "transfer_avg" in r.get("transfer", {})]
        extra = [_ms(tr) if tr else "-"]
        for k in ("alignment", "uniformity", "c_final"):
            v = [r[k] for r in rs if r.get(k) is not None]
            extra.append(f"{np.mean(v):.3f}" if v else "-")
        seeds = ",".join(str(r["seed"]) for r in rs) if rs[0]["seed"] is not None else "-"
        lines.append(f"| {setting} | {seeds} | " + " | ".join(cells + extra) + " |")
    lines += ["", "3R internals (first / middle / last logged step): c, |S| (dimensions below c), sigma quantiles",
              "", "| setting | seed | step | loss | c | abs S | sigma q10 | q50 | q90 |", "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for setting, rs in by.items():
        for r in rs if "3r" in setting else []:
            for t in r.get("trajectory", []):
                cells = [
                    t.get(k) for k in ("step", "loss", "c", "n_redundant_dims", "sigma_q10", "sigma_q50", "sigma_q90")
                ]
                lines.append(
                    f"| {setting} | {r['seed']} | " + " | ".join("-" if v is None else f"{v:.4g}" for v in cells) + " |"
                )
    lines += ["", "Paired differences of the STS mean (setting − its base, same seeds), with a 95 % t-interval:", ""]
    for setting, base in ((s, b) for s in by for b in bases(s) if b in by):
        a = {r["seed"]: r["scores"]["mean"] for r in by[base]}
        b = {r["seed"]: r["scores"]["mean"] for r in by[setting]}
        common = sorted(set(a) & set(b))
        if not common:
            continue
        d = np.array([b[k] - a[k] for k in common])
        line = f"- {setting} − {base}, seeds {common}: " + ", ".join(f"{x:+.2f}" for x in d) + f"; mean {d.mean():+.2f}"
        if len(d) >= 2:
            half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
            line += f", 95 % t-interval [{d.mean() - half:+.2f}, {d.mean() + half:+.2f}]"
        lines.append(line)
    return "\n".join(lines)


def plot_c(out: Path, path: Path) -> None:
    """c over training for every finished 3R run, with sigma's 10-90 % quantile band and |S| (the dimensions below
    c), from each run's metrics.jsonl: one panel per 3R setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in _runs(out) if r.get("returncode", 0) == 0 and "3r" in r["setting"]]
    settings = sorted({r["setting"] for r in runs})
    if not settings:
        return
    fig, axes = plt.subplots(2, len(settings), figsize=(5 * len(settings), 6), squeeze=False, sharex=True)
    for j, setting in enumerate(settings):
        for r in (r for r in runs if r["setting"] == setting):
            m = out / "runs" / f"{setting}-s{r['seed']}" / "metrics.jsonl"
            rows = [x for x in map(json.loads, m.read_text().splitlines()) if x.get("kind") == "train" and "c" in x]
            st = [x["step"] for x in rows]
            (line,) = axes[0][j].plot(st, [x["c"] for x in rows], label=f"c, seed {r['seed']}")
            if all("sigma_q10" in x for x in rows):
                axes[0][j].fill_between(st, [x["sigma_q10"] for x in rows], [x["sigma_q90"] for x in rows],
                                        color=line.get_color(), alpha=0.12)  # fmt: skip
            axes[1][j].plot(st, [x.get("n_redundant_dims") for x in rows], color=line.get_color())
        axes[0][j].set_title(setting)
        axes[0][j].set_ylabel("c (band: sigma q10-q90)")
        axes[1][j].set_ylabel("|S| (dimensions with sigma < c)")
        axes[1][j].set_xlabel("step")
        axes[0][j].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path.home() / ".cache" / "redundancy-embed" / "raw_repro"))
    ap.add_argument("--encoder", default=str(Path.home() / ".cache" / "redundancy-embed" / "raw_small" / "encoder"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--settings", nargs="+", default=["simcse", "simcse_3r"], choices=list(SETTINGS))
    ap.add_argument("--max-steps", type=int, default=0, help="0: the configs' budget (one epoch)")
    ap.add_argument("--eval-limit", type=int, default=None, help="STS pairs per task (dry runs only)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--transfer", action="store_true", help="also the SentEval transfer tasks per run")
    ap.add_argument("--transfer-only", action="store_true", help="only add transfer scores to finished runs")
    ap.add_argument("--kfold", type=int, default=10)
    ap.add_argument("--sparsity", type=float, default=0.1, help="SparseCSE: fraction of heads and neurons pruned")
    ap.add_argument("--baseline", action="store_true", help="also the untrained encoder, [CLS] and mean")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--plot", type=Path, help="with --report: also draw c over training for every 3R run (PNG)")
    args = ap.parse_args(argv)
    out = Path(args.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if args.report:
        print(report(out))
        if args.plot:
            plot_c(out, args.plot)
        return 0
    print(f"load average before: {os.getloadavg()}", flush=True)
    with open(out / "loadavg.jsonl", "a") as f:
        f.write(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": "start",
                            "argv": sys.argv[1:], "loadavg": os.getloadavg()}) + "\n")  # fmt: skip
    if args.transfer_only:
        add_transfer(out, args)
    elif args.baseline:
        baseline(out, args)
    done = {(r["setting"], r["seed"]) for r in _runs(out) if r.get("returncode", 0) == 0}
    settings = list(dict.fromkeys(args.settings))
    if any(s in SPARSE for s in settings):  # SparseCSE scores the SimCSE run of its seed: run that one first
        settings = ["simcse", *(s for s in settings if s != "simcse")]
        settings.sort(key=lambda s: s in SPARSE)
    for seed in [] if args.transfer_only else args.seeds:  # interleaved, so a partial table already pairs seeds
        for setting in settings:
            if (setting, seed) in done:
                continue
            rec = run_one(out, setting, seed, args)
            _append(out, rec)
            print(json.dumps({k: rec.get(k) for k in ("setting", "seed", "returncode", "wall_seconds")}), flush=True)
    print(f"load average after: {os.getloadavg()}")
    with open(out / "loadavg.jsonl", "a") as f:
        f.write(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "event": "end",
                            "loadavg": os.getloadavg()}) + "\n")  # fmt: skip
    print(report(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
