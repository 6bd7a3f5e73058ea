"""lra.download's machinery: an archive fetched, continued and verified (transfer), and
unpacked or placed into the task's folder, whole or not at all (unpack). The catalogue
(which archive holds which task's files) and the command are lra/download.py's.

Nothing here imports a module at the top of lra/ (the commands and lra/train.py) but
lra.errors (tests/test_imports.py checks it)."""
