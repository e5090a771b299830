"""One optimisation step: encode the views, 3R, the weighted objectives, backward (optionally gradient-cached),
clip, AdamW step.

1. Encode the views (``anchor``/``positive`` = two dropout passes of the same sentences, or
   premise/entailment/contradiction) → h ``(N, D)`` each (pooling + train-only head).
2. 3R (if enabled, :mod:`training.three_r`): h̄ from k pool sentences, σ over the batch, mask
   with the learnable c, ĥ = transform(h) for every view (the 3R paper Eqs. 3–5).
3. Loss = Σ_terms weight × objective(batch) (:mod:`training.objectives`; SimCSE = InfoNCE, Eqs. 1/2/4).
4. AdamW step, linear schedule with warmup (:mod:`training.optim`).

Gradient caching (``chunk`` > 0 and < batch; Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size
under Memory Limited Setup", arXiv:2101.06983): embeddings are first computed chunk by chunk without gradient, the
loss is computed on the full batch of detached leaf copies and back-propagated to them, then each chunk is
re-encoded with the same dropout RNG state and its cached gradient back-propagated. The result is the gradient of
the full-batch InfoNCE (all N−1 in-batch negatives), at the memory of one chunk.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from torch import nn

from training.encoder import EncoderOutput, SentenceEncoder
from training.objectives import ObjectiveBatch
from training.three_r import ThreeR

Tokens = dict[str, torch.Tensor]


def _rng_state(device: torch.device) -> dict[str, Any]:
    st = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        st["cuda"] = torch.cuda.get_rng_state(device)
    return st


def _set_rng_state(st: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(st["torch"])
    if "cuda" in st:
        torch.cuda.set_rng_state(st["cuda"], device)


class StepRunner:
    """Runs optimisation steps of ``encoder`` on the weighted sum of ``objectives``.

    Args:
        encoder: the encoder being trained.
        objectives: named loss terms (:func:`training.objectives.build_objective`); ``weights`` their weights.
        three_r: the 3R module, or None (3R off). May be swapped between steps.
        optimizer, scheduler: stepped once per :meth:`step`.
        bf16: bf16 autocast on CUDA; ``cpu_bf16``: bf16 autocast on CPU. ``max_grad_norm``: clip the global
            gradient norm (None/0: no clipping).

    Attributes:
        train_seconds, three_r_seconds: wall time spent in steps, and in 3R's own work, since construction.
    """

    def __init__(
        self,
        encoder: SentenceEncoder,
        objectives: nn.ModuleDict,
        weights: dict[str, float],
        three_r: ThreeR | None,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        *,
        device: torch.device,
        bf16: bool = False,
        cpu_bf16: bool = False,
        max_grad_norm: float | None = None,
    ):
        self.encoder, self.objectives, self.weights, self.three_r = encoder, objectives, weights, three_r
        self.optimizer, self.scheduler = optimizer, scheduler
        self.device = device
        self.use_bf16 = bf16 and device.type == "cuda"
        self.use_cpu_bf16 = cpu_bf16 and device.type == "cpu"
        self.max_grad_norm = max_grad_norm
        self.layers = sorted({l for o in objectives.values() for l in o.extra_layers})
        self.need_tokens = any(o.needs_token_states for o in objectives.values())
        self.train_seconds = 0.0
        self.three_r_seconds = 0.0

    def autocast(self):
        """bf16 autocast on CUDA or on the CPU when asked for, else a no-op context."""
        if self.use_bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        if self.use_cpu_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def encode(self, tok: Tokens, sl: slice) -> EncoderOutput:
        """Encode rows ``sl`` of a tokenised view (with gradient, dropout as the encoder's mode says)."""
        with self.autocast():
            return self.encoder(
                **{k: v[sl] for k, v in tok.items()}, layers=self.layers, return_token_states=self.need_tokens
            )

    def compute_loss(
        self, outs: dict[str, EncoderOutput], toks: dict[str, Tokens], step: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """3R transform + weighted sum of the objectives on already-encoded views.

        Returns the scalar loss and the log dict (``loss``, ``loss/<name>``, ``loss/<name>/<part>``, 3R statistics:
        ``c``, ``n_redundant_dims``, ``sigma_mean``, ``sigma_q0`` … ``sigma_q100``, ``time/three_r``).
        """
        raw = {v: o.embedding for v, o in outs.items()}
        logs: dict[str, float] = {}
        transform = lambda x: x  # noqa: E731
        if self.three_r is not None:
            with self.autocast():
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

    def _grad_cached_backward(self, toks: dict[str, Tokens], step: int, chunk: int) -> dict[str, float]:
        """GradCache (module docstring): the full-batch gradient, encoding ``chunk`` rows at a time."""
        N = next(iter(toks.values()))["input_ids"].shape[0]
        slices = [slice(i, min(i + chunk, N)) for i in range(0, N, chunk)]
        states: dict[tuple[str, int], dict] = {}
        parts: dict[str, list[dict[str, torch.Tensor]]] = {v: [] for v in toks}
        with torch.no_grad():
            for v, t in toks.items():
                for ci, sl in enumerate(slices):
                    states[(v, ci)] = _rng_state(self.device)
                    parts[v].append(self.encode(t, sl).tensors())
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
                o = self.encode(t, sl).tensors()
                surrogate = sum((o[k] * g).sum() for k, g in grads.items())
                surrogate.backward()
        _set_rng_state(after, self.device)
        return logs

    def step(self, views: dict[str, list[str]], step: int, chunk: int = 0) -> dict[str, float]:
        """Forward, backward (gradient-cached when ``0 < chunk < batch``) and optimiser step on one batch.

        Args:
            views: the texts of each view (``anchor``, ``positive``, optionally ``hard_negative``), N each.
            step: the optimisation step (selects 3R's pool sample).

        Returns:
            the logs of :meth:`compute_loss` plus ``c_grad`` (3R's threshold gradient, before clipping), ``grad_norm``
            (when clipping), ``lr`` and ``time/step`` (seconds).
        """
        t0 = time.perf_counter()
        self.encoder.train()
        self.objectives.train()
        toks = {v: self.encoder.tokenize(t) for v, t in views.items()}
        N = len(views["anchor"])
        self.optimizer.zero_grad(set_to_none=True)
        if chunk <= 0 or chunk >= N:
            outs = {v: self.encode(t, slice(None)) for v, t in toks.items()}
            loss, logs = self.compute_loss(outs, toks, step)
            loss.backward()
        else:
            logs = self._grad_cached_backward(toks, step, chunk)
        if self.three_r is not None and self.three_r.c.grad is not None:
            logs["c_grad"] = float(self.three_r.c.grad)  # before clipping: is the threshold learning at all?
        if self.max_grad_norm:
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            logs["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        logs["lr"] = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        dt = time.perf_counter() - t0
        logs["time/step"] = dt
        self.train_seconds += dt
        return logs
