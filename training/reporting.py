"""A run's report: ``metrics.jsonl`` (one JSON record a line: ``kind`` ``train`` with the step's logs, or ``eval``
with STS-B dev Spearman ×100) and ``metrics.png`` (training loss and STS-B dev over steps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "metrics.png"


class MetricsLog:
    """Appends records to ``out_dir/metrics.jsonl`` and plots them to ``out_dir/metrics.png``."""

    def __init__(self, out_dir: Path):
        self.out = Path(out_dir)
        self.path = self.out / METRICS_FILE

    def write(self, rec: dict[str, Any]) -> None:
        """Append one record."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")

    def records(self) -> list[dict[str, Any]]:
        """Every record, in order (none when the file does not exist)."""
        if not self.path.is_file():
            return []
        return [json.loads(l) for l in self.path.read_text().splitlines() if l.strip()]

    def rewind(self, step: int) -> None:
        """Drop what a resumed run will redo: records of steps from ``step`` on, except an ``eval`` at ``step``."""
        if not self.path.is_file():
            return
        keep = [
            r
            for r in self.records()
            if r.get("step", 0) < step or (r.get("kind") == "eval" and r.get("step", 0) == step)
        ]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep))

    def plot(self) -> Path | None:
        """``metrics.png``: training loss (log scale when positive) and STS-B dev Spearman over steps; None when
        nothing is logged yet."""
        if not self.path.is_file():
            return None
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        recs = self.records()
        tr = [r for r in recs if r.get("kind") == "train"]
        ev = [r for r in recs if r.get("kind") == "eval"]
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        ax[0].plot([r["step"] for r in tr], [r["loss"] for r in tr])
        ax[0].set_xlabel("step")
        ax[0].set_ylabel("training loss")
        ax[0].set_yscale("log" if tr and min(r["loss"] for r in tr) > 0 else "linear")
        metric = next((k for r in ev for k in r if k not in ("kind", "step", "c", "best")), "STSBenchmark-dev")
        ax[1].plot([r["step"] for r in ev], [r.get(metric) for r in ev], marker="o")
        ax[1].set_xlabel("step")
        ax[1].set_ylabel("STS-B dev Spearman x100" if metric == "STSBenchmark-dev" else f"{metric} x100")
        fig.tight_layout()
        path = self.out / PLOT_FILE
        fig.savefig(path, dpi=80)
        plt.close(fig)
        return path
