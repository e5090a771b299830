"""SparseCSE (SparseCSE §2): structured pruning of attention heads and FFN neurons, the method itself.

* :mod:`training.sparse.masks` — head masks ξ and neuron masks ν as forward hooks (transformers 5 has no ``head_mask``).
* :mod:`training.sparse.importance` — ``L_score = λ·L_alignment + (1 − λ)·L_uniformity`` and
  importance ``E|∂L_score/∂mask|`` on STS-B train positives.
* :mod:`training.sparse.prune` — global lowest-importance selection, physical removal (smaller
  Linear layers), save/load of per-layer shapes (``sparse_structure.json``).

These modules use nothing above them (no trainer, no exporter). The workflow that does (score → prune → rewind →
fine-tune with the project trainer → export → measure) is :mod:`training.sparse_pipeline`, and its command line
``python -m training sparse {score,prune,sweep}`` is :mod:`training.cli.sparse`.
"""
