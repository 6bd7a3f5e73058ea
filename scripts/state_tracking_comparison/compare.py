"""Rows equal? Statistics side by side (numpy only: either venv)."""
import numpy as np

theirs, ours = np.load("/tmp/st_cmp/theirs.npz"), np.load("/tmp/st_cmp/ours.npz")
print("| language | split | rows | inputs equal | labels equal | mean length (theirs / ours) "
      "| label shares (ours) |")
print("|---|---|---|---|---|---|---|")
for language in ("parity", "modular_arithmetic"):
    for split in ("train", "val", "test"):
        k = f"{language}/{split}/"
        ti, tt = theirs[k + "inputs"], theirs[k + "targets"]
        oi, ot, om = ours[k + "inputs"], ours[k + "targets"], ours[k + "mask"]
        # theirs: -1 where ignored (their target_pad_idx), ours -100
        same_in = np.array_equal(ti, oi)
        same_t = np.array_equal(np.where(tt == -1, -100, tt), ot)
        their_len = (np.argmax(tt != -1, axis=1) + 1).mean()  # input tokens before the answer
        labels = ot[ot != -100]
        shares = np.bincount(labels) / len(labels)
        print(f"| {language} | {split} | {len(ti)} | {same_in} | {same_t} | "
              f"{their_len:.2f} / {om.sum(1).mean():.2f} | "
              + " ".join(f"{i}:{s:.3f}" for i, s in enumerate(shares) if s) + " |")
