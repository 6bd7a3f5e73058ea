"""Attention token mixers, one module per family.

Importing this package registers every variant in `models.registry`; a new
family module is added to the imports below.
"""
from models.attention import dense  # noqa: F401  (registers "transformer")
from models.attention import lowrank  # noqa: F401  (linformer, compressed, synthesizer)
from models.attention import linear  # noqa: F401  (registers "linear", "performer", "rfa", "fast_weight")
from models.attention import sparse  # noqa: F401  (registers the position-based pattern variants)
from models.attention import memory  # noqa: F401  (set_transformer, luna, poolingformer)
from models.attention import bp  # noqa: F401  (registers "bp_transformer")
