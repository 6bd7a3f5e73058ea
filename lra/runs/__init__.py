"""A run of launch.py seen from outside: the results.json files under a directory and what
kind of run each is (results), and a sweep's runs planned (plan: their folders, command
lines, the configs they will record, whether their data is there), and the runs records
committed beside the reports (record).

Nothing here imports a module at the top of lra/ (the commands and lra/train.py) but
lra.errors (tests/test_imports.py checks it)."""
