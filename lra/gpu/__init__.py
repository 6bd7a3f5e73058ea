"""The GPU suite's parts (python -m lra.gpu_suite runs them): each mode's plan, running a
command in its own process group within a time limit, the device probe and the stage
files (common), and the stages themselves (bench_stages: the kernel tests, lra.bench_kernels
and lra.benchmark's passes; run_stages: the time-boxed ListOps runs).

Nothing here imports a module at the top of lra/ (the commands and lra/train.py) but
lra.errors (tests/test_imports.py checks it); the commands it measures run as processes."""
