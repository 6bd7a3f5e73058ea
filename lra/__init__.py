"""Long Range Arena: tasks, input pipeline, training loop, benchmarks and reports.

At the top of lra/, the commands a user runs (`python -m lra.<command>`: benchmark, sweep,
report, generate, download, dense_check, gpu_suite, bench_kernels, bench_generate,
cache_memory, synthetic_report, ngram, linear_baseline), the trainer (train.py:
train_and_evaluate, which launch.py runs) and the user errors (errors.py). Below, by role:
tasks/ (the task readers and generators), training/ (the loop's internals), runs/ (runs
seen from outside: their results, a sweep's plan), reporting/ (tables, figures and
verdicts), gpu/ (the GPU suite's parts) and downloading/ (lra.download's machinery). A
package never imports a module at the top (tests/test_imports.py).
"""
