"""Sentence-encoder training: SimCSE (+3R and relatives), SparseCSE pruning, MLM pretraining, export to ONNX artifacts.

Command lines: ``python -m training {export,train,eval,sparse,pretrain}``. Never imports ``service``; the two share
only :mod:`artifact_contract`.
"""
