"""Attention token mixers, one module per family.

Importing this package registers every variant in `models.registry`; a new
family module is added to the imports below.
"""
from models.attention import dense  # noqa: F401  (registers "transformer")
