"""Tables, figures and verdicts from runs and measurements, for lra.report and
lra.benchmark: the runs grouped into rows (summary), Table 1 and Figure 3 (tables), the
protocol a reviewer needs (protocol: published numbers, convergence, the locality
baseline), the efficiency table with its verdicts (efficiency), MAD's table (mad_table),
the rows' order and ties of the synthetic-task tables (ranking), and lra.generate's samples
as text and images (samples).

Nothing here imports a module at the top of lra/ (the commands and lra/train.py) but
lra.errors (tests/test_imports.py checks it)."""
