"""Long Range Arena: tasks, input pipeline, training loop, benchmarks and reports."""
