"""The training loop's internals (lra/train.py runs them): checkpoints, the input pipeline,
the objectives' step functions, the optimiser, sharding, resuming, init_from, what the
processes of a multi-process run agree on, and the supervisor launch.py runs them under.

Nothing here imports a module at the top of lra/ (the commands and lra/train.py) but
lra.errors (tests/test_imports.py checks it)."""
