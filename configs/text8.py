r"""text8: character-level language modelling (27 characters), bits per character; the same
settings and arguments as configs/enwik8.py (lra/tasks/enwik8.py reads both).

  python launch.py --config=configs/text8.py:model=transformer,mini \
      --config.data_dir=data/text8 --workdir=workdirs/text8_mini/transformer
"""
from configs import enwik8


def get_config(arg: str | None = None):
    return enwik8.get_config(arg, corpus="text8")
