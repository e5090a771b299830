"""The trainer: SimCSE (+ 3R, + any registered objective) fine-tuning, evaluation and export.

One optimisation step on a batch of N sentences (unsupervised) or N triplets (supervised):

1. Encode the views (``anchor``/``positive`` = two dropout passes of the same sentences, or
   premise/entailment/contradiction) → h ``(N, D)`` each (pooling + train-only head).
2. 3R (if enabled, ``training/three_r.py``): h̄ from k pool sentences, σ over the batch, mask
   with the learnable c, ĥ = transform(h) for every view (the 3R paper Eqs. 3–5).
3. Loss = Σ_terms weight × objective(batch) (``training/objectives``; SimCSE = InfoNCE, Eqs. 1/2/4).
4. AdamW step, linear schedule with warmup.

Gradient caching (``grad_cache_chunk`` > 0 and < batch): embeddings are first computed chunk by
chunk without gradient, the loss is computed on the full batch of detached leaf copies and
back-propagated to them, then each chunk is re-encoded with the same dropout RNG state and its
cached gradient back-propagated (Gao et al., 2021, GradCache). The result is the gradient of the
full-batch InfoNCE (all N−1 in-batch negatives), at the memory of one chunk.

Outputs in ``output_dir``: ``metrics.jsonl``, ``metrics.png``, ``best/`` (sentence-transformers
format), ``checkpoint/`` (resumable state), ``redundant_pool.txt`` / ``top_words.txt`` (3R),
``results.json``; and the exported ONNX artifact in ``models_dir/<name>/<version>/``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.config import TrainSettings
from training.data.sts import TEST_TASKS
from training.data.train_data import load_sentences, load_triplets
from training.encoder import EncoderOutput, SentenceEncoder, default_model_path
from training.evaluation import alignment_uniformity, evaluate_sts, format_table
from training.objectives import ObjectiveBatch, ObjectiveContext, build_objective
from training.three_r import ThreeR, mine_redundant_pool, read_lines

DEFAULT_BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _rng_state(device: torch.device) -> dict[str, Any]:
    st = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def _set_rng_state(st: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    if "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


class Trainer:
    """Runs one training job described by :class:`training.config.TrainSettings`.

    Raises (from :meth:`__init__`/:meth:`run`):
        ValueError: batch larger than the data, unknown objective, objective needing hard
            negatives on unsupervised data, bad 3R settings.
        FileNotFoundError: training data or pool file missing.
    """

    def __init__(self, cfg: TrainSettings):
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.use_bf16 = cfg.bf16 and self.device.type == "cuda"
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        self.encoder = SentenceEncoder(cfg.model_name_or_path, cfg.pooling, cfg.mlp_head, cfg.max_seq_length)
        keep = cfg.head_at_inference if cfg.head_at_inference is not None else cfg.data.mode == "sup"
        if keep and self.encoder.head is None:
            raise ValueError("head_at_inference needs an MLP head (mlp_head: true or pooling: cls)")
        #: SimCSE: supervised models keep the MLP at test time, unsupervised ones drop it (cls_before_pooler)
        self.encoder.inference_head = bool(keep)
        self.encoder.to(self.device)
        self.supervised = cfg.data.mode == "sup"
        if self.supervised:
            self.data: list = load_triplets(cfg.data.train_file)
            if cfg.data.max_train_samples:
                self.data = self.data[: cfg.data.max_train_samples]
        elif cfg.data.mode == "pairs":  # (anchor, positive) from a user file
            from training.objectives.msse import read_pairs

            self.data = list(zip(*read_pairs(cfg.data.train_file)))[: cfg.data.max_train_samples or None]
        else:
            self.data = load_sentences(cfg.data.train_file, cfg.data.max_train_samples)
        self.steps_per_epoch = len(self.data) // cfg.batch_size
        if self.steps_per_epoch < 1:
            raise ValueError(f"batch_size {cfg.batch_size} is larger than the data ({len(self.data)} examples)")
        self.total_steps = cfg.max_steps or max(1, int(cfg.num_epochs * self.steps_per_epoch))

        tok = self.encoder.tokenizer
        ctx = ObjectiveContext(
            self.encoder.hidden_size,
            self.encoder.num_layers,
            len(tok),
            tok.pad_token_id or 0,
            self.encoder,
            self.supervised,
        )
        self.objectives = nn.ModuleDict()
        self.weights: dict[str, float] = {}
        for name, term in cfg.losses.items():
            self.objectives[name] = build_objective(term.type, ctx, term.params)
            self.weights[name] = term.weight
        if not self.objectives:
            raise ValueError("no loss term configured")
        self.objectives.to(self.device)
        self.layers = sorted({l for o in self.objectives.values() for l in o.extra_layers})
        self.need_tokens = any(o.needs_token_states for o in self.objectives.values())

        self.three_r: ThreeR | None = None
        if cfg.three_r.enabled:
            pool, top = self._redundant_pool()
            t = cfg.three_r
            self.three_r = ThreeR(
                pool,
                top,
                k=t.k,
                c_init=t.c_init,
                learn_c=t.learn_c,
                surrogate_temperature=t.surrogate_temperature,
                c_estimator=t.c_estimator,
                variant=t.variant,
                refresh_every=t.refresh_every,
                seed=cfg.seed,
            ).to(self.device)

        no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
        named = [(n, p) for n, p in self.encoder.named_parameters() if p.requires_grad]
        named += [(f"obj.{n}", p) for n, p in self.objectives.named_parameters() if p.requires_grad]
        groups = [
            {"params": [p for n, p in named if not any(k in n for k in no_decay)], "weight_decay": cfg.weight_decay},
            {"params": [p for n, p in named if any(k in n for k in no_decay)], "weight_decay": 0.0},
        ]
        if self.three_r is not None and self.three_r.c.requires_grad:
            groups.append({"params": [self.three_r.c], "weight_decay": 0.0, "lr": cfg.three_r.c_lr})
        groups = [g for g in groups if g["params"]]
        self.optimizer = torch.optim.AdamW(groups, lr=cfg.lr)
        warm = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * self.total_steps)
        total = self.total_steps

        def lr_lambda(step: int) -> float:
            if step < warm:
                return (step + 1) / max(1, warm)
            return max(0.0, (total - step) / max(1, total - warm))

        self.warmup = warm
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda)
        self.step = 0
        self.best_score = -math.inf
        self.best_step = -1
        self.train_seconds = 0.0
        self.three_r_seconds = 0.0

    # ------------------------------------------------------------------ setup helpers
    def _redundant_pool(self) -> tuple[list[str], list[str]]:
        """Pool + top words: saved copy in output_dir (resume) > user pool file > mined from the corpus."""
        t = self.cfg.three_r
        pool_path, top_path = self.out / "redundant_pool.txt", self.out / "top_words.txt"
        if pool_path.is_file() and top_path.is_file() and self.cfg.resume:
            return read_lines(pool_path), read_lines(top_path)
        if self.supervised or self.cfg.data.mode == "pairs":
            corpus = [s for tr in self.data for s in tr]
        else:
            corpus = list(self.data)
        if t.pool_mine_max_sentences:
            corpus = corpus[: t.pool_mine_max_sentences]
        tokenizer = self.encoder.tokenizer
        count = lambda s: len(tokenizer.tokenize(s)) + 2  # noqa: E731  ([CLS] ... [SEP])
        if t.pool_file:
            pool = read_lines(t.pool_file)
            from training.three_r import top_words

            top = top_words(corpus, t.n_top_words)
            stats = {"source": f"user file {t.pool_file}"}
        else:
            pool, top, stats = mine_redundant_pool(
                corpus, t.n_top_words, t.pool_size, t.pool_max_tokens, t.pool_min_top_fraction, 2, self.cfg.seed, count
            )
            stats["source"] = "mined from the training corpus"
        pool_path.write_text("\n".join(pool) + "\n", encoding="utf-8")
        top_path.write_text("\n".join(top) + "\n", encoding="utf-8")
        (self.out / "pool_stats.json").write_text(json.dumps(stats, indent=2))
        return pool, top

    def _autocast(self):
        if self.use_bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def batch_at(self, step: int) -> list:
        """The examples of ``step``: a seeded permutation per epoch, drop-last (deterministic, resumable)."""
        B = self.cfg.batch_size
        epoch, pos = divmod(step, self.steps_per_epoch)
        perm = np.random.default_rng([self.cfg.seed, epoch]).permutation(len(self.data))
        return [self.data[i] for i in perm[pos * B : (pos + 1) * B]]

    # ------------------------------------------------------------------ one step
    def _views(self, items: list) -> dict[str, list[str]]:
        if self.supervised:
            return {
                "anchor": [t[0] for t in items],
                "positive": [t[1] for t in items],
                "hard_negative": [t[2] for t in items],
            }
        if self.cfg.data.mode == "pairs":
            return {"anchor": [t[0] for t in items], "positive": [t[1] for t in items]}
        return {"anchor": list(items), "positive": list(items)}

    def _encode(self, tok: dict[str, torch.Tensor], sl: slice) -> EncoderOutput:
        with self._autocast():
            return self.encoder(
                **{k: v[sl] for k, v in tok.items()}, layers=self.layers, return_token_states=self.need_tokens
            )

    def compute_loss(
        self, outs: dict[str, EncoderOutput], toks: dict[str, dict[str, torch.Tensor]], step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """3R transform + weighted sum of the objectives on already-encoded views.

        Returns the scalar loss and the log dict (``loss/<name>``, 3R statistics).
        """
        raw = {v: o.embedding for v, o in outs.items()}
        logs: dict[str, float] = {}
        transform = lambda x: x  # noqa: E731
        if self.three_r is not None:
            with self._autocast():
                st = self.three_r.prepare(self.encoder, raw["anchor"], step)
            transform = st.transform
            self.three_r_seconds += self.three_r.last_seconds
            logs["c"] = float(self.three_r.c.detach())
            if st.mask is not None:
                logs["n_redundant_dims"] = int(st.mask.detach().sum())
            if st.sigma is not None:
                logs["sigma_mean"] = float(st.sigma.mean())
                # where c sits in sigma's distribution: its quantiles over the D dimensions
                q = torch.quantile(st.sigma.detach().float().cpu(), torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0]))
                logs.update({f"sigma_q{int(100 * p)}": float(v) for p, v in zip((0.0, 0.1, 0.5, 0.9, 1.0), q)})
            logs["time/three_r"] = self.three_r.last_seconds
        views = {v: transform(h) for v, h in raw.items()}
        batch = ObjectiveBatch(
            anchor=views["anchor"],
            positive=views["positive"],
            hard_negative=views.get("hard_negative"),
            raw=raw,
            layers={v: o.layers for v, o in outs.items()},
            token_states={v: o.token_states for v, o in outs.items() if o.token_states is not None},
            input_ids={v: t["input_ids"] for v, t in toks.items()},
            attention_mask={v: t["attention_mask"] for v, t in toks.items()},
            transform=transform,
            encoder=self.encoder,
            step=step,
        )
        total = torch.zeros((), device=self.device)
        for name, obj in self.objectives.items():
            out = obj(batch)
            if isinstance(out, dict):
                term = sum(out.values())
                for k, v in out.items():
                    logs[f"loss/{name}/{k}"] = float(v.detach())
            else:
                term = out
            logs[f"loss/{name}"] = float(term.detach())
            total = total + self.weights[name] * term
        logs["loss"] = float(total.detach())
        return total, logs

    def train_step(self, step: int) -> dict[str, float]:
        """Forward, backward (optionally gradient-cached) and optimiser step for ``step``."""
        t0 = time.perf_counter()
        self.encoder.train()
        self.objectives.train()
        views = self._views(self.batch_at(step))
        toks = {v: self.encoder.tokenize(t) for v, t in views.items()}
        N = self.cfg.batch_size
        chunk = self.cfg.grad_cache_chunk
        self.optimizer.zero_grad(set_to_none=True)
        if chunk <= 0 or chunk >= N:
            outs = {v: self._encode(t, slice(None)) for v, t in toks.items()}
            loss, logs = self.compute_loss(outs, toks, step)
            loss.backward()
        else:
            slices = [slice(i, min(i + chunk, N)) for i in range(0, N, chunk)]
            states: dict[tuple[str, int], dict] = {}
            parts: dict[str, list[dict[str, torch.Tensor]]] = {v: [] for v in toks}
            with torch.no_grad():
                for v, t in toks.items():
                    for ci, sl in enumerate(slices):
                        states[(v, ci)] = _rng_state(self.device)
                        parts[v].append(self._encode(t, sl).tensors())
            after = _rng_state(self.device)
            leaves = {
                v: {k: torch.cat([p[k] for p in ps]).detach().requires_grad_(True) for k in ps[0]}
                for v, ps in parts.items()
            }
            outs = {v: EncoderOutput.from_tensors(lv) for v, lv in leaves.items()}
            loss, logs = self.compute_loss(outs, toks, step)
            loss.backward()
            for v, t in toks.items():
                for ci, sl in enumerate(slices):
                    grads = {k: lf.grad[sl] for k, lf in leaves[v].items() if lf.grad is not None}
                    if not grads:
                        continue
                    _set_rng_state(states[(v, ci)], self.device)
                    o = self._encode(t, sl).tensors()
                    surrogate = sum((o[k] * g).sum() for k, g in grads.items())
                    surrogate.backward()
            _set_rng_state(after, self.device)
        if self.cfg.max_grad_norm:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            logs["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm))
        logs["lr"] = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        dt = time.perf_counter() - t0
        logs["time/step"] = dt
        self.train_seconds += dt
        return logs

    # ------------------------------------------------------------------ eval / io
    def encode_fn(self, max_seq_length: int | None = None):
        """Sentences → ``(N, D)`` numpy with the current encoder (eval mode; the MLP head only when it is kept at
        test time, :attr:`SentenceEncoder.inference_head`)."""
        L = max_seq_length or self.cfg.eval_max_seq_length

        def enc(sents):
            with self._autocast():
                return self.encoder.encode(sents, self.cfg.eval_batch_size, L)

        return enc

    def evaluate_dev(self) -> float:
        """STS-B dev Spearman ×100 with the current weights."""
        return evaluate_sts(self.encode_fn(), ["STSBenchmark-dev"], limit=self.cfg.eval_limit)["STSBenchmark-dev"]

    def _log(self, rec: dict[str, Any]) -> None:
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")

    def _ckpt_dir(self) -> Path:
        return self.out / "checkpoint"

    def save_checkpoint(self) -> None:
        """Resumable state: weights (+ head, objectives, c), optimiser, scheduler, step, best, RNG."""
        d = self._ckpt_dir()
        tmp = self.out / "checkpoint.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {
            "step": self.step,
            "encoder": self.encoder.state_dict(),
            "objectives": self.objectives.state_dict(),
            "three_r": self.three_r.state_dict() if self.three_r is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "best_score": self.best_score,
            "best_step": self.best_step,
            "train_seconds": self.train_seconds,
            "three_r_seconds": self.three_r_seconds,
            "rng": {
                "torch": torch.get_rng_state(),
                "numpy": np.random.get_state(),
                "python": random.getstate(),
                **({"cuda": torch.cuda.get_rng_state_all()} if self.device.type == "cuda" else {}),
            },
        }
        torch.save(state, tmp / "state.pt")
        shutil.rmtree(d, ignore_errors=True)
        os.replace(tmp, d)

    def load_checkpoint(self) -> bool:
        """Restore from ``output_dir/checkpoint`` if present; returns whether it did."""
        f = self._ckpt_dir() / "state.pt"
        if not f.is_file():
            return False
        state = torch.load(f, map_location=self.device, weights_only=False)
        self.encoder.load_state_dict(state["encoder"])
        self.objectives.load_state_dict(state["objectives"])
        if self.three_r is not None and state["three_r"] is not None:
            self.three_r.load_state_dict(state["three_r"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = state["step"]
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.train_seconds = state.get("train_seconds", 0.0)
        self.three_r_seconds = state.get("three_r_seconds", 0.0)
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(rng["cuda"])
        # drop metric lines written after the checkpoint (they will be re-done)
        mf = self.out / "metrics.jsonl"
        if mf.is_file():
            keep = []
            for line in mf.read_text().splitlines():
                if not line.strip():
                    continue
                r = json.loads(line)
                if r.get("step", 0) < self.step or (r.get("kind") == "eval" and r.get("step", 0) == self.step):
                    keep.append(line)
            mf.write_text("".join(k + "\n" for k in keep))
        return True

    def plot(self) -> Path | None:
        """``metrics.png``: training loss and STS-B dev Spearman over steps."""
        mf = self.out / "metrics.jsonl"
        if not mf.is_file():
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        recs = [json.loads(l) for l in mf.read_text().splitlines() if l.strip()]
        tr = [r for r in recs if r.get("kind") == "train"]
        ev = [r for r in recs if r.get("kind") == "eval"]
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        ax[0].plot([r["step"] for r in tr], [r["loss"] for r in tr])
        ax[0].set_xlabel("step")
        ax[0].set_ylabel("training loss")
        ax[0].set_yscale("log" if tr and min(r["loss"] for r in tr) > 0 else "linear")
        ax[1].plot([r["step"] for r in ev], [r["STSBenchmark-dev"] for r in ev], marker="o")
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("STS-B dev Spearman x100")
        fig.tight_layout()
        path = self.out / "metrics.png"
        fig.savefig(path, dpi=80)
        plt.close(fig)
        return path

    def _eval_and_keep_best(self) -> float:
        score = self.evaluate_dev()
        rec = {"kind": "eval", "step": self.step, "STSBenchmark-dev": score}
        if self.three_r is not None:
            rec["c"] = float(self.three_r.c.detach())
        if score > self.best_score:
            self.best_score, self.best_step = score, self.step
            self.encoder.save_sentence_transformer(self.out / "best", with_head=self.encoder.inference_head)
            rec["best"] = True
        self._log(rec)
        self.plot()
        return score

    # ------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        """Train (resuming if a checkpoint exists), evaluate, export. Returns the results dict
        (also written to ``output_dir/results.json``)."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        resumed = cfg.resume and self.load_checkpoint()
        (self.out / "config.json").write_text(json.dumps(cfg.recipe(), indent=2))
        bar = tqdm(total=self.total_steps, initial=self.step, disable=not cfg.progress, desc="train")
        while self.step < self.total_steps:
            logs = self.train_step(self.step)
            if self.step % cfg.log_every == 0 or self.step == self.total_steps - 1:
                self._log({"kind": "train", "step": self.step, **logs})
            bar.set_postfix(loss=f"{logs['loss']:.3g}", **({"c": f"{logs['c']:.3f}"} if "c" in logs else {}))
            bar.update(1)
            self.step += 1
            if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < self.total_steps:
                self._eval_and_keep_best()
            if cfg.save_every and self.step % cfg.save_every == 0 and self.step < self.total_steps:
                self.save_checkpoint()
        bar.close()
        if self.best_step != self.step:
            self._eval_and_keep_best()
        self.save_checkpoint()
        return self.finish(resumed)

    def finish(self, resumed: bool = False) -> dict[str, Any]:
        """Final evaluation of the best checkpoint (STS suite, alignment/uniformity), results, export."""
        cfg = self.cfg
        best_dir = self.out / "best"
        results: dict[str, Any] = {
            "best_step": self.best_step,
            "steps": self.step,
            "resumed": resumed,
            "STSBenchmark-dev": self.best_score,
            "train_seconds": self.train_seconds,
            "steps_per_second": self.step / self.train_seconds if self.train_seconds else None,
            "three_r_seconds": self.three_r_seconds,
            "c_final": float(self.three_r.c.detach()) if self.three_r is not None else None,
        }
        scores: dict[str, float] = {"STSBenchmark-dev": self.best_score}
        if cfg.final_eval:
            from training.evaluation import torch_encode_fn

            enc = torch_encode_fn(str(best_dir), cfg.eval_max_seq_length, cfg.eval_batch_size)
            tasks = cfg.final_eval_tasks or list(TEST_TASKS)
            scores.update(evaluate_sts(enc, tasks, limit=cfg.eval_limit))
            results.update(alignment_uniformity(enc, limit=cfg.eval_limit))
            print(format_table(scores, {k: results[k] for k in ("alignment", "uniformity")}))
        if cfg.eval_limit:  # partial evaluations are labelled, never passed off as full-task scores
            scores = {f"{k}@{cfg.eval_limit}": v for k, v in scores.items()}
        results["scores"] = scores
        (self.out / "results.json").write_text(json.dumps(results, indent=2))
        self.plot()
        if cfg.export:
            from training.export import export_artifact

            recipe = cfg.recipe()
            recipe.update(
                {k: results[k] for k in ("best_step", "steps", "c_final", "alignment", "uniformity") if k in results}
            )
            recipe["initialised_from"] = (
                "sentence-tuned all-MiniLM-L6-v2 (no raw BERT weights here)"
                if not cfg.model_name_or_path
                else cfg.model_name_or_path
            )
            recipe["inference"] = (
                "fine-tuned encoder + pooling + the MLP head (kept at test time, supervised SimCSE); 3R is training-only"
                if self.encoder.inference_head
                else "plain fine-tuned encoder + pooling; 3R and the MLP head are training-only"
            )
            art_dir = Path(cfg.models_dir) / cfg.artifact_name / cfg.artifact_version
            export_artifact(
                str(best_dir),
                str(art_dir),
                name=cfg.artifact_name,
                version=cfg.artifact_version,
                base_model=DEFAULT_BASE_MODEL if not cfg.model_name_or_path else cfg.model_name_or_path,
                training=recipe,
                scores={k: round(float(v), 4) for k, v in scores.items()},
                evaluate=cfg.export_evaluate,
            )
            results["artifact"] = str(art_dir)
            (self.out / "results.json").write_text(json.dumps(results, indent=2))
        return results


def train(cfg: TrainSettings) -> dict[str, Any]:
    """Build a :class:`Trainer` and run it."""
    return Trainer(cfg).run()


__all__ = ["Trainer", "train", "default_model_path"]
