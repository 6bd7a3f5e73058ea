"""Tables, figures and verdicts from runs and measurements, for lra.report and
lra.benchmark: the runs grouped into rows (summary), Table 1 and Figure 3 (tables), the
protocol a reviewer needs (protocol: published numbers, convergence, the locality
baseline) and the efficiency table with its verdicts (efficiency).

Nothing here imports a module at the top of lra/ (the commands and lra/train.py) but
lra.errors (tests/test_imports.py checks it)."""
