"""Compatibility: qdrant-client's congruence tests, parity of served embeddings across providers."""
