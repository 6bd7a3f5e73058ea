"""Ours (lra.tasks.mqar, this repository's) beside Zoology's rows in zoology_out.npz."""
import os, sys, time
import numpy as np
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
from lra.tasks import mqar

z = np.load("/tmp/zoology_cmp/zoology_out.npz")
n_train = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
V = 8192


def gap_hist(labels, kv, space):
    rows, cols = np.nonzero(labels != -100)
    gaps = (cols - 2 * kv) // 2
    edges = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]
    edges = [e for e in edges if e < space] + [space]
    h, _ = np.histogram(gaps, bins=edges)
    return h / h.sum(), edges


def stats(x, y, kv, L):
    keys, values = x[:, :2 * kv:2], x[:, 1:2 * kv:2]
    lab = y != -100
    q_rows, q_cols = np.nonzero(lab)
    # each key queried once: the token at a labelled position is a key of its row whose value is the label
    return {"key range": f"[{keys.min()}, {keys.max()}]",
            "value range": f"[{values.min()}, {values.max()}]",
            "keys distinct per row": bool(all(len(set(r)) == kv for r in keys[:2000])),
            "labelled share": f"{lab.mean():.5f}",
            "labels per row": f"{lab.sum(1).mean():.2f}",
            "query tokens that are keys of their row": f"{np.mean([x[r, c] in keys[r] for r, c in zip(q_rows[:5000], q_cols[:5000])]):.4f}",
            "zero share of inputs": f"{(x == 0).mean():.5f}",
            "mean non-kv token": f"{x[:, 2 * kv:][~lab[:, 2 * kv:]].mean():.1f}"}


rows = []
for key in sorted({k.rsplit("_", 2)[0] for k in z.files}):
    L, kv, rnq = map(int, key.split("_"))
    seeds = mqar.split_seeds(123)
    for split, n in (("train", n_train), ("test", 3000)):
        t = time.time()
        x, y = mqar.generate(vocab_size=V, seq_len=L, num_kv_pairs=kv, num_examples=n,
                             seed=seeds[split], random_non_queries=bool(rnq))
        dt = time.time() - t
        zx, zy = z[f"{key}_{split}_inputs"], z[f"{key}_{split}_labels"]
        same_shape = zx.shape == x.shape and zy.shape == y.shape
        same_in = same_shape and np.array_equal(zx, x)
        same_lab = same_shape and np.array_equal(zy, y)
        # with random_non_queries: the positions Zoology left as given (non-random) must agree
        row = dict(L=L, kv=kv, rnq=rnq, split=split, n=n, identical_inputs=same_in,
                   identical_labels=same_lab, ours_s=dt)
        if rnq:
            # Zoology's random tokens replace the zeros; compare the rest exactly
            ours_fixed, _ = mqar.generate(vocab_size=V, seq_len=L, num_kv_pairs=kv, num_examples=n,
                                          seed=seeds[split], random_non_queries=False)
            keep = ours_fixed != 0
            row["identical_outside_random_positions"] = bool(np.array_equal(zx[keep], x[keep]))
            rz, ro = zx[~keep], x[~keep]
            row["random tokens: mean (uniform: 4095.5)"] = f"{rz.mean():.1f} / {ro.mean():.1f}"
            row["random tokens: share < V/2"] = f"{(rz < V // 2).mean():.4f} / {(ro < V // 2).mean():.4f}"
            cz = np.bincount(rz, minlength=V); co = np.bincount(ro, minlength=V)
            e = len(rz) / V
            row["random tokens: chi2/dof vs uniform"] = f"{((cz - e) ** 2 / e).sum() / (V - 1):.3f} / {((co - e) ** 2 / e).sum() / (V - 1):.3f}"
        space = (L - 2 * kv) // 2
        hz, edges = gap_hist(zy, kv, space)
        ho, _ = gap_hist(y, kv, space)
        row["gap histogram edges"] = edges
        row["gap histogram zoology"] = np.round(hz, 4).tolist()
        row["gap histogram ours"] = np.round(ho, 4).tolist()
        row["stats zoology"] = stats(zx, zy, kv, L)
        row["stats ours"] = stats(x, y, kv, L)
        rows.append(row)
        print(row, flush=True)
