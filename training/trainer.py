"""The trainer: SimCSE (+ 3R, + any registered objective) fine-tuning, evaluation and export.

:class:`Trainer` wires the parts together and runs the loop; each job has its module:

* data and batches: :class:`training.data.train_data.TrainingData`; the 3R pool:
  :func:`training.data.redundant_pool.redundant_pool`;
* the optimiser and schedule: :mod:`training.optim`;
* one step (3R, the weighted objectives, gradient caching): :class:`training.train_step.StepRunner`;
* resumable state: :class:`training.checkpoint.Checkpointer`;
* ``metrics.jsonl`` and ``metrics.png``: :class:`training.reporting.MetricsLog`;
* the exported artifact: :func:`training.publishing.publish_best`;
* with ``wise_ft`` (retrieval mode): WiSE-FT of the chosen checkpoint with the starting model
  (:func:`training.interpolate.choose`), whose chosen mix is reported and exported.

Outputs in ``output_dir``: ``metrics.jsonl``, ``metrics.png``, ``best/`` (sentence-transformers
format), ``checkpoint/`` (resumable state), ``redundant_pool.txt`` / ``top_words.txt`` (3R),
``results.json``, ``wise_ft/`` + ``wise_ft.json`` (WiSE-FT's chosen mix and its grid); and the exported ONNX
artifact in ``models_dir/<name>/<version>/``.
"""

from __future__ import annotations

import json
import logging
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from training.checkpoint import Checkpointer
from training.config import TrainSettings
from training.data.redundant_pool import redundant_pool
from training.data.sts import TEST_TASKS
from training.data.train_data import TrainingData
from training.encoder import SentenceEncoder
from training.evaluation import alignment_uniformity, evaluate_sts, format_table, torch_encode_fn
from training.objectives import ObjectiveContext, build_objective
from training.optim import build_optimizer, linear_warmup
from training.publishing import publish_best
from training.reporting import MetricsLog
from training.three_r import ThreeR
from training.train_step import StepRunner

#: ThreeRConfig fields passed to :class:`training.three_r.ThreeR` as they are
_THREE_R_ARGS = {"k", "c_init", "learn_c", "surrogate_temperature", "c_estimator", "variant", "refresh_every"}


