"""Attention kernels: pure-JAX (XLA) paths now, Pallas backends as they arrive."""
from models.kernels.block_sparse_attention import block_sparse_attention  # noqa: F401
from models.kernels.linear_attention import linear_attention  # noqa: F401
