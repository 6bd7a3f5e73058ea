"""LRA tasks: generators, readers and the task registry.

Task modules register themselves when imported; the registry imports them on first use,
so `python -m lra.tasks.<task>` does not import its own module twice.
"""
from lra.tasks.registry import Task, available, get, register  # noqa: F401
