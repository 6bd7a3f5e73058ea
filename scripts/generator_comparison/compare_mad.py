"""Ours (lra.tasks.mad.generate_splits, this repository's) beside MAD's rows (mad_out.npz)."""
import os, sys, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
from lra.tasks import mad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mad_cases import CASES  # noqa: E402

z = np.load("/tmp/mad_cmp/mad_out.npz")
for i, (task, change) in enumerate(CASES):
    name = task.replace("-", "_")
    b = dict(mad.baseline(name))
    settings = {k: v for k, v in {**b, **change}.items() if k in mad.PARAMS}
    n_train = change.get("num_train_examples", b["num_train_examples"])
    t = time.time()
    ours = mad.generate_splits(name, num_train_examples=n_train, num_test_examples=1280,
                               num_valid_examples=1, **settings)
    dt = time.time() - t
    row = {"case": i, "task": name, "change": change, "n_train": n_train, "ours_s": round(dt, 1)}
    for split in ("train", "test"):
        zx, zy = z[f"{i}_{split}_inputs"], z[f"{i}_{split}_targets"]
        ox, oy = ours[split]
        row[f"{split} shape"] = tuple(zx.shape)
        row[f"{split} identical"] = bool(zx.shape == ox.shape and np.array_equal(zx, ox)
                                         and np.array_equal(zy, oy))
        lab = zy != -100
        row[f"{split} labelled share (mad/ours)"] = f"{lab.mean():.4f}/{(oy != -100).mean():.4f}"
        row[f"{split} token range"] = f"[{zx.min()}, {zx.max()}]/[{ox.min()}, {ox.max()}]"
    print(row, flush=True)
