"""Defaults chosen by the device the models run on: batching limits by execution provider, and the number of HTTP
front processes of a GPU deployment. Each comes from a measurement (docs/performance.md, docs/gpu.md); ``Settings``
uses them for the fields left at their "by the device" default.
"""

from __future__ import annotations

import os

_GPU_BATCHING = {"max_batch_tokens": 32768, "max_batch_size": 256, "batch_overhead_tokens": 256}
#: batching defaults by a model's first execution provider, for the fields left at their "by provider" default.
#: CPU: bigger batches are no cheaper per token there, and 16 inputs measured best (docs/performance.md). CUDA:
#: bench/batch_shape_bench.py on an H200 (docs/gpu.md): a batch of 32 x 16 tokens costs 1.9 ms, 3.8 us per padded
#: token, and the cost per token stops falling near 128-256 inputs x 128 tokens (0.25 us), hence 32768 tokens,
#: 256 inputs and a fixed cost of a batch of ~256 padded tokens
BATCHING_DEFAULTS = {
    "CPUExecutionProvider": {"max_batch_tokens": 2048, "max_batch_size": 16, "batch_overhead_tokens": 16},
    "CUDAExecutionProvider": _GPU_BATCHING,
    "TensorrtExecutionProvider": _GPU_BATCHING,
}

#: the most front processes ``api_workers: 0`` gives a GPU deployment (:func:`gpu_api_workers`)
GPU_API_WORKERS_MAX = 8


def gpu_api_workers(cpus: int | None = None) -> int:
    """Front processes of a GPU deployment left at ``api_workers: 0``: half the host's cores, 2 to 8.

    Measured on an H200 with 16 host cores (docs/performance.md, "Several serving processes on one port"): one core
    process + 4 fronts served 1.3-1.7x one process at 128 clients and on 128-token texts; 8 fronts served 1.04-1.29x
    4 fronts (means of two runs each, every point). Other core counts are not measured: the rule keeps one front per
    two cores, so that the fronts' JSON and tokenizer work leave cores to the core process's loop and threads.

    :param cpus: the host's cores (default ``os.cpu_count()``; 2 when it is unknown).
    :returns: ``max(2, min(8, cpus // 2))``.
    """
    cpus = cpus if cpus is not None else (os.cpu_count() or 2)
    return max(2, min(GPU_API_WORKERS_MAX, cpus // 2))
