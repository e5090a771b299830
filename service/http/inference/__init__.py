"""The inference dialects: OpenAI ``/v1/embeddings``, TEI ``/embed`` ``/tokenize`` ``/rerank``, Cohere/Jina
``/v1|v2/rerank``, ``/similarity``, and the model administration routes."""
