"""Attention token mixers, one module per family.

Importing this package registers every variant in `models.registry`; a new
family module is added to the imports below.
"""
from models.attention import lowrank  # noqa: F401  (linformer, compressed, synthesizer)
from models.attention import linear  # noqa: F401  (registers "linear", "performer", "rfa", "fast_weight")
from models.attention import sparse  # noqa: F401  ("transformer" and the position-based pattern variants)
from models.attention import memory  # noqa: F401  (set_transformer, luna, poolingformer)
from models.attention import bp  # noqa: F401  (registers "bp_transformer")
from models.attention import routing  # noqa: F401  (registers "routing")
from models.attention import sinkhorn  # noqa: F401  (registers "sinkhorn")
from models.attention import span  # noqa: F401  (registers "adaptive_span")
from models.attention import probsparse  # noqa: F401  (registers "informer")
from models.attention import relative  # noqa: F401  (registers "transformer_xl", "gtrxl")
from models.attention import universal  # noqa: F401  (registers "universal")
from models.attention import clustered  # noqa: F401  (registers "clustered")
from models.attention import sac  # noqa: F401  (registers "sac")
from models.attention import lsh  # noqa: F401  (registers "reformer")
from models.attention import delta  # noqa: F401  (registers "deltanet", "gated_deltanet")
from models.attention import kda  # noqa: F401  (registers "kda")
from models.attention import deltaproduct  # noqa: F401  (registers "gated_deltaproduct")
from models.attention import forgetting  # noqa: F401  (registers "fox")
from models.attention import moba  # noqa: F401  (registers "moba")
from models.attention import based  # noqa: F401  (registers "based")
from models.attention import cosformer  # noqa: F401  (registers "cosformer")
from models.attention import path  # noqa: F401  (registers "path")
from models.attention import retention  # noqa: F401  (registers "retnet", "gla")
from models.attention import ssd  # noqa: F401  (registers "mamba2")
