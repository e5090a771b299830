"""A wall-clock budget for reranker training (``train-reranker --max-seconds S``): a ``transformers`` trainer
callback that ends training at the first optimizer step after ``S`` seconds, evaluating and saving that step first,
so ``load_best_model_at_end`` still chooses among evaluated checkpoints and the run finishes normally (a lent GPU's
call has a hard time limit: a run killed by it would leave no chosen model).
"""

from __future__ import annotations

import logging
import time

from transformers import TrainerCallback

log = logging.getLogger("training.reranker")


class WallClockBudget(TrainerCallback):
    """Stop training once ``seconds`` have passed since ``on_train_begin`` (``stopped_at``: the step, else None).

    Raises:
        ValueError: ``seconds`` is not positive.
    """

    def __init__(self, seconds: float):
        if not seconds > 0:
            raise ValueError(f"max_seconds must be positive, got {seconds!r}")
        self.seconds = float(seconds)
        self.start: float | None = None
        self.stopped_at: int | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        """Start the clock (a resumed run gets the whole budget again)."""
        self.start = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        """Past the budget: evaluate, save and stop at this step."""
        if self.stopped_at is None and self.start is not None and time.monotonic() - self.start >= self.seconds:
            self.stopped_at = state.global_step
            control.should_evaluate = control.should_save = control.should_training_stop = True
            log.info("wall-clock budget of %.0f s spent: stopping at step %d", self.seconds, state.global_step)
        return control
