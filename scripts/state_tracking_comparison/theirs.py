"""Their rows: automl/unlocking_state_tracking's FormLangDatasetGenerator (xLSTM's
formal-language data) as their parity_delta_net_2.yaml / mod_arithmetic_delta_net_2.yaml
configure it (seed 42, context 256, train lengths 3..40, validation and test 40..256),
the first N rows of each split as their DataLoader receives them (inputs, targets).
Run with the torch venv after setup.sh:  /tmp/torchvenv/bin/python theirs.py [N]"""
import sys

import numpy as np

sys.path.insert(0, "/tmp/st_cmp/src")
from experiments.data.formal_language.formal_language_dataset import (  # noqa: E402
    FormLangDatasetConfig, FormLangDatasetGenerator)

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
CONFIGS = {"parity": (3, 5_120_000), "modular_arithmetic": (10, 102_400_000)}
out = {}
for language, (vocab, train_count) in CONFIGS.items():
    cfg = FormLangDatasetConfig(
        synth_lang_type=language, vocab_size=vocab, seed=42, enable_mask=True,
        context_length=256, min_sequence_length=3, max_sequence_length=40,
        count={"train": train_count, "validation": 8192, "test": 8192},
        subpar={"validation": {"min_sequence_length": 40, "max_sequence_length": 256},
                "test": {"min_sequence_length": 40, "max_sequence_length": 256}})
    gen = FormLangDatasetGenerator(cfg)
    for split, name in (("train", "train"), ("validation", "val"), ("test", "test")):
        ds = gen.datasets[split]
        pairs = [ds[i] for i in range(N)]
        out[f"{language}/{name}/inputs"] = np.stack([x.numpy() for x, _ in pairs])
        out[f"{language}/{name}/targets"] = np.stack([y.numpy() for _, y in pairs])
np.savez("/tmp/st_cmp/theirs.npz", **out)
print("wrote /tmp/st_cmp/theirs.npz:", {k: v.shape for k, v in out.items()})
