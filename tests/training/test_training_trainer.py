"""Trainer mechanics on the real default encoder (tiny batches): gradient caching equals the
full-batch gradient (dropout masks replayed), 3R statistics, and exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from training.config import load_settings
from training.three_r import batch_sigma
from training.trainer import Trainer

pytestmark = pytest.mark.timeout(600)


def _cfg(tmp_path, **kw):
    base = {
        "batch_size": 8,
        "max_steps": 4,
        "data": {"max_train_samples": 96},
        "output_dir": str(tmp_path),
        "export": False,
        "final_eval": False,
        "resume": False,
        "progress": False,
        "threads": 1,
        "eval_every": 0,
        "save_every": 0,
        "eval_limit": 16,
        "three_r": {"enabled": True, "pool_size": 8, "k": 3, "n_top_words": 50, "pool_min_top_fraction": 0.5},
    }
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return load_settings(None, base)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    torch.set_num_threads(1)
    return Trainer(_cfg(tmp_path_factory.mktemp("gc")))


def _grads(tr: Trainer, chunk: int, seed: int):
    tr.cfg.grad_cache_chunk = chunk
    step, sched = tr.optimizer.step, tr.scheduler.step
    tr.optimizer.step = lambda *a, **k: None  # measure gradients, do not update
    tr.scheduler.step = lambda *a, **k: None
    try:
        torch.manual_seed(seed)
        logs = tr.train_step(0)
    finally:
        tr.optimizer.step, tr.scheduler.step = step, sched
    g = {n: p.grad.detach().clone() for n, p in tr.encoder.named_parameters() if p.grad is not None}
    return logs, g, tr.three_r.c.grad.detach().clone()


def _manual_chunked(tr: Trainer, chunk: int, seed: int):
    """Reference: encode each view chunk by chunk WITH gradient (same RNG order as the cached pass)."""
    from training.encoder import EncoderOutput

    tr.optimizer.zero_grad(set_to_none=True)
    tr.encoder.train()
    views = tr.data.views(tr.data.batch(0))
    toks = {v: tr.encoder.tokenize(t) for v, t in views.items()}
    torch.manual_seed(seed)
    outs = {}
    for v, t in toks.items():
        parts = [tr.stepper.encode(t, slice(i, i + chunk)).embedding for i in range(0, tr.cfg.batch_size, chunk)]
        outs[v] = EncoderOutput(torch.cat(parts))
    loss, _ = tr.stepper.compute_loss(outs, toks, 0)
    loss.backward()
    g = {n: p.grad.detach().clone() for n, p in tr.encoder.named_parameters() if p.grad is not None}
    return float(loss), g, tr.three_r.c.grad.detach().clone()


def test_gradient_cache_equals_full_gradient_with_dropout(trainer):
    logs, g_cache, c_cache = _grads(trainer, 4, seed=123)
    loss_ref, g_ref, c_ref = _manual_chunked(trainer, 4, seed=123)
    assert logs["loss"] == pytest.approx(loss_ref, rel=1e-5)
    assert set(g_cache) == set(g_ref) and len(g_ref) > 50
    scale = max(v.abs().max().item() for v in g_ref.values())
    assert scale > 0
    worst = max((g_cache[k] - g_ref[k]).abs().max().item() for k in g_ref)
    assert worst <= 1e-4 * scale + 1e-9
    assert c_cache.item() == pytest.approx(c_ref.item(), rel=1e-4, abs=1e-12)
    # sigma's quantiles over the D dimensions are logged, so a user sees where c sits among them
    qs = [logs[f"sigma_q{q}"] for q in (0, 10, 50, 90, 100)]
    assert qs == sorted(qs) and qs[0] > 0 and qs[0] <= logs["sigma_mean"] <= qs[-1]


def test_cpu_bf16_runs_the_steps_in_bf16(trainer):
    """``cpu_bf16``: the encoder's matrix products in a training step run in bf16 on the CPU (fp32 otherwise); a step
    still gives a finite loss."""
    seen: list[torch.dtype] = []
    linear = next(m for m in trainer.encoder.modules() if isinstance(m, torch.nn.Linear))
    hook = linear.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    try:
        trainer.train_step(0)
        trainer.stepper.use_cpu_bf16 = True
        loss = trainer.train_step(0)["loss"]
    finally:
        trainer.stepper.use_cpu_bf16 = False
        hook.remove()
    assert seen[0] == torch.float32 and seen[-1] == torch.bfloat16 and np.isfinite(loss)


def test_three_r_prepare_uses_pool_mean_and_batch_sigma(trainer):
    anchor = torch.randn(8, trainer.encoder.hidden_size)
    st = trainer.three_r.prepare(trainer.encoder, anchor, step=2)
    expect_hbar = trainer.encoder.encode_tensor(trainer.three_r.sample_pool(2), use_head=True).mean(0)
    assert torch.allclose(st.hbar, expect_hbar, atol=1e-5)
    assert torch.allclose(st.sigma, batch_sigma(anchor))
    assert torch.equal(st.mask, (batch_sigma(anchor) < trainer.three_r.c).float())
    pool_file = trainer.out / "redundant_pool.txt"
    assert pool_file.read_text().splitlines() == trainer.three_r.pool


def test_resume_reproduces_uninterrupted_run(tmp_path):
    torch.set_num_threads(1)
    a = Trainer(_cfg(tmp_path / "a", max_steps=4))
    a.run()
    b = Trainer(_cfg(tmp_path / "b", max_steps=4))
    for _ in range(2):
        b.train_step(b.step)
        b.step += 1
    b.save_checkpoint()
    del b
    c = Trainer(_cfg(tmp_path / "b", max_steps=4, resume=True))
    assert c.load_checkpoint() and c.step == 2
    c.run()
    sa, sc = a.encoder.state_dict(), c.encoder.state_dict()
    worst = max((sa[k].float() - sc[k].float()).abs().max().item() for k in sa)
    assert worst < 1e-6
    assert a.three_r.c.item() == pytest.approx(c.three_r.c.item(), abs=1e-7)
    recs = [json.loads(l) for l in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "train"] == [0, 1, 2, 3]
    assert all(np.isfinite(r["loss"]) and "c" in r for r in recs if r["kind"] == "train")
    assert (tmp_path / "a" / "metrics.png").is_file()
