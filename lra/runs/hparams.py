"""`--config.model_hparams.<name>=<value>` for any hparam the variant's builder takes.

A task config's model_hparams hold the variant's presets only (configs/presets.py), so a
builder argument the preset leaves at its default (fox's `forget_gate`, a window, a
flag) is no field of the config, and ml_collections refuses an override of a field that
does not exist. `split` takes such overrides out of the command line before it is parsed,
after checking each against the registry (`models.registry.accepted_hparams`: a name the
variant does not take is refused, naming those it does), and `apply` sets them on the
parsed config. An override of a field the config has goes through ml_collections as
before, typed by the field. lra.launch and the sweep's expected config (lra/runs/plan.py)
both go through here, so a sweep's `--override=model_hparams.<name>=...` is checked once
and gives each run its own folder.
"""
from __future__ import annotations

import ast
import re

_OVERRIDE = re.compile(r"^--?config\.model_hparams\.([A-Za-z_]\w*)=(.*)$")


def parse_value(text: str):
    """A command-line value: true/false (any case), a Python literal, else the text."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def split(argv: list[str]) -> tuple[list[str], dict]:
    """(argv without the model_hparams overrides the config lacks, {name: value} of those).
    A name the config's variant does not take raises ConfigError."""
    found = {i: m.groups() for i, a in enumerate(argv) if (m := _OVERRIDE.match(a))}
    if not found:
        return argv, {}
    rest = [a for i, a in enumerate(argv) if i not in found]
    config = parse_config(rest)
    from lra.errors import ConfigError
    from models import registry

    takes = registry.accepted_hparams(config.model)
    keep, extra = [], {}
    for i, (name, text) in found.items():
        if name in config.model_hparams:
            keep.append(i)
        elif name in takes:
            extra[name] = typed(config.model, name, parse_value(text), takes[name])
        else:
            raise ConfigError(f"--config.model_hparams.{name}: {config.model} takes no "
                              f"hparam {name!r}; it takes: {', '.join(sorted(takes))}")
    return [a for i, a in enumerate(argv) if i not in found or i in keep], extra


def typed(model: str, name: str, value, default):
    """value, checked against the type of the builder's default (an int for a float is
    taken as that float); a default of None or none at all takes any value."""
    import inspect

    from lra.errors import ConfigError

    if default is None or default is inspect.Parameter.empty:
        return value
    if isinstance(default, float) and type(value) is int:
        return float(value)
    if type(value) is not type(default):
        raise ConfigError(f"--config.model_hparams.{name}={value!r}: {model}'s {name} is "
                          f"a {type(default).__name__} (default {default!r})")
    return value


def parse_config(argv: list[str]):
    """The config a command line builds, parsed apart from absl's global flags (no names
    claimed, none reused); flags other than --config's are left alone."""
    from absl import flags
    from ml_collections import config_flags

    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values,
                                    lock_config=True, sys_argv=argv)
    values(argv, known_only=True)
    return values.config


def apply(config, extra: dict) -> None:
    """Sets `split`'s overrides on the parsed config."""
    if extra:
        with config.unlocked():
            config.model_hparams.update(extra)
