"""The suite's two tiers (docs/design.md, "Tests, CI and JAX versions").

`make test` runs the default tier: every module of models/ through every per-variant
property, each property at its main setting, and every user path (timed in design.md). The
`exhaustive` tier repeats those properties over the rest of the cross product: every
registered variant (not one per module) and the other settings (a second pooling, mask or
causal combination, more positions, the eager pass), and the long process tests whose path
a default test already takes: the GPU suite's whole dry run, the multi-process failure
cases beside the two-process match-and-resume test, and every notebook but
compare_variants (`@EXHAUSTIVE` on the test, with a comment why). `make test-exhaustive`
runs it and CI runs it after `make test`, so CI still checks every cell; the split only
decides what a developer waits for. Union of the two: the whole suite (minus `slow`, which
CI never selects).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from models import registry

EXHAUSTIVE = pytest.mark.exhaustive

# The variant that stands for its module in the default tier where the module holds
# several: the one the grids and kernels use most. A module not named here is represented
# by its first variant in alphabetical order.
PREFERRED = ("transformer", "gated_deltanet", "gla", "linear", "linformer", "luna",
             "transformer_xl", "s4d")


def representatives(names: Iterable[str]) -> set[str]:
    """One name per models/ module among `names`: PREFERRED first, else alphabetical."""
    names = list(names)
    rank = {n: (PREFERRED.index(n) if n in PREFERRED else len(PREFERRED), n) for n in names}
    chosen: dict[str, str] = {}
    for name in sorted(names, key=rank.__getitem__):
        chosen.setdefault(registry.module_of(name), name)
    return set(chosen.values())


def exhaustive(value, *, when: bool = True, id: str | None = None):
    """`value` as a pytest param in the exhaustive tier (when `when`), else as is."""
    if not when:
        return value if id is None else pytest.param(value, id=id)
    return pytest.param(value, marks=EXHAUSTIVE, id=id)


def variants(names: Iterable[str] | None = None) -> list:
    """`names` (default every registered variant) as pytest params: one per module in the
    default tier, the others exhaustive. Parametrize a per-variant test with it."""
    names = registry.available() if names is None else list(names)
    keep = representatives(names)
    return [exhaustive(n, when=n not in keep) for n in names]


def cases(settings: Iterable, main: Callable[[str], object],
          names: Iterable[str] | None = None) -> list:
    """(name, setting) pytest params for a property checked at several settings: the
    variant's `main(name)` setting in the variant's tier (`variants`), every other setting
    exhaustive. Parametrize with "name,<setting>"."""
    settings = list(settings)
    out = []
    for p in variants(names):
        name, marks = (p.values[0], tuple(p.marks)) if hasattr(p, "values") else (p, ())
        for setting in settings:
            extra = () if setting == main(name) or marks else (EXHAUSTIVE,)
            out.append(pytest.param(name, setting, marks=(*marks, *extra)))
    return out
