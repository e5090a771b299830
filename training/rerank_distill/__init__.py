"""Reranker distillation from the first stage: the cross-encoder learns the first stage's own scores over many of
each train claim's candidates, mixed with the judgements (``python -m training train-reranker --loss margin_mse |
listwise_kl --teacher dbsf``).

The teacher (:mod:`training.rerank_distill.teacher`) is the first stage the reranker will rerank at test, computed as
the dev protocol computes it (:func:`training.rerank_protocol.first_stage`: e.g. DBSF of the dense and BM25 top
``dev_depth`` over the whole corpus): each train claim's ``candidates_per_query`` best unjudged candidates and its
judged documents, with their fused first-stage scores, computed once and cached in ``<output_dir>/teacher.json``.
One file per loss, each a sentence-transformers cross-encoder loss fed with mixed targets:

* ``margin_mse`` (:mod:`training.rerank_distill.margin_mse`): Margin-MSE of Hofstätter et al., "Improving Efficient
  Neural Ranking Models with Cross-Architecture Knowledge Distillation", arXiv:2010.02666 (sentence-transformers'
  ``MarginMSELoss``) over (claim, judged document, candidate) triplets;
* ``listwise_kl`` (:mod:`training.rerank_distill.listwise_kl`): the KL divergence from the teacher's softened score
  distribution over a claim's candidates to the model's softmax (ListNet's cross-entropy, Cao et al., ICML 2007, with
  Hinton et al.'s temperature-softened targets, arXiv:1503.02531; sentence-transformers' ``ListNetLoss``).

Mixing with the labels (``label_weight`` w): ``(1 - w) * distillation + w * the label loss``, realised on the
targets, which both losses allow exactly: see each module.
"""

from __future__ import annotations

from typing import Any

#: the distillation losses of ``train-reranker --loss``
LOSSES = ("margin_mse", "listwise_kl")
#: the teacher temperature T when ``--teacher-temperature`` is not given: margin-MSE takes the teacher's fused
#: margins as they are (on SciFact a claim's DBSF margins are within about ±2, the label margin is 1); the listwise loss
#: softens ``softmax(t / T)``: a claim's top-30 DBSF scores span ~1.5 (about 2.8 to 1.1 on SciFact train claims), so
#: T = 0.25 puts most of the mass on the best few while the tail keeps an order (T = 0.1 is nearly one-hot)
DEFAULT_TEMPERATURE = {"margin_mse": 1.0, "listwise_kl": 0.25}


def temperature(loss: str, given: float | None) -> float:
    """The teacher temperature of ``loss``: ``given``, else :data:`DEFAULT_TEMPERATURE`.

    Raises:
        ValueError: ``given`` is not positive.
    """
    t = DEFAULT_TEMPERATURE[loss] if given is None else float(given)
    if not t > 0:
        raise ValueError(f"teacher temperature must be positive, got {given!r}")
    return t


def check(cfg: Any) -> None:
    """Refuse a distillation setting before any work (a :class:`training.reranker.RerankerConfig`).

    Raises:
        ValueError: ``cfg.loss`` is not a distillation loss, a label weight outside [0, 1], a non-positive
            temperature, fewer than one candidate per claim.
    """
    if cfg.loss not in LOSSES:
        raise ValueError(f"distillation loss must be one of {LOSSES}, got {cfg.loss!r}")
    if not 0.0 <= cfg.label_weight <= 1.0:
        raise ValueError(f"label weight must be in [0, 1], got {cfg.label_weight!r}")
    if cfg.candidates_per_query < 1:
        raise ValueError(f"candidates per query must be at least 1, got {cfg.candidates_per_query}")
    temperature(cfg.loss, cfg.teacher_temperature)


def loss_and_rows(cfg: Any, model: Any, data: Any, train_q: list[str]) -> tuple[Any, dict[str, list]]:
    """The ``CrossEncoderTrainer`` loss and columns of the distillation loss ``cfg.loss`` (a
    :class:`training.reranker.RerankerConfig`) for the ``CrossEncoder`` ``model`` on ``train_q`` of ``data``; the
    teacher's scores are read from (or written to) ``<cfg.output_dir>/teacher.json``.

    Raises:
        ValueError: an unknown loss, a label weight outside [0, 1] or a non-positive temperature.
    """
    from pathlib import Path

    from training.rerank_distill.teacher import candidates, teacher_run

    check(cfg)
    t = temperature(cfg.loss, cfg.teacher_temperature)
    run = teacher_run(
        data,
        train_q,
        cfg.teacher,
        cfg.dev_depth,
        cfg.teacher_encoder,
        cfg.max_seq_length,
        cache=Path(cfg.output_dir) / "teacher.json",
    )
    cands = candidates(data, run, train_q, cfg.candidates_per_query)
    if cfg.loss == "margin_mse":
        from training.rerank_distill.margin_mse import margin_mse

        return margin_mse(model, data, cands, cfg.label_weight, t)
    from training.rerank_distill.listwise_kl import listwise_kl

    return listwise_kl(model, data, cands, cfg.label_weight, t)
