"""What the benchmarks print about the machine they ran on."""

from __future__ import annotations

import platform
import shutil
import subprocess
import threading

import numpy as np


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


def gpu_memory_used_mib() -> int | None:
    """Memory used on the first GPU now, every process's, in MiB (``nvidia-smi --query-gpu=memory.used``), or None
    without an ``nvidia-smi``."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    out = subprocess.run(
        [exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    first = out.stdout.strip().splitlines()[:1]
    return int(first[0]) if first and first[0].strip().isdigit() else None


class Dmon:
    """``nvidia-smi dmon -s u -d 1`` in the background: the mean SM utilisation (%) over its life, or None."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        exe = shutil.which("nvidia-smi")
        self.proc = (
            subprocess.Popen([exe, "dmon", "-s", "u", "-d", "1"], stdout=subprocess.PIPE, text=True) if exe else None
        )
        if self.proc:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            parts = line.split()
            if parts and not line.startswith("#") and len(parts) > 1 and parts[1].isdigit():
                self.samples.append(float(parts[1]))

    def stop(self) -> float | None:
        if not self.proc:
            return None
        self.proc.terminate()
        self.proc.wait()
        return float(np.mean(self.samples)) if self.samples else None


def write_json(path: str | None, rows: list[dict]) -> None:
    """Write ``{"cpu": cpu_model(), "rows": rows}`` to ``path`` (its folder created), when a path is given."""
    if path:
        import json
        from pathlib import Path

        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps({"cpu": cpu_model(), "rows": rows}, indent=1))
