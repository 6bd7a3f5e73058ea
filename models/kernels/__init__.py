"""Attention kernels, each with an XLA path and Pallas backends (GPU Triton, TPU Mosaic;
interpreted on CPU), differentiable, checked against `models/kernels/reference.py`."""
from models.kernels.block_sparse_attention import block_sparse_attention  # noqa: F401
from models.kernels.linear_attention import linear_attention  # noqa: F401
