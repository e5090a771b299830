"""The pretraining loop: ``BertForMaskedLM`` + AdamW + linear warmup/decay, resumable, logged.

Outputs in ``output_dir``: ``checkpoint.pt`` (model, optimiser, scheduler, step; replaced atomically every
``save_every`` steps), ``metrics.jsonl`` (one record per step: ``loss``, ``lr``, ``tokens_per_s``; per evaluation:
``heldout_loss``, ``heldout_accuracy``), ``metrics.png``, ``tokenizer/`` and, when done, ``encoder/``: a Hugging Face
directory (config, weights, tokenizer, ``pretrain_recipe.json``) that ``python -m training train`` accepts as
``model_name_or_path``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import BertConfig, BertForMaskedLM, get_linear_schedule_with_warmup

from artifact_contract.fsio import atomic_write_bytes, atomic_write_json
from training.data.train_data import load_sentences
from training.pretrain.config import PretrainSettings
from training.pretrain.data import MaskedBatches, load_or_build_tokenizer, split_heldout

RECIPE_FILE = "pretrain_recipe.json"


class Pretrainer:
    """Masked-LM pretraining of a BERT encoder (arXiv:1810.04805 §3.1) as configured by ``cfg``.

    Raises:
        FileNotFoundError: the corpus file is missing. ValueError: the corpus has fewer than two sentences.
    """

    def __init__(self, cfg: PretrainSettings) -> None:
        self.cfg = cfg
        self.out = Path(cfg.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.device = torch.device(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if cfg.threads and self.device.type == "cpu":
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        sentences = load_sentences(cfg.corpus_file, cfg.max_corpus_sentences)
        self.train_sentences, heldout = split_heldout(sentences, cfg.heldout_fraction, cfg.seed)
        self.tokenizer = load_or_build_tokenizer(
            cfg.tokenizer,
            cfg.init_from,
            self.train_sentences,
            cfg.vocab_size,
            self.out / "tokenizer",
        )
        self.batches = MaskedBatches(
            self.train_sentences, self.tokenizer, cfg.batch_size, cfg.max_seq_length, cfg.mlm_probability, cfg.seed
        )
        held = heldout[: cfg.heldout_max]
        # held-out masks are drawn once, with their own seed: every evaluation scores the same chosen tokens
        self.heldout = [
            self.batches.mask(held[i : i + cfg.batch_size], cfg.seed + 10_000_019 + i)
            for i in range(0, len(held), cfg.batch_size)
        ]
        self.n_heldout = len(held)
        self.model = self._build_model().to(self.device)
        decay = [p for n, p in self.model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
        no_decay = [p for n, p in self.model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
        )
        self.scheduler = get_linear_schedule_with_warmup(
            self.optimizer, math.ceil(cfg.warmup_ratio * cfg.max_steps), cfg.max_steps
        )
        self.step = 0

    def _build_model(self) -> BertForMaskedLM:
        if self.cfg.init_from:
            return BertForMaskedLM.from_pretrained(self.cfg.init_from)
        a = self.cfg.arch
        config = BertConfig(
            vocab_size=len(self.tokenizer),
            hidden_size=a.hidden,
            num_hidden_layers=a.layers,
            num_attention_heads=a.heads,
            intermediate_size=a.ffn,
            max_position_embeddings=a.max_positions,
            hidden_dropout_prob=a.dropout,
            attention_probs_dropout_prob=a.dropout,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        return BertForMaskedLM(config)

    def _autocast(self):
        """bf16 autocast: on CUDA when ``bf16``, on CPU when ``cpu_bf16``; else a no-op context."""
        if self.device.type == "cuda" and self.cfg.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        if self.device.type == "cpu" and self.cfg.cpu_bf16:
            return torch.autocast("cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def train_step(self) -> dict[str, float]:
        """One optimisation step on batch ``self.step``; returns ``loss``, ``lr``, ``tokens`` (non-padding)."""
        self.model.train()
        batch = {k: v.to(self.device) for k, v in self.batches.batch(self.step).items()}
        with self._autocast():
            loss = self.model(**batch).loss
        loss.backward()
        if self.cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return {"loss": float(loss.detach()), "lr": lr, "tokens": int(batch["attention_mask"].sum())}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Held-out MLM: mean cross-entropy over the chosen tokens (nats) and masked-token accuracy (0-1)."""
        self.model.eval()
        total_loss, correct, n = 0.0, 0, 0
        for b in self.heldout:
            b = {k: v.to(self.device) for k, v in b.items()}
            with self._autocast():
                logits = self.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.float()
            chosen = b["labels"] != -100
            total_loss += float(torch.nn.functional.cross_entropy(logits[chosen], b["labels"][chosen], reduction="sum"))
            correct += int((logits[chosen].argmax(-1) == b["labels"][chosen]).sum())
            n += int(chosen.sum())
        return {"heldout_loss": total_loss / max(n, 1), "heldout_accuracy": correct / max(n, 1)}

    # -- checkpoints -------------------------------------------------------------------------------------------
    def save_checkpoint(self) -> None:
        """Replace ``checkpoint.pt`` atomically with the current model, optimiser, scheduler, step and RNG."""
        state = {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
            "recipe": self.cfg.recipe(),
        }
        buf = io.BytesIO()
        torch.save(state, buf)
        atomic_write_bytes(self.out / "checkpoint.pt", buf.getvalue())

    def load_checkpoint(self) -> bool:
        """Resume from ``checkpoint.pt`` if present; returns whether it did."""
        path = self.out / "checkpoint.pt"
        if not path.is_file():
            return False
        state = torch.load(path, map_location=self.device, weights_only=False)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        self.step = int(state["step"])
        return True

    # -- reporting ---------------------------------------------------------------------------------------------
    def _log(self, rec: dict[str, Any]) -> None:
        with open(self.out / "metrics.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")

    def _drop_records_after(self, step: int) -> None:
        """On resume, forget the records a killed run wrote after its last checkpoint (they are redone)."""
        path = self.out / "metrics.jsonl"
        if path.is_file():
            keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
            atomic_write_bytes(path, ("\n".join(keep) + "\n" if keep else "").encode())

    def records(self) -> list[dict[str, Any]]:
        """The records of ``metrics.jsonl``."""
        path = self.out / "metrics.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines() if x] if path.is_file() else []

    def plot(self) -> Path:
        """``metrics.png``: training loss and held-out loss against step; held-out accuracy on a second axis."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        recs = self.records()
        tr = [(r["step"], r["loss"]) for r in recs if "loss" in r]
        ev = [(r["step"], r["heldout_loss"], r["heldout_accuracy"]) for r in recs if "heldout_loss" in r]
        fig, ax = plt.subplots(figsize=(7, 4))
        if tr:
            ax.plot(*zip(*tr), lw=0.6, alpha=0.6, label="train MLM loss")
        if ev:
            ax.plot([e[0] for e in ev], [e[1] for e in ev], "o-", label="held-out MLM loss")
            ax2 = ax.twinx()
            ax2.plot([e[0] for e in ev], [100 * e[2] for e in ev], "s--", color="tab:green", label="held-out acc.")
            ax2.set_ylabel("masked-token accuracy (%)")
            ax2.legend(loc="center right")
        ax.set_xlabel("step")
        ax.set_ylabel("cross-entropy (nats)")
        ax.legend(loc="upper right")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        plt.close(fig)
        return atomic_write_bytes(self.out / "metrics.png", buf.getvalue())

    # -- the run -----------------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to ``max_steps`` (resuming if a checkpoint exists), save the encoder; returns the recipe record.

        A run whose ``encoder/pretrain_recipe.json`` already exists with the same config is skipped.
        """
        done = self.out / "encoder" / RECIPE_FILE
        if done.is_file():
            rec = json.loads(done.read_text())
            if rec.get("config") == self.cfg.recipe():
                return rec
        if self.load_checkpoint():
            self._drop_records_after(self.step)
        elif (self.out / "metrics.jsonl").exists():
            (self.out / "metrics.jsonl").unlink()
        cfg = self.cfg
        start = time.perf_counter()
        tokens_total = 0
        bar = tqdm(total=cfg.max_steps, initial=self.step, disable=not cfg.progress, desc="pretrain")
        while self.step < cfg.max_steps:
            t0 = time.perf_counter()
            rec = self.train_step()
            dt = time.perf_counter() - t0
            tokens_total += rec["tokens"]
            rec = {"step": self.step, **rec, "tokens_per_s": rec["tokens"] / dt}
            if self.step % cfg.eval_every == 0 or self.step == cfg.max_steps:
                rec.update(self.evaluate())
            self._log(rec)
            bar.update(1)
            bar.set_postfix(loss=f"{rec['loss']:.3f}", acc=f"{rec.get('heldout_accuracy', float('nan')):.3f}")
            if self.step % cfg.save_every == 0 or self.step == cfg.max_steps:
                self.save_checkpoint()
                self.plot()
        bar.close()
        return self._save_encoder(time.perf_counter() - start, tokens_total)

    def _save_encoder(self, seconds: float, tokens: int) -> dict[str, Any]:
        enc = self.out / "encoder"
        self.model.save_pretrained(str(enc))
        self.tokenizer.save_pretrained(str(enc))
        final = self.evaluate()
        recs = self.records()
        rec = {
            "objective": "masked language modelling (BERT, arXiv:1810.04805 §3.1: 15% chosen, 80/10/10)",
            "config": self.cfg.recipe(),
            "corpus": {
                "file": self.cfg.corpus_file,
                "train_sentences": len(self.train_sentences),
                "heldout_sentences_scored": self.n_heldout,
            },
            "steps": self.step,
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "final": final,
            "last_session_seconds": round(seconds, 1),
            "last_session_tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
            "mean_tokens_per_s": float(np.mean([r["tokens_per_s"] for r in recs])) if recs else None,
        }
        atomic_write_json(enc / RECIPE_FILE, rec)
        return rec
