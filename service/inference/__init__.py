"""Inference: the ONNX models and their sessions (:mod:`.onnx_encoder`, :mod:`.onnx_reranker`), execution
providers, the batcher and its fair queue, the model registry and its control (load, activate, unload, poll), the
embedder and reranker interfaces the HTTP layer and the collections' port adapter call, prompts, and the
server-side sparse models (:mod:`.sparse`). Imports neither :mod:`service.http` nor :mod:`service.collections`."""
