"""Resumable training state: ``<output_dir>/checkpoint/state.pt``, replaced atomically (written to
``checkpoint.tmp/`` first, then renamed), so an interrupted save leaves the previous checkpoint intact.

The state holds named parts (anything with ``state_dict``/``load_state_dict``: encoder, objectives, 3R, optimiser,
scheduler), the step, the run's counters (best score, timings) and every RNG (torch, CUDA, NumPy, Python), so a
resumed run continues bit-for-bit where an uninterrupted one would be.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.pt"


class Stateful(Protocol):
    """Anything whose state round-trips through ``state_dict`` / ``load_state_dict`` (modules, optimisers)."""

    def state_dict(self) -> dict:
        """The object's state as a picklable dict (PyTorch ``Module.state_dict`` / ``Optimizer.state_dict``)."""

    def load_state_dict(self, state: dict) -> Any:
        """Restore the state saved by :meth:`state_dict`."""


class Checkpointer:
    """Saves and restores the ``parts`` of a run in ``out_dir/checkpoint/``.

    Args:
        out_dir: the run's output directory.
        device: where tensors are loaded to; CUDA RNG state is kept when it is a CUDA device.
        parts: ``{name: object}``; a ``None`` part is saved as ``None`` and not restored.
    """

    def __init__(self, out_dir: Path, device: torch.device, parts: dict[str, Stateful | None]):
        self.dir = Path(out_dir) / CHECKPOINT_DIR
        self.device = device
        self.parts = parts

    def save(self, step: int, counters: dict[str, Any]) -> None:
        """Write the parts, ``step``, ``counters`` (top-level keys of the state) and the RNG states."""
        tmp = self.dir.with_name(CHECKPOINT_DIR + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        state = {"step": step, **{k: p.state_dict() if p is not None else None for k, p in self.parts.items()}}
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state_all()
        state.update(counters, rng=rng)
        torch.save(state, tmp / STATE_FILE)
        shutil.rmtree(self.dir, ignore_errors=True)
        os.replace(tmp, self.dir)

    def load(self) -> dict[str, Any] | None:
        """Restore the parts and RNG states from the checkpoint; returns the saved state (``step`` and the counters
        among its keys), or None when there is no checkpoint."""
        f = self.dir / STATE_FILE
        if not f.is_file():
            return None
        state = torch.load(f, map_location=self.device, weights_only=False)
        for name, part in self.parts.items():
            if part is not None and state.get(name) is not None:
                part.load_state_dict(state[name])
        rng = state["rng"]
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])
        if "cuda" in rng and self.device.type == "cuda":
            torch.cuda.set_rng_state_all(rng["cuda"])
        return state
