"""The interpreters the kernels' tests run the TPU flavour in: Mosaic's TPU interpreter
(`pltpu.InterpretParams`: simulated VMEM, DMAs and semaphores) with race detection on, not
the generic Pallas interpreter; conftest.py fails a test whose kernels raced."""
from jax.experimental.pallas import tpu as pltpu

TPU_INTERPRETER = pltpu.InterpretParams(detect_races=True)
