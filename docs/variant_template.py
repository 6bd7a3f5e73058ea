"""A token mixer of your own, in your own module: copy this file, rename it, change the
attention. docs/variants.md#adding-a-variant walks through it; tests/test_variant_template.py
runs it through the conformance suite, and trains it through `python -m lra.launch`, so it
cannot rot.

The example is cosFormer's ablation without its re-weighting (Qin et al. 2022, Table 5's
"ReLU" row): linear attention with ReLU features,

    o_i = sum_j relu(q_i).relu(k_j) v_j / (sum_j relu(q_i).relu(k_j) + eps),

the whole of `cosformer` (models/attention/cosformer.py) minus the cos(pi/2 (i - j)/M)
weights. Train it without touching the package:

    python -m lra.launch --import=variant_template \\
        --config=configs/mqar.py:model=relu_linear,runlocal --workdir=workdirs/relu_linear

(`--import` imports this module, from the current folder, before the config is read.)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from models import registry
from models.attention.dense import MultiHeadAttention
from models.attention.linear_scan import DEFAULT_CHUNK, linear_attention

NAME = "relu_linear"  # the name configs, sweeps and registry.build use


class ReluLinearAttention(MultiHeadAttention):
    """query/key/value/out projections (MultiHeadAttention's, named as `transformer`'s)
    around ReLU linear attention."""

    def __init__(self, *, eps: float, chunk_size: int, **kwargs):
        super().__init__(attention_dropout=0.0, **kwargs)
        self.eps, self.chunk_size = eps, chunk_size

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        # The contract (models/registry.py): y_BxLxD of x_BxLxD's shape; padding_mask True
        # on real tokens; a padded key must not reach a real output.
        q, k, v = (self.split_heads(proj(x_BxLxD)) for proj in (self.query, self.key, self.value))
        phi_q, phi_k = jax.nn.relu(q), jax.nn.relu(k)
        if padding_mask is not None:  # zero keys and values write nothing to the sums
            real_Bx1xLx1 = padding_mask[:, None, :, None]
            phi_k, v = jnp.where(real_Bx1xLx1, phi_k, 0.0), jnp.where(real_Bx1xLx1, v, 0.0)
        # The library's sums (models/attention/linear_scan.py), chunked when causal.
        o_BxHxLxK = linear_attention(phi_q, phi_k, v, causal=self.causal,
                                     chunk_size=self.chunk_size, eps=self.eps)
        return self.out(self.merge_heads(o_BxHxLxK.astype(x_BxLxD.dtype)))


@registry.register(NAME, capabilities=registry.Capabilities(
    description="ReLU linear attention (cosFormer's ablation without re-weighting)",
    causal=True,             # it has a causal form (causal=True is accepted)...
    decode="recompute",      # ...decoded by re-running it over the tokens so far
    padding=True,            # padded keys never reach real outputs (tested)
    variable_length=True,    # any L <= max_len
    test_hparams={"chunk_size": 5},  # the conformance suite's sizes: L 16 in chunks of 5
    receptive_field="limited",       # ReLU: a query and key with disjoint supports weigh 0
    rotary_refusal="ReLU features do not commute with a rotation"))
def build(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
          qkv_dim: int | None = None, eps: float = 1e-6,
          chunk_size: int = DEFAULT_CHUNK) -> ReluLinearAttention:
    """Every keyword after rngs is a hyperparameter (--config.model_hparams.<name>)."""
    del max_len  # any length
    return ReluLinearAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                               eps=eps, chunk_size=chunk_size, rngs=rngs)
