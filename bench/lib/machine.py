"""What the benchmarks print about the machine they ran on."""

from __future__ import annotations

import platform
import subprocess


def cpu_model() -> str:
    """``lscpu``'s "Model name" (the CPU every number in docs/ is named by), else ``platform.processor()``."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        out = ""
    return next((x.split(":", 1)[1].strip() for x in out.splitlines() if x.startswith("Model name")), "") or (
        platform.processor() or platform.machine()
    )


def gpu_model() -> str:
    """The first CUDA device's name as torch reports it, or ``"none"`` (no torch, no CUDA)."""
    try:
        import torch
    except ImportError:
        return "none"
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


def write_json(path: str | None, rows: list[dict]) -> None:
    """Write ``{"cpu": cpu_model(), "rows": rows}`` to ``path`` (its folder created), when a path is given."""
    if path:
        import json
        from pathlib import Path

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
