"""Zoology's own code (HazyResearch/zoology @ d88d6f5, files copied unchanged: zoology/config.py,
zoology/data/utils.py, zoology/data/multiquery_ar.py; zoology/utils.py cut to its first 31 lines,
import_from_str and set_determinism, to avoid wandb) generating MQAR as figure 2 does."""
import sys, time
import numpy as np
from zoology.config import DataConfig
from zoology.data.multiquery_ar import MQARConfig
from zoology.data.utils import prepare_data
from zoology.utils import set_determinism

out = {}
settings = [(64, 4), (128, 8), (256, 16), (512, 64)]
n_train = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
for rnq in (False, True):
    for L, kv in settings:
        if rnq and (L, kv) != (256, 16):
            continue
        set_determinism(123)  # zoology/train.py: set_determinism(config.seed) before prepare_data
        t = time.time()
        kw = dict(num_kv_pairs=kv, train_power_a=0.01, test_power_a=0.01, random_non_queries=rnq)
        data = DataConfig(
            train_configs=[MQARConfig(num_examples=n_train, vocab_size=8192, input_seq_len=L, **kw)],
            test_configs=[MQARConfig(num_examples=3_000, vocab_size=8192, input_seq_len=L, **kw)],
            batch_size=512)
        train_dl, test_dl = prepare_data(data)
        for split, dl in (("train", train_dl), ("test", test_dl)):
            seg = dl.dataset.segments[0]
            out[f"{L}_{kv}_{int(rnq)}_{split}_inputs"] = seg.inputs.numpy()
            out[f"{L}_{kv}_{int(rnq)}_{split}_labels"] = seg.labels.numpy()
        print(f"L={L} kv={kv} random_non_queries={rnq}: {time.time() - t:.1f}s", flush=True)
np.savez_compressed("/tmp/zoology_cmp/zoology_out.npz", **out)
