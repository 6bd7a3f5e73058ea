"""Our niah rows' statistics, beside RULER's (ruler_stats.json, from gen_all.py + stats.py):
the same quantities on lra/tasks/niah.py's rows. Prints the markdown table of
results/cpu/niah_generators.md.

  PYTHONPATH=. python scripts/niah_comparison/ours.py
"""
import json
import os

import numpy as np

from lra.tasks import niah

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = dict(key_len=2, value_len=2, num_keys=32, num_values=32, num_filler=64,
             sentence_len=16)  # configs/niah.py
ROWS = {"niah_single_1": "single_1", "niah_multikey_2": "multikey_2"}


def ours(variant: str, length: int, n: int = 300, seed: int = 42) -> dict:
    rng = np.random.default_rng(seed)
    depth, token_depth, needles, needle_share = [], [], [], []
    for _ in range(n):
        r = niah.make_row(rng, length=length, **niah.VARIANTS[variant], **SIZES)
        x = r["tokens"][:-1]
        context = int(np.flatnonzero(x == niah.QUERY)[0])
        # RULER's depth: the answer's first token position over the input's tokens.
        answer = r["tokens"][r["answers"][0]]
        at = [s for s in r["slots"] if x[s + 4] == answer
              and (x[s + 1:s + 3] == x[context + 1:context + 3]).all()][0]
        token_depth.append((at + 4) / length)
        depth.append(r["queried_depths"][0])
        needles.append(int((x[:context] == niah.NEEDLE).sum()))
        needle_share.append(needles[-1] * 6 / length)
    hist = np.histogram(token_depth, bins=5, range=(0, 1))[0] / n
    return {"depth": f"{np.mean(token_depth):.3f} ± {np.std(token_depth):.3f}",
            "hist": " ".join(f"{h:.2f}" for h in hist),
            "needles": f"{np.mean(needles):.1f}", "share": f"{np.mean(needle_share):.2f}",
            "haystack_depth": f"{np.mean(depth):.3f} ± {np.std(depth):.3f}"}


def main() -> None:
    theirs = json.load(open(os.path.join(HERE, "ruler_stats.json")))
    print("| row | L | source | input tokens | needles per row | needle tokens' share | "
          "answer depth (mean ± std) | depth histogram (5 buckets) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, variant in ROWS.items():
        for length in (256, 512, 1024, 2048):
            t = theirs[name][str(length)]
            if t.get("status", "ok") != "ok" or "input_tokens" not in t:
                print(f"| {name} | {length} | RULER | - | - | - | {t.get('status')} | - |")
            else:
                d = t["depth_token_position_answer_over_input_tokens"]
                hist = " ".join(f"{h:.2f}" for h in d["hist5"])
                share = t["frac_tokens_in_all_needle_format_sentences"]
                share = share["mean"] if isinstance(share, dict) else share
                print(f"| {name} | {length} | RULER | {t['input_tokens']['mean']:.0f} | "
                      f"{t['needle_sentences_per_row']['mean']:.1f} | {share:.2f} | "
                      f"{d['mean']:.3f} ± {d['std']:.3f} | {hist} |")
            o = ours(variant, length)
            print(f"| {name} | {length} | ours | {length} | {o['needles']} | {o['share']} | "
                  f"{o['depth']} | {o['hist']} |")


if __name__ == "__main__":
    main()
