"""Our rows at the same settings (lra/tasks/state_tracking.py read_split, max_length 255 =
their context 256 - 1): PYTHONPATH=$PWD .venv/bin/python scripts/state_tracking_comparison/ours.py [N]"""
import sys

import numpy as np

from lra.tasks import state_tracking

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
out = {}
for language in ("parity", "modular_arithmetic"):
    for split in ("train", "val", "test"):
        d = state_tracking.read_split(
            split, 255, language=language, train_min_length=3, train_max_length=40,
            val_min_length=40, val_max_length=256, test_min_length=40, test_max_length=256,
            num_train_examples=N, num_valid_examples=N, num_test_examples=N, seed=42)
        for k, v in d.items():
            out[f"{language}/{split}/{k}"] = v
np.savez("/tmp/st_cmp/ours.npz", **out)
print("wrote /tmp/st_cmp/ours.npz")
