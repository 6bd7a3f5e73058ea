"""Statistics of RULER niah.py rows (whitespace tokens = str.split())."""
import json, os, re, sys
import numpy as np
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = ["niah_single_1", "niah_multikey_2", "niah_multikey_3"]
LENGTHS = [256, 512, 1024, 2048]
NEEDLE = "One of the special magic"
NOISE = "The grass is green."
runs = json.load(open(os.path.join(HERE, "used_args.json")))["runs"]

def summ(a):
    a = np.asarray(a, float)
    return {"mean": round(float(a.mean()), 4), "std": round(float(a.std()), 4),
            "min": round(float(a.min()), 4), "max": round(float(a.max()), 4)}

def hist5(d):
    h, _ = np.histogram(np.clip(d, 0, 1 - 1e-12), bins=5, range=(0, 1))
    return [round(float(x), 4) for x in h / len(d)]

out = {}
for name in CONFIGS:
    out[name] = {}
    for L in LENGTHS:
        f = os.path.join(HERE, "out", str(L), name, "validation.jsonl")
        if runs.get(f"{name}/{L}") != "ok" or not os.path.exists(f):
            out[name][str(L)] = {"status": runs.get(f"{name}/{L}", "missing"), "rows": 0}
            continue
        rows = [json.loads(l) for l in open(f)]
        ntok, nneedle, nans, d_field, d_own, pos_mismatch = [], [], [], [], [], 0
        frac_all_needle, frac_real_needle, nhay, qlen, length_field, real_needles = [], [], [], [], [], []
        key_collide = 0
        for r in rows:
            inp = r["input"]; toks = inp.split(); T = len(toks)
            ntok.append(T); length_field.append(r["length"])
            nneedle.append(inp.count(NEEDLE)); nans.append(len(r["outputs"]))
            d_field.append(r["token_position_answer"] / T)
            # own computation: index of the first token that contains the answer string
            ans = r["outputs"][0]
            own = next(i for i, t in enumerate(toks) if ans in t)
            d_own.append(own / T)
            pos_mismatch += own != r["token_position_answer"]
            # needle sentences = lines starting with NEEDLE (context is "\n"-joined)
            lines = inp.split("\n")
            nl = [ln for ln in lines if ln.startswith(NEEDLE)]
            frac_all_needle.append(sum(len(ln.split()) for ln in nl) / T)
            real = [ln for ln in nl if ln.rstrip(".").endswith(" " + ans)]
            real_needles.append(len(real))
            frac_real_needle.append(sum(len(ln.split()) for ln in real) / T)
            # query key (from the question) and distractors sharing that key
            m = re.search(r"What (?:is|are all) the special magic \S+ for (.+) mentioned in the provided text\?$", inp)
            key = m.group(1)
            key_collide += sum(1 for ln in nl if f" for {key} is: " in ln) > 1  # >1 needle line with the query key
            nhay.append(inp.count(NOISE) if "noise" in name or name == "niah_single_1" else len(nl) - len(real))
            qlen.append(len(inp[inp.rfind("\nWhat"):].split()))
        d_field = np.array(d_field); d_own = np.array(d_own)
        out[name][str(L)] = {
            "status": "ok", "rows": len(rows),
            "input_tokens": summ(ntok),
            "length_field_(input+tokens_to_generate)": summ(length_field),
            "needle_sentences_per_row": summ(nneedle),
            "real_needles_per_row": summ(real_needles),
            "answers_per_row": summ(nans),
            "depth_token_position_answer_over_input_tokens": {**summ(d_field), "hist5": hist5(d_field)},
            "depth_own_first_token_containing_answer": {**summ(d_own), "hist5": hist5(d_own)},
            "rows_where_own_pos_differs_from_field": pos_mismatch,
            "frac_tokens_in_all_needle_format_sentences": summ(frac_all_needle),
            "frac_tokens_in_answer_needle": summ(frac_real_needle),
            "haystack_units_per_row": summ(nhay),
            "query_tokens_from_What": summ(qlen),
            "answer_prefix_tokens": len(rows[0]["answer_prefix"].split()),
            "rows_with_distractor_sharing_query_key": key_collide,
        }
json.dump(out, open(os.path.join(HERE, "ruler_stats.json"), "w"), indent=1)
for name in CONFIGS:
    for L in LENGTHS:
        s = out[name][str(L)]
        if s["status"] != "ok": print(name, L, s["status"]); continue
        d = s["depth_token_position_answer_over_input_tokens"]; o = s["depth_own_first_token_containing_answer"]
        print(f"{name:16s} {L:5d} tok {s['input_tokens']['mean']:7.1f} [{s['input_tokens']['min']:.0f},{s['input_tokens']['max']:.0f}] "
              f"needles {s['needle_sentences_per_row']['mean']:.2f}[{s['needle_sentences_per_row']['min']:.0f},{s['needle_sentences_per_row']['max']:.0f}] "
              f"hay {s['haystack_units_per_row']['mean']:.1f} ans {s['answers_per_row']['mean']:.0f} "
              f"depth {d['mean']:.3f}±{d['std']:.3f} {d['hist5']} own {o['mean']:.3f} mism {s['rows_where_own_pos_differs_from_field']} "
              f"fNall {s['frac_tokens_in_all_needle_format_sentences']['mean']:.3f} fNreal {s['frac_tokens_in_answer_needle']['mean']:.3f} "
              f"q {s['query_tokens_from_What']['mean']:.1f} coll {s['rows_with_distractor_sharing_query_key']}")
