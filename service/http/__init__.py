"""The HTTP layer: the kit every dialect shares (JSON responses and request parsing in :mod:`.kit`, the one
middleware, the domain-error table in :mod:`.errors`, OpenAPI) and one folder per dialect: ``inference/`` (OpenAI,
TEI, Cohere/Jina rerank, model administration), ``native/`` (the native collections API) and ``qdrant/`` (the
Qdrant-compatible REST and gRPC API). A dialect translates requests into :mod:`service.collections` or
:mod:`service.inference` calls and holds no state of its own; no dialect imports another."""
