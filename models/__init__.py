"""Flax NNX models: token mixers (registry + variants), blocks, encoder and heads.

Importing the package registers every token mixer, so
`from models import registry; registry.available()` lists them all.
"""
from models import registry  # noqa: F401
from models import attention  # noqa: F401  (registers the attention variants)
