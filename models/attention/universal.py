"""Universal Transformer (Dehghani et al. 2019): `universal`.

The mixer is plain softmax multi-head attention (`transformer`'s); what makes the
model universal is its stack, `models.stacks.UniversalStack`: one shared block
applied up to T times with position and timestep signals and per-position ACT
halting (ponder cost as `aux_loss`). The variant declares that stack in its
Capabilities, and `--config.block.stack=universal` puts any other mixer in it.
"""
from __future__ import annotations

from models import registry
from models.attention.sparse import build_transformer

registry.register("universal", build_transformer, registry.Capabilities(
    description="Universal Transformer: one shared block applied up to T times with ACT",
    causal=True, padding=True, variable_length=True, dense_equivalent={},
    block={"stack": "universal"}, rotary=True, decode="kv_cache"))
