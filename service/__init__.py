"""Embedding service: ONNX Runtime inference behind an OpenAI/TEI-compatible REST API."""
