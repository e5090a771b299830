"""What the benchmark scripts share: the machine's description, a service or Milvus subprocess, artifacts, data."""

from pathlib import Path

#: the repository's root (the folder that holds ``bench/``, ``service/`` and ``training/``)
REPO = Path(__file__).resolve().parents[2]
