"""Front processes: with ``api_workers`` > 1, N of them share the public port in front of one core process.

A front answers the embedding routes itself (``POST /v1/embeddings``, ``/embeddings``, ``/embed``, ``/``: the same
route functions and request models as the core, ``service.http.inference.embeddings``), sending only the texts and
options to the core's ``POST /internal/embed`` over a private Unix socket and building the client's JSON itself
(:mod:`service.front.app`); every other request is passed to the core unchanged (:mod:`service.front.proxy`). The
front holds no model and no collection: the core is the one owner of both (``service.supervisor`` starts them).
"""
