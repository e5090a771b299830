"""Cross-encoder (reranker) training on SciFact with sentence-transformers' ``CrossEncoderTrainer``.

``python -m training train-reranker`` (:mod:`training.cli.train_reranker`) calls :func:`train_reranker`:

1. data (:mod:`training.data.scifact`): SciFact's train qrels, split by query into train and dev
   (``dev_fraction``), hard negatives per query mined by BM25, the default bi-encoder or both (``negatives``;
   positives excluded);
2. model: ``CrossEncoder(model_dir, num_labels=1)`` from any local Hugging Face / sentence-transformers directory
   (default: the default encoder's weights, a fresh one-logit classification head on ``[CLS]``);
3. training: ``CrossEncoderTrainer`` (sentence-transformers' cross-encoder training API, "Training Overview" of its
   docs) with one of its losses (``loss``): ``bce`` — ``BinaryCrossEntropyLoss`` on (query, passage, label) rows,
   positives weighted by the negatives-per-positive ratio (``pos_weight``, as its docs advise for mined negatives;
   unweighted, a one-in-eight positive rate lets the model settle on the prior); ``mnrl`` —
   ``MultipleNegativesRankingLoss``, InfoNCE over (query, positive, mined negatives, in-batch negatives); ``lambda``
   — ``LambdaLoss`` (listwise, NDCGLoss2++ weighting) over each query's positives and mined negatives;
   ``margin_mse`` / ``listwise_kl`` — distillation from the first stage (``teacher``, e.g. DBSF, its fused scores of
   each train claim's ``candidates_per_query`` best candidates, cached), mixed with the labels by ``label_weight``
   (:mod:`training.rerank_distill`); the model
   choice is the test protocol on dev (:class:`training.rerank_protocol.DevEvaluator`): each dev claim's first stage
   (``dev_first_stage``, top ``dev_depth`` of the whole corpus, the bi-encoder ``dev_encoder`` for its dense part)
   reranked and scored by nDCG@10 against its judgements, every ``eval_steps``; the best checkpoint is kept
   (``load_best_model_at_end``). The chosen model's dev nDCG@10 over a grid of the fusion weight alpha
   (:func:`training.rerank_protocol.alpha_grid`) and the alpha it chooses are recorded beside it;
4. ``publish``: the chosen model is exported (:func:`training.export.reranker.export_reranker`) as the next version
   of ``artifact_name`` in the models directory, parity measured on dev pairs.

Resume and skip, as ``train`` does: a run writes checkpoints under ``<output_dir>/checkpoints`` and resumes from the
newest (``resume``) when they are of the same recipe (``checkpoints/recipe.json``; else it starts over); a finished run (``<output_dir>/model`` with ``done.json`` for the same recipe) is not trained
again, and an artifact already published from it is not exported again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from artifact_contract import ArtifactError, find_artifacts, validate_artifact
from artifact_contract.fsio import atomic_write_text

log = logging.getLogger("training.reranker")
DONE_FILE = "done.json"


@dataclasses.dataclass
class RerankerConfig:
    """Settings of one reranker run (each is a ``--flag`` of ``python -m training train-reranker``).

    ``model_dir`` None: the default encoder. ``dev_first_stage`` (dense, bm25, rrf, dbsf), ``dev_depth``,
    ``dev_encoder`` (None: the default encoder): the first stage the dev claims are reranked from (the one test
    reranks). ``max_queries``/``max_corpus`` None: all of SciFact's train queries and
    corpus (smaller: a smoke run). ``eval_steps`` 0: evaluate and save at the end only. ``quantize`` ``"int8"``:
    also publish ``<artifact_name>-int8``, the fp32 artifact dynamically quantised; ``dtype`` ``"fp16"``: also publish
    ``<artifact_name>-fp16``, its fp16 twin for GPU serving (:mod:`training.export.reranker_twins`). ``teacher``,
    ``teacher_encoder``, ``candidates_per_query``, ``label_weight``, ``teacher_temperature``: the distillation losses'
    settings (:mod:`training.rerank_distill`; not in the other losses' recipes). ``max_seconds``: end training at the
    first step past this wall time (:mod:`training.reranker_budget`; not in the recipe: a run it cut counts as
    finished, its ``done.json``'s ``steps`` says where it stopped). ``cpu_bf16``: bf16 autocast of the training steps
    on a CPU (``TrainingArguments(bf16=True)``; on CUDA bf16 is always on); in the recipe only when set.
    """

    output_dir: str = "runs/reranker"
    model_dir: str | None = None
    max_seq_length: int = 256
    max_steps: int = 200
    batch_size: int = 16
    lr: float = 2e-5
    warmup_ratio: float = 0.1
    negatives_per_query: int = 7
    negatives: str = "bm25"
    loss: str = "bce"
    dev_fraction: float = 0.1
    max_queries: int | None = None
    max_corpus: int | None = None
    eval_steps: int = 100
    seed: int = 42
    resume: bool = True
    artifact_name: str = "scifact-reranker"
    models_dir: str | None = None
    quantize: str | None = None
    dtype: str | None = None
    dev_first_stage: str = "dbsf"
    dev_depth: int = 100
    dev_encoder: str | None = None
    teacher: str = "dbsf"
    teacher_encoder: str | None = None
    candidates_per_query: int = 30
    label_weight: float = 0.5
    teacher_temperature: float | None = None
    max_seconds: float | None = None
    cpu_bf16: bool = False

    def recipe(self) -> dict[str, Any]:
        """What decides the trained weights (recorded in ``done.json`` and the manifest's ``training``)."""
        from training.rerank_distill import LOSSES, temperature

        skip = {"output_dir", "resume", "artifact_name", "models_dir", "quantize", "dtype", "max_seconds"}
        if not self.cpu_bf16:  # the recipes of runs before the flag existed stay as they were
            skip.add("cpu_bf16")
        if self.loss not in LOSSES:  # the distillation settings do not touch the other losses' weights
            skip |= {"teacher", "teacher_encoder", "candidates_per_query", "label_weight", "teacher_temperature"}
        objective = {"bce": "binary_cross_entropy", "mnrl": "multiple_negatives_ranking", "lambda": "lambda_loss"}
        out = {
            "objective": objective.get(self.loss, self.loss),
            **{k: v for k, v in dataclasses.asdict(self).items() if k not in skip},
        }
        if self.loss in LOSSES:
            out["teacher_temperature"] = temperature(self.loss, self.teacher_temperature)
        return out


def _data(cfg: RerankerConfig):
    from training.data.scifact import load_scifact, mine, split_queries
    from training.st_dir import default_model_dir

    data = load_scifact(cfg.max_queries, cfg.max_corpus, cfg.seed)
    train_q, dev_q = split_queries(list(data.qrels), cfg.dev_fraction, cfg.seed)
    negatives = mine(
        data, train_q + dev_q, cfg.negatives, cfg.negatives_per_query, default_model_dir(), cfg.max_seq_length
    )
    return data, train_q, dev_q, negatives


def loss_and_rows(cfg: RerankerConfig, model, data, train_q: list[str], negatives: dict[str, list[str]]):
    """The ``CrossEncoderTrainer`` loss of ``cfg.loss`` and its training columns (see the module docstring).

    Raises:
        ValueError: an unknown ``loss``.
    """
    import torch
    from sentence_transformers.cross_encoder import losses

    from training.data.scifact import pair_rows
    from training.rerank_distill import LOSSES
    from training.rerank_distill import loss_and_rows as distill

    if cfg.loss in LOSSES:
        return distill(cfg, model, data, train_q)
    train_q = [q for q in train_q if negatives.get(q)]
    if cfg.loss == "bce":
        rows = pair_rows(data, train_q, negatives)
        pos = sum(rows["label"])
        weight = torch.tensor((len(rows["label"]) - pos) / max(pos, 1.0))
        return losses.BinaryCrossEntropyLoss(model, pos_weight=weight), rows
    if cfg.loss == "mnrl":
        n = cfg.negatives_per_query
        rows = {"query": [], "positive": [], **{f"negative_{i + 1}": [] for i in range(n)}}
        for q in train_q:
            for did in sorted(data.qrels[q]):
                rows["query"].append(data.queries[q])
                rows["positive"].append(data.corpus[did])
                for i in range(n):  # fewer mined than n (a small corpus): cycle
                    rows[f"negative_{i + 1}"].append(data.corpus[negatives[q][i % len(negatives[q])]])
        return losses.MultipleNegativesRankingLoss(model, num_negatives=4), rows
    if cfg.loss == "lambda":
        rows = {"query": [], "docs": [], "labels": []}
        for q in train_q:
            pos = sorted(data.qrels[q])
            rows["query"].append(data.queries[q])
            rows["docs"].append([data.corpus[d] for d in pos + negatives[q]])
            rows["labels"].append([1.0] * len(pos) + [0.0] * len(negatives[q]))
        return losses.LambdaLoss(model), rows
    raise ValueError(f"loss must be bce, mnrl, lambda, margin_mse or listwise_kl, got {cfg.loss!r}")


def _fit(cfg: RerankerConfig, data, train_q, dev_q, negatives, final: Path) -> tuple[dict[str, float], int]:
    from datasets import Dataset
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    from training.st_dir import default_model_dir

    model = CrossEncoder(
        str(cfg.model_dir or default_model_dir()),
        num_labels=1,
        max_length=cfg.max_seq_length,
        device="cpu" if not _cuda() else None,
    )
    evaluator = dev_evaluator(cfg, data, dev_q)
    ckpt = Path(cfg.output_dir) / "checkpoints"
    every = min(cfg.eval_steps or cfg.max_steps, cfg.max_steps)
    args = CrossEncoderTrainingArguments(
        output_dir=str(ckpt),
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.batch_size,
        learning_rate=cfg.lr,
        warmup_steps=round(cfg.warmup_ratio * cfg.max_steps),
        seed=cfg.seed,
        eval_strategy="steps",
        eval_steps=every,
        save_strategy="steps",
        save_steps=every,
        save_total_limit=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_scifact-dev_ndcg@10",
        greater_is_better=True,
        logging_steps=max(1, every // 4),
        report_to="none",
        dataloader_num_workers=0,
        disable_tqdm=True,
        bf16=_cuda() or cfg.cpu_bf16,
        use_cpu=not _cuda(),  # bf16 on a CPU needs it said
    )
    loss, rows = loss_and_rows(cfg, model, data, train_q, negatives)
    trainer = CrossEncoderTrainer(
        model=model, args=args, train_dataset=Dataset.from_dict(rows), loss=loss, evaluator=evaluator
    )
    if cfg.max_seconds:
        from training.reranker_budget import WallClockBudget

        trainer.add_callback(WallClockBudget(cfg.max_seconds))
    mark = ckpt / "recipe.json"  # checkpoints of another recipe are not resumed from
    if ckpt.is_dir() and (not cfg.resume or not mark.is_file() or json.loads(mark.read_text()) != cfg.recipe()):
        log.info("%s: not this run's checkpoints (or --no-resume); starting over", ckpt)
        shutil.rmtree(ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    atomic_write_text(mark, json.dumps(cfg.recipe(), indent=2))
    last = get_last_checkpoint(str(ckpt))
    if last:
        log.info("resuming from %s", last)
    trainer.train(resume_from_checkpoint=last)
    scores = {k: float(v) for k, v in evaluator(model).items()}
    scores.update(dev_alphas(evaluator, model))
    model.save_pretrained(str(final))
    return scores, trainer.state.global_step


def dev_evaluator(cfg: RerankerConfig, data, dev_q: list[str]):
    """The model choice (:class:`training.rerank_protocol.DevEvaluator`): the dev claims' ``cfg.dev_first_stage``
    over the whole (loaded) corpus, top ``cfg.dev_depth``, judged by the train qrels."""
    from training.rerank_protocol import DevEvaluator, first_stage

    run = first_stage(data, dev_q, cfg.dev_first_stage, cfg.dev_depth, cfg.dev_encoder, cfg.max_seq_length)
    return DevEvaluator(data, run, {q: data.qrels[q] for q in dev_q})


def dev_alphas(evaluator, model) -> dict[str, float]:
    """The chosen model's dev nDCG@10 (in [0, 1]) fused with the first stage at each alpha of
    :data:`training.rerank_protocol.DEFAULT_ALPHAS` (``scifact-dev_ndcg@10_alpha=A``) and the best alpha
    (``scifact-dev_alpha``). Scores: the evaluator's latest call's when there is one (the caller has just run it on
    ``model``), else ``model``'s."""
    from training.rerank_protocol import DEFAULT_ALPHAS, alpha_grid, choose_alpha, score_run

    def scorer(pairs):
        return model.predict(pairs, batch_size=64, activation_fn=None, show_progress_bar=False)

    scores = evaluator.last_scores
    if scores is None:
        scores = score_run(evaluator.data, evaluator.run, scorer)
    grid = alpha_grid(evaluator.run, scores, evaluator.qrels, DEFAULT_ALPHAS)
    out = {f"{evaluator.name}_ndcg@10_alpha={a:g}": v / 100 for a, v in grid.items()}
    return {**out, f"{evaluator.name}_alpha": choose_alpha(grid)}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def train_reranker(cfg: RerankerConfig) -> dict[str, Any]:
    """Train (or skip a finished run), then export when ``cfg.models_dir`` is set. Returns ``{"model_dir", "dev",
    "skipped_training", "artifact", "skipped_export"}`` (``dev``: the evaluator's metrics of the chosen model).

    Raises:
        FileNotFoundError: SciFact is missing. training.export.ExportError: the export failed parity.
        ValueError: ``quantize`` is neither None nor ``"int8"``, ``dtype`` neither None nor ``"fp16"``; an unknown
            ``dev_first_stage`` or ``teacher``; a distillation setting out of range
            (:func:`training.rerank_distill.check`).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if cfg.quantize not in (None, "int8") or cfg.dtype not in (None, "fp16"):
        raise ValueError(f"quantize must be int8 or unset, dtype fp16 or unset; got {cfg.quantize!r}, {cfg.dtype!r}")
    for name in ("dev_first_stage", "teacher"):
        if getattr(cfg, name) not in ("dense", "bm25", "rrf", "dbsf"):
            raise ValueError(f"{name} must be dense, bm25, rrf or dbsf, got {getattr(cfg, name)!r}")
    from training.rerank_distill import LOSSES, check

    if cfg.loss in LOSSES:
        check(cfg)
    out = Path(cfg.output_dir)
    final = out / "model"
    recipe = cfg.recipe()
    data, train_q, dev_q, negatives = _data(cfg)
    done = json.loads((final / DONE_FILE).read_text()) if (final / DONE_FILE).is_file() else None
    skipped = bool(cfg.resume and done and done.get("recipe") == recipe)
    if skipped:
        log.info("%s holds a finished run of this recipe; not training again", final)
        dev = done["dev"]
    else:
        dev, steps = _fit(cfg, data, train_q, dev_q, negatives, final)
        split = {"train_queries": train_q, "dev_queries": dev_q}
        done = {"recipe": recipe, "dev": dev, "steps": steps, **split}
        atomic_write_text(final / DONE_FILE, json.dumps(done, indent=2))
    result = {
        "model_dir": str(final),
        "dev": dev,
        "skipped_training": skipped,
        "artifact": None,
        "skipped_export": False,
    }
    if cfg.models_dir:
        result.update(_publish(cfg, final, recipe, dev, data, dev_q, negatives))
    return result


def _published(models_dir: str, name: str, recipe: dict) -> Path | None:
    """The newest valid reranker artifact ``name`` in ``models_dir`` exported from a run of ``recipe``, or None."""
    for ref in reversed([r for r in find_artifacts(models_dir) if r.name == name]):
        try:
            m = validate_artifact(ref.path)
        except ArtifactError:
            continue
        if m.is_reranker and (m.training or {}).get("recipe") == recipe:
            return ref.path
    return None


def _publish(cfg: RerankerConfig, final: Path, recipe: dict, dev: dict, data, dev_q, negatives) -> dict[str, Any]:
    from training.publishing import next_version

    out: dict[str, Any] = {"artifact": None, "skipped_export": False}
    if (done := _published(cfg.models_dir, cfg.artifact_name, recipe)) is not None:
        log.info("%s already holds this run's export; not exporting again", done)
        out.update(artifact=str(done), skipped_export=True)
    else:
        version = next_version(cfg.models_dir, cfg.artifact_name)
        dest = Path(cfg.models_dir) / cfg.artifact_name / version
        export_run(cfg, dest, version=version, dev=dev, data=(data, dev_q, negatives))
        out["artifact"] = str(dest)
    from training.export.reranker_twins import fp16_reranker, quantize_reranker

    twins = {"int8": quantize_reranker, "fp16": fp16_reranker}
    for kind in [k for k in twins if k in (cfg.quantize, cfg.dtype)]:
        name = f"{cfg.artifact_name}-{kind}"
        if (done := _published(cfg.models_dir, name, recipe)) is None:
            version = next_version(cfg.models_dir, name)
            done = Path(cfg.models_dir) / name / version
            pairs = _parity_pairs(data, dev_q, negatives)
            twins[kind](
                out["artifact"],
                done,
                name=name,
                version=version,
                parity_pairs=pairs,
                parity_source=f"SciFact train-split dev pairs, first {len(pairs)}",
            )
        out[f"artifact_{kind}"] = str(done)
    return out


def _parity_pairs(data, dev_q: list[str], negatives: dict[str, list[str]]) -> list[tuple[str, str]]:
    return [(data.queries[q], data.corpus[d]) for q in dev_q for d in sorted(data.qrels[q]) + negatives[q]][:64]


def export_run(cfg: RerankerConfig, dest: str | os.PathLike, *, version: str = "1", dev: dict | None = None, data=None):
    """Export the finished run in ``<cfg.output_dir>/model`` to the artifact directory ``dest`` (named
    ``cfg.artifact_name``): parity on the first 64 dev pairs, the recipe and dev metrics in ``training``, dev
    nDCG@10 (x100) in ``scores``. ``data``: ``(SciFact, dev query ids, negatives)`` when already loaded. Returns the
    manifest.

    Raises:
        training.export.ExportError: parity out of tolerance. FileNotFoundError: no finished run.
    """
    from training.export.reranker import export_reranker
    from training.st_dir import DEFAULT_BASE_MODEL

    final = Path(cfg.output_dir) / "model"
    if dev is None:
        dev = json.loads((final / DONE_FILE).read_text())["dev"]
    sf, dev_q, negatives = data if data is not None else (lambda d: (d[0], d[2], d[3]))(_data(cfg))
    pairs = _parity_pairs(sf, dev_q, negatives)
    ndcg = {f"scifact-dev-{k.split('_', 1)[-1]}": 100 * v for k, v in dev.items() if k.endswith("ndcg@10")}
    return export_reranker(
        final,
        dest,
        name=cfg.artifact_name,
        version=version,
        parity_pairs=pairs,
        parity_source=f"SciFact train-split dev pairs, first {len(pairs)}",
        base_model=cfg.model_dir or DEFAULT_BASE_MODEL,
        training={"recipe": cfg.recipe(), "dev": dev},
        scores=ndcg,
    )