log = logging.getLogger("training.trainer")


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
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        self.encoder = SentenceEncoder(cfg.model_name_or_path, cfg.pooling, cfg.mlp_head, cfg.max_seq_length)
        if cfg.dropout is not None:
            self.encoder.set_dropout(cfg.dropout)
        keep = cfg.head_at_inference if cfg.head_at_inference is not None else cfg.data.mode == "sup"
        if keep and self.encoder.head is None:
            raise ValueError("head_at_inference needs an MLP head (mlp_head: true or pooling: cls)")
        #: SimCSE: supervised models keep the MLP at test time, unsupervised ones drop it (cls_before_pooler)
        self.encoder.inference_head = bool(keep)
        self.encoder.to(self.device)
        d = cfg.data
        #: the retrieval task (``data.mode: retrieval``): triplets, dev split, the report; None otherwise
        self.retrieval = None
        if d.mode == "retrieval":
            from training.retrieval import RetrievalTask

            self.retrieval = RetrievalTask.build(
                d.train_file,
                dev_fraction=d.dev_fraction,
                split_seed=d.split_seed,
                hard_negatives=d.hard_negatives,
                negatives_depth=d.negatives_depth,
                model_dir=self.encoder.source,
                max_seq_length=cfg.max_seq_length,
                max_queries=d.max_queries,
                max_corpus=d.max_corpus,
            )
        examples = self.retrieval.triplets if self.retrieval else None
        self.data = TrainingData(d.mode, d.train_file, d.max_train_samples, cfg.batch_size, cfg.seed, examples)
        #: the dev metric: model choice and ``best_score``
        self.dev_metric = f"{self.retrieval.name}-dev-ndcg@10" if self.retrieval else "STSBenchmark-dev"
        self.total_steps = cfg.max_steps or max(1, int(cfg.num_epochs * self.data.steps_per_epoch))

        tok = self.encoder.tokenizer
        ctx = ObjectiveContext(
            self.encoder.hidden_size,
            self.encoder.num_layers,
            len(tok),
            tok.pad_token_id or 0,
            self.encoder,
            d.mode in ("sup", "retrieval"),
        )
        self.objectives = nn.ModuleDict({n: build_objective(t.type, ctx, t.params) for n, t in cfg.losses.items()})
        if not self.objectives:
            raise ValueError("no loss term configured")
        self.objectives.to(self.device)

        three_r = None
        if cfg.three_r.enabled:
            count = lambda s: len(tok.tokenize(s)) + 2  # noqa: E731  ([CLS] ... [SEP])
            pool, top = redundant_pool(
                cfg.three_r, self.data.sentences(), self.out, count, seed=cfg.seed, resume=cfg.resume
            )
            args = cfg.three_r.model_dump(include=_THREE_R_ARGS)
            three_r = ThreeR(pool, top, seed=cfg.seed, **args).to(self.device)

        learn_c = three_r is not None and three_r.c.requires_grad
        c_group = [{"params": [three_r.c], "weight_decay": 0.0, "lr": cfg.three_r.c_lr}] if learn_c else []
        self.optimizer = build_optimizer(
            [*self.encoder.named_parameters(), *((f"obj.{n}", p) for n, p in self.objectives.named_parameters())],
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            extra_groups=c_group,
        )
        self.warmup = cfg.warmup_steps if cfg.warmup_steps is not None else int(cfg.warmup_ratio * self.total_steps)
        self.scheduler = linear_warmup(self.optimizer, self.warmup, self.total_steps)
        weights = {name: term.weight for name, term in cfg.losses.items()}
        self.stepper = StepRunner(
            self.encoder,
            self.objectives,
            weights,
            three_r,
            self.optimizer,
            self.scheduler,
            device=self.device,
            bf16=cfg.bf16,
            cpu_bf16=cfg.cpu_bf16,
            max_grad_norm=cfg.max_grad_norm,
        )
        parts = {"encoder": self.encoder, "objectives": self.objectives, "three_r": three_r}
        parts.update(optimizer=self.optimizer, scheduler=self.scheduler)
        self.checkpointer = Checkpointer(self.out, self.device, parts)
        self.metrics = MetricsLog(self.out)
        self.step = 0
        self.best_score = -math.inf
        self.best_step = -1

    @property
    def three_r(self) -> ThreeR | None:
        """The 3R module (None: 3R off)."""
        return self.stepper.three_r

    # ------------------------------------------------------------------ steps, evaluation, checkpoints
    def train_step(self, step: int) -> dict[str, float]:
        """Forward, backward (gradient-cached when ``grad_cache_chunk`` asks) and optimiser step on batch ``step``."""
        views = self.data.views(self.data.batch(step))
        return self.stepper.step(views, step, self.cfg.grad_cache_chunk)

    def encode_fn(self, max_seq_length: int | None = None):
        """Sentences → ``(N, D)`` numpy with the current encoder (eval mode; the MLP head only when it is kept at
        test time, :attr:`SentenceEncoder.inference_head`)."""
        L = max_seq_length or self.cfg.eval_max_seq_length

        def enc(sents):
            with self.stepper.autocast():
                return self.encoder.encode(sents, self.cfg.eval_batch_size, L)

        return enc

    def evaluate_dev(self) -> float:
        """STS-B dev Spearman ×100 with the current weights (retrieval mode: the dev queries' nDCG@10 ×100)."""
        if self.retrieval is not None:
            return self.retrieval.dev(self.encode_fn(self.cfg.max_seq_length))
        return evaluate_sts(self.encode_fn(), ["STSBenchmark-dev"], limit=self.cfg.eval_limit)["STSBenchmark-dev"]

    def save_checkpoint(self) -> None:
        """Resumable state: weights (+ head, objectives, c), optimiser, scheduler, step, best, timings, RNG."""
        counters = {"best_score": self.best_score, "best_step": self.best_step}
        counters.update(train_seconds=self.stepper.train_seconds, three_r_seconds=self.stepper.three_r_seconds)
        self.checkpointer.save(self.step, counters)

    def load_checkpoint(self) -> bool:
        """Restore from ``output_dir/checkpoint`` if present (and drop the metric lines written after it, which
        will be redone); returns whether it did."""
        state = self.checkpointer.load()
        if state is None:
            return False
        self.step = state["step"]
        self.best_score, self.best_step = state["best_score"], state["best_step"]
        self.stepper.train_seconds = state.get("train_seconds", 0.0)
        self.stepper.three_r_seconds = state.get("three_r_seconds", 0.0)
        self.metrics.rewind(self.step)
        return True

    def _eval_and_keep_best(self) -> float:
        score = self.evaluate_dev()
        rec = {"kind": "eval", "step": self.step, self.dev_metric: score}
        if self.three_r is not None:
            rec["c"] = float(self.three_r.c.detach())
        if score > self.best_score:
            self.best_score, self.best_step = score, self.step
            self.encoder.save_sentence_transformer(self.out / "best", with_head=self.encoder.inference_head)
            rec["best"] = True
        self.metrics.write(rec)
        self.metrics.plot()
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
                self.metrics.write({"kind": "train", "step": self.step, **logs})
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
        secs = self.stepper.train_seconds
        results: dict[str, Any] = {
            "best_step": self.best_step,
            "steps": self.step,
            "resumed": resumed,
            self.dev_metric: self.best_score,
            "train_seconds": secs,
            "steps_per_second": self.step / secs if secs else None,
            "three_r_seconds": self.stepper.three_r_seconds,
            "c_final": float(self.three_r.c.detach()) if self.three_r is not None else None,
        }
        scores: dict[str, float] = {self.dev_metric: self.best_score}
        if cfg.wise_ft and self.retrieval is not None:
            best_dir, results["wise_ft"] = self._wise_ft(best_dir)
            # the scores describe what is reported and published (the chosen mix); the fine-tuned checkpoint's own
            # dev score stays in the grid's alpha-1 row (results["wise_ft"]["rows"])
            scores[self.dev_metric] = results[self.dev_metric] = results["wise_ft"]["dev"]
        if cfg.final_eval and self.retrieval is not None:  # the report: the chosen checkpoint, once
            enc = torch_encode_fn(str(best_dir), cfg.max_seq_length, cfg.eval_batch_size, device=self.device)
            scores.update(self.retrieval.report(enc, cfg.data.eval_split))
            print(json.dumps({k: round(v, 2) for k, v in scores.items()}))
        if cfg.final_eval and cfg.final_eval_tasks != []:
            enc = torch_encode_fn(str(best_dir), cfg.eval_max_seq_length, cfg.eval_batch_size)
            scores.update(evaluate_sts(enc, cfg.final_eval_tasks or list(TEST_TASKS), limit=cfg.eval_limit))
            results.update(alignment_uniformity(enc, limit=cfg.eval_limit))
            print(format_table(scores, {k: results[k] for k in ("alignment", "uniformity")}))
        if cfg.eval_limit:  # partial evaluations are labelled, never passed off as full-task scores
            scores = {f"{k}@{cfg.eval_limit}": v for k, v in scores.items()}
        results["scores"] = scores
        (self.out / "results.json").write_text(json.dumps(results, indent=2))
        self.metrics.plot()
        if cfg.export:
            art = publish_best(cfg, best_dir, results, scores, self.encoder.inference_head)
            results["artifact"] = str(art)
            (self.out / "results.json").write_text(json.dumps(results, indent=2))
        return results

    def _wise_ft(self, best_dir: Path) -> tuple[Path, dict[str, Any]]:
        """WiSE-FT of the chosen checkpoint with the starting model (``training.interpolate.choose``, Wortsman et
        al., CVPR 2022, arXiv:2109.01903): each ``wise_ft`` alpha scored on this run's dev queries and STS-B dev, the
        chosen mix written to ``output_dir/wise_ft/`` (the grid's rows in ``wise_ft.json``, resumed from); returns
        that folder and ``{"alpha", "dev", "rule", "rows"}`` (``dev``: the chosen mix's dev nDCG@10)."""
        from training.interpolate import choose, interpolate_dirs

        cfg, r = self.cfg, self.retrieval
        got = choose(
            self.encoder.source,
            best_dir,
            cfg.wise_ft,
            dev_fraction=cfg.data.dev_fraction,
            split_seed=cfg.data.split_seed,
            sts_tolerance=cfg.wise_ft_sts_tolerance,
            max_seq_length=cfg.max_seq_length,
            max_queries=cfg.data.max_queries,
            max_corpus=cfg.data.max_corpus,
            sts_limit=cfg.eval_limit,
            record=self.out / "wise_ft.json",
            directory=r.directory,
        )
        out = self.out / "wise_ft"
        interpolate_dirs(self.encoder.source, best_dir, got["alpha"], out)
        dev = next(row["scifact-dev-ndcg@10"] for row in got["rows"] if row["alpha"] == got["alpha"])
        log.info("WiSE-FT: alpha %g chosen (%s), dev nDCG@10 %.2f", got["alpha"], got["rule"], dev)
        return out, {"alpha": got["alpha"], "dev": dev, "rule": got["rule"], "rows": got["rows"]}


def train(cfg: TrainSettings) -> dict[str, Any]:
    """Build a :class:`Trainer` and run it."""
    return Trainer(cfg).run()


__all__ = ["Trainer", "train"]
