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
