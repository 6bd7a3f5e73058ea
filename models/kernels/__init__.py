"""Attention kernels, each with an XLA path and Pallas backends (GPU Triton, TPU Mosaic;
interpreted on CPU), differentiable, checked against `models/kernels/reference.py`
(decayed attention: against `models.attention.retention.chunked_retention`; the delta rule:
against `models.attention.delta`'s chunked and recurrent forms)."""
from models.kernels.block_sparse_attention import block_sparse_attention
from models.kernels.decayed_attention import decayed_linear_attention
from models.kernels.delta_rule import delta_rule
from models.kernels.linear_attention import linear_attention

__all__ = ["block_sparse_attention", "decayed_linear_attention", "delta_rule",
           "linear_attention"]
