"""Attention-free token mixers (and Lite Transformer's conv/attention split), one
module per family.

Importing this package registers every variant in `models.registry`.
"""
from models.mixers import gmlp  # noqa: F401  (registers "gmlp")
from models.mixers import mlp_mixer  # noqa: F401  (registers "mixer")
from models.mixers import fourier  # noqa: F401  (registers "fnet")
from models.mixers import lite  # noqa: F401  (registers "lite")
from models.mixers import ssm  # noqa: F401  (registers "s4d", "lru")
from models.mixers import s5  # noqa: F401  (registers "s5")
from models.mixers import mega  # noqa: F401  (registers "mega")
from models.mixers import hyena  # noqa: F401  (registers "hyena")
