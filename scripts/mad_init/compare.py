"""Ours beside mad-lab's own models (results/cpu/mad_init_vs_mad_lab.md): MAD's model at
width 128, 2 layers (configs/mad.py:task=<task>,model=<row>, its `mad` scaffold with
scaffold.init = mad) for the rows mad_side.py built in torch (gla, hyena: the
LanguageModel of in-context recall; the same under compression: the AutoEncoder), at the
seeds mad_side.py used, each role pooled over layers and seeds, beside mad-lab's
($CMP_DIR/mad_init.json, written by mad_side.py in the torch venv). Prints the markdown
table; exits 1 when a role's standard deviation or mean differs by more than 5 standard
errors (or 5% of the sd, for the small tensors), when a uniform law's bound is exceeded,
when the heads' tying differs, or when the control (ours under scaffold.init = own) agrees
on a role that `own` draws otherwise (then the check could not fail).

    .venv/bin/python scripts/mad_init/compare.py

A role names mad-lab's parameters and ours (regexes). Where the shapes differ (ours has
fla's GLA key width 64 where mad-lab's expand_k 1 gives 128; MAD's Hyena 4x inner width
and filter order 4 where ours is 1x and 64; mad-lab's SwiGLU w3 has fan_in 352 where our
GELU MLP's fc2 has 512) the law is compared, not the raw values: each tensor is scaled by
its own shape first, `fan_in` (torch's U(+-1/sqrt(fan_in)): sd x sqrt(fan_in) = 0.577) or
`fans` (xavier-uniform with gain g: sd x sqrt((fan_in + fan_out) / 2) = g). A role whose
law is uniform also reports max |w| over the law's bound (each tensor by its own shape;
agreement needs it <= 1 on both sides: that tells torch's or xavier's uniform from a
normal of the same sd). Roles with one side only (mad-lab's Hyena short filter, ours'
MLP biases) are printed, not compared.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import NamedTuple

import numpy as np

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
GAIN = 2 ** -2.5  # mad-lab's GatedLinearAttention reset_parameters
L = r"\.[02]\.1\."  # mad-lab's mixer layers (model.0, model.2 / encoder.0, encoder.2)
C = r"\.[13]\.1\."  # its channel mixers (SwiGLU)
MIX = "mixer/"


class Role(NamedTuple):
    label: str
    mad: str | None      # regex (fullmatch) over mad-lab's names; None: ours only
    ours: str | None     # regex (search, anchored at the end) over our paths; None: theirs
    law: str             # torch | xavier | normal | zero | kept (bound checked: uniform)
    scale: str = "raw"   # raw | fan_in | fans: what is compared (module docstring)
    own_differs: bool = False  # ours under init=own draws it by another law: control NO


EMBED = Role("token embedding N(0, 0.02)", r"token_embeds\.weight",
             r"encoder/embeddings/token/embedding", "normal", own_differs=True)
NORMS = Role("norms' scales (kept: ones)", r".*(\d\.0|unembed\.0|decoder\.[03])\.weight",
             r"(norm|mixer_norm|mlp_norm|dec_norm\d|unembed_norm)/scale", "kept")
HEAD = [Role("unembed.1.weight / lm_head kernel (torch's draw)", r"unembed\.1\.weight",
             r"lm_head/kernel", "torch", own_differs=True),
        Role("unembed.1.bias / lm_head bias (zeroed)", r"unembed\.1\.bias", r"lm_head/bias",
             "zero")]
SWIGLU = [
    Role("SwiGLU w1, w2 / MLP fc1 kernel (torch's draw; fan_in 128 both)",
         r"model" + C + r"w[12]\.weight", r"mlp/fc1/kernel", "torch", own_differs=True),
    Role("SwiGLU w3 / MLP fc2 kernel (torch's draw; fan_in 352 / 512: sd x sqrt(fan_in))",
         r"model" + C + r"w3\.weight", r"mlp/fc2/kernel", "torch", "fan_in",
         own_differs=True),
    Role("(SwiGLU: bias false) / MLP fc1, fc2 biases", None, r"mlp/fc[12]/bias", "zero"),
]
GLA_Q = r"model" + L + r"{}\.weight"
HYENA_FILTER = r"long_conv\.filter\.implicit_filter\."
ROLES = {
    "gla": [EMBED] + [
        Role("q_proj, k_proj / query, key (xavier 2^-2.5; 128x128 / 128x64: sd x "
             "sqrt((in+out)/2))", GLA_Q.format("[qk]_proj"), MIX + r"(query|key)/kernel",
             "xavier", "fans", own_differs=True),
        Role("v_proj / value (xavier 2^-2.5)", GLA_Q.format("v_proj"), MIX + r"value/kernel",
             "xavier", own_differs=True),
        Role("g_proj / output_gate (xavier 2^-2.5)", GLA_Q.format("g_proj"),
             MIX + r"output_gate/kernel", "xavier", own_differs=True),
        Role("o_proj / out (xavier 2^-2.5)", GLA_Q.format("o_proj"), MIX + r"out/kernel",
             "xavier", own_differs=True),
        Role("gk_proj.0 / alpha_down (xavier 2^-2.5; 16x128 / 128x16)",
             GLA_Q.format(r"gk_proj\.0"), MIX + r"alpha_down/kernel", "xavier",
             own_differs=True),
        Role("gk_proj.1 / alpha_up (xavier 2^-2.5; 128x16 / 16x64: sd x sqrt((in+out)/2))",
             GLA_Q.format(r"gk_proj\.1"), MIX + r"alpha_up/kernel", "xavier", "fans",
             own_differs=True),
        Role("gk_proj.1.bias / alpha_up bias (zeroed)", r"model" + L + r"gk_proj\.1\.bias",
             MIX + r"alpha_up/bias", "zero"),
        Role("g_norm.weight / norm_scale (kept: ones)", r"model" + L + r"g_norm\.weight",
             MIX + r"norm_scale", "kept"),
    ] + SWIGLU + HEAD + [NORMS],
    "hyena": [EMBED] + [
        Role("in_proj.weight (torch's draw; fan_in 128 both)", r"model" + L + r"in_proj\.weight",
             MIX + r"in_proj/kernel", "torch"),
        Role("out_proj.weight (torch's draw; fan_in 512 / 128: sd x sqrt(fan_in))",
             r"model" + L + r"out_proj\.weight", MIX + r"out_proj/kernel", "torch", "fan_in"),
        Role("in_proj, out_proj biases (zeroed)", r"model" + L + r"(in|out)_proj\.bias",
             MIX + r"(in|out)_proj/bias", "zero", own_differs=True),
        Role("filter's first Linear / filter_in (torch's draw; fan_in 3 both)",
             r"model" + L + HYENA_FILTER + r"0\.weight", MIX + r"filter_in/kernel", "torch"),
        Role("filter's hidden Linears / filter_hidden (fan_in 4 / 64: sd x sqrt(fan_in))",
             r"model" + L + HYENA_FILTER + r"[24]\.weight", MIX + r"filter_hidden/\d+/kernel",
             "torch", "fan_in"),
        Role("filter's last Linear / filter_out (fan_in 4 / 64: sd x sqrt(fan_in))",
             r"model" + L + HYENA_FILTER + r"6\.weight", MIX + r"filter_out/kernel", "torch",
             "fan_in"),
        Role("filter's Linear biases (zeroed)", r"model" + L + HYENA_FILTER + r"[024]\.bias",
             MIX + r"filter_(in|hidden/\d+)/bias", "zero", own_differs=True),
        Role("long_conv.bias / bias (kept: randn)", r"model" + L + r"long_conv\.bias",
             MIX + r"bias", "kept"),
        Role("Sin freq (kept: ones, w 1)", r"model" + L + HYENA_FILTER + r"1\.freq",
             MIX + r"freq", "kept"),
        Role("pos_emb z (kept)", r"model" + L + r"long_conv\.filter\.pos_emb\.z", MIX + r"z",
             "kept"),
        Role("short_filter Conv1d weight, bias (torch's draw; ours: none, scaffold mad "
             "builtin_conv 0)", r"model" + L + r"short_filter\.(weight|bias)", None, "kept"),
    ] + SWIGLU + HEAD + [NORMS],
}
# The AutoEncoder: every Linear N(0, 0.02), the layers' own draws overridden.
AE_LINEARS = {
    "gla": (r"encoder" + L + r"([qkvgo]_proj|gk_proj\.[01])\.weight",
            MIX + r"(query|key|value|output_gate|out|alpha_down|alpha_up)/kernel"),
    "hyena": (r"encoder" + L + r"((in|out)_proj|" + HYENA_FILTER + r"[0246])\.weight",
              MIX + r"(in_proj|out_proj|filter_in|filter_hidden/\d+|filter_out)/kernel"),
}
AE_BIASES = {
    "gla": (r"encoder" + L + r"gk_proj\.1\.bias", MIX + r"alpha_up/bias"),
    "hyena": (r"encoder" + L + r"((in|out)_proj|" + HYENA_FILTER + r"[024])\.bias",
              MIX + r"(in_proj|out_proj|filter_in|filter_hidden/\d+)/bias"),
}
for _mixer in ("gla", "hyena"):
    ROLES[f"compression/{_mixer}"] = [EMBED] + [
        Role("every mixer Linear weight N(0, 0.02) (the layer's own draw overridden)",
             AE_LINEARS[_mixer][0], AE_LINEARS[_mixer][1], "normal", own_differs=True),
        Role("mixer Linear biases (zeroed)", AE_BIASES[_mixer][0], AE_BIASES[_mixer][1],
             "zero", own_differs=_mixer == "hyena"),
        Role("SwiGLU w1, w2, w3 / MLP fc1, fc2 kernels N(0, 0.02)",
             r"encoder" + C + r"w[123]\.weight", r"mlp/fc[12]/kernel", "normal",
             own_differs=True),
        Role("decoder Linears / dec_fc1, dec_fc2 kernels N(0, 0.02)",
             r"decoder\.[14]\.weight", r"dec_fc[12]/kernel", "normal"),
        Role("decoder biases / dec_fc1, dec_fc2 biases (zeroed)", r"decoder\.[14]\.bias",
             r"dec_fc[12]/bias", "zero"),
        Role("unembed.1.weight / lm_head kernel N(0, 0.02)", r"unembed\.1\.weight",
             r"lm_head/kernel", "normal"),
        HEAD[1],
    ] + ([
        Role("long_conv.bias / bias (kept: randn)", r"encoder" + L + r"long_conv\.bias",
             MIX + r"bias", "kept"),
        Role("pos_emb z (kept)", r"encoder" + L + r"long_conv\.filter\.pos_emb\.z",
             MIX + r"z", "kept"),
    ] if _mixer == "hyena" else []) + [NORMS._replace(
        mad=r".*(\d\.0|unembed\.0|decoder\.[03]|g_norm)\.weight",
        ours=r"(norm|mixer_norm|mlp_norm|dec_norm\d|unembed_norm|norm_scale)(/scale)?")]
# (compression/gla's norms include GLA's g_norm / norm_scale; ours' LayerNorm biases, zero,
# have no counterpart in mad-lab's RMSNorm and are left out.)


class Summary(NamedTuple):
    n: int
    mean: float
    sd: float
    ratio: float  # max |w| / the law's bound (nan: no bound)


def fans(shape, torch_layout: bool) -> tuple[int, int]:
    """(fan_in, fan_out) of a Linear weight: torch's (out, in), ours (in, out)."""
    return (shape[1], shape[0]) if torch_layout else (shape[0], shape[1])


def factor(scale: str, shape, torch_layout: bool) -> float:
    if scale == "raw":
        return 1.0
    fan_in, fan_out = fans(shape, torch_layout)
    return math.sqrt(fan_in) if scale == "fan_in" else math.sqrt((fan_in + fan_out) / 2)


def bound(law: str, shape, torch_layout: bool) -> float:
    if law not in ("torch", "xavier"):
        return math.nan
    fan_in, fan_out = fans(shape, torch_layout)
    return (1 / math.sqrt(fan_in) if law == "torch"
            else GAIN * math.sqrt(6 / (fan_in + fan_out)))


def pool(tensors, role: Role, torch_layout: bool) -> Summary | None:
    """tensors: [(shape, n, sum, sum of squares, max |w|)] of a role's parameters."""
    if not tensors:
        return None
    n = s = sq = 0.0
    ratio = math.nan
    for shape, tn, ts, tsq, tmax in tensors:
        c = factor(role.scale, shape, torch_layout)
        n, s, sq = n + tn, s + c * ts, sq + c * c * tsq
        b = bound(role.law, shape, torch_layout)
        if not math.isnan(b):
            ratio = max(tmax / b, 0.0 if math.isnan(ratio) else ratio)
    mean = s / n
    return Summary(int(n), mean, math.sqrt(max(sq / n - mean * mean, 0.0)), ratio)


def summarize(x: np.ndarray, ratio: float = math.nan) -> Summary:
    x = np.asarray(x, np.float64).ravel()
    return Summary(x.size, float(x.mean()), float(x.std()), ratio)


def agrees(a: Summary, b: Summary) -> bool:
    """scripts/zoology_init/compare.py's test on (n, mean, sd), and a uniform law's bound
    held on both sides."""
    sd = max(a.sd, b.sd)
    if sd == 0:
        same = abs(a.mean - b.mean) < 1e-12
    else:
        tol_sd = 5 * sd / np.sqrt(2 * min(a.n, b.n)) + 0.05 * sd
        tol_mean = 5 * sd / np.sqrt(min(a.n, b.n)) + 0.05 * sd
        same = abs(a.sd - b.sd) <= tol_sd and abs(a.mean - b.mean) <= tol_mean
    within = all(math.isnan(r) or r <= 1 + 1e-6 for r in (a.ratio, b.ratio))
    return same and within


def task_and_mixer(row: str) -> tuple[str, str]:
    return ("compression", row.split("/")[1]) if "/" in row else ("in_context_recall", row)


def ours(row: str, seeds, init: str = "mad") -> tuple[dict[str, list], bool]:
    """{our parameter path: [(shape, n, sum, sum sq, max |w|) per seed]}, head tied."""
    from flax import nnx

    import lra.tasks
    from configs import mad, scaffold
    from lra.training import model as model_lib

    task, mixer = task_and_mixer(row)
    out: dict[str, list] = {}
    tied = True
    for seed in seeds:
        config = mad.get_config(f"task={task},model={mixer}")
        config.random_seed = seed
        config.scaffold.init = init
        config = scaffold.resolve(config)
        model = model_lib.build_model(config, lra.tasks.get(config.task).with_options(
            **config.task_options.to_dict()))
        tied &= getattr(model, "lm_head", None) is None
        for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param)):
            x = np.asarray(v[...], np.float64)
            out.setdefault("/".join(map(str, path)), []).append(
                (x.shape, x.size, x.sum(), (x * x).sum(), np.abs(x).max()))
    return out, tied


def select(params: dict[str, list], pattern: str | None, *, theirs: bool) -> list:
    if pattern is None:
        return []
    hit = ((lambda k: re.fullmatch(pattern, k)) if theirs
           else (lambda k: re.search(pattern + "$", k)))
    return [t for k, ts in params.items() if hit(k) for t in ts]


def fmt(s: Summary | None, what: str) -> str:
    if s is None:
        return "-"
    return {"sd": f"{s.sd:.4f}", "mean": f"{s.mean:+.4f}",
            "ratio": "" if math.isnan(s.ratio) else f"{s.ratio:.3f}"}[what]


def main() -> int:
    with open(os.path.join(CMP_DIR, "mad_init.json"), encoding="utf-8") as f:
        theirs = json.load(f)
    seeds = range(theirs["seeds"])
    bad = 0
    print(f"mad-lab {theirs['commit'][:7]} (torch {theirs['torch']}) beside ours "
          f"(init mad; control: init own), {len(seeds)} seeds each\n")
    print("| row | role (mad-lab / ours) | mad-lab sd | ours sd | mad-lab mean | ours mean "
          "| max/bound (mad-lab / ours) | agree | control: own sd (max/bound) | control |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row, roles in ROLES.items():
        t = {k: [(tuple(e["shape"]), *s) for s in e["seeds"]]
             for k, e in theirs["rows"][row]["params"].items()}
        o, tied = ours(row, seeds)
        own, _ = ours(row, seeds, init="own")
        for role in roles:
            a = pool(select(t, role.mad, theirs=True), role, True)
            b = pool(select(o, role.ours, theirs=False), role, False)
            c = pool(select(own, role.ours, theirs=False), role, False)
            cells = [fmt(a, "sd"), fmt(b, "sd"), fmt(a, "mean"), fmt(b, "mean")]
            ratios = f"{fmt(a, 'ratio')} / {fmt(b, 'ratio')}" if role.law in (
                "torch", "xavier") else ""
            if role.mad is None or role.ours is None:  # one side only: shown
                if (a if role.ours is None else b) is None:
                    verdict, control = "MISSING", ""
                    bad += 1
                else:
                    verdict, control = "not compared", ""
            elif a is None or b is None:
                verdict, control = "MISSING", ""
                bad += 1
            else:
                ok = agrees(a, b)
                bad += not ok
                verdict = "yes" if ok else "NO"
                control_ok = agrees(a, c)
                if role.own_differs:
                    bad += control_ok
                    control = ("yes (cannot fail: FAIL)" if control_ok else "NO (as it must)")
                else:
                    control = "yes (own draws it so too)" if control_ok else "NO"
            own_cell = ""
            if control:
                own_cell = fmt(c, "sd") + (f" ({fmt(c, 'ratio')})" if ratios else "")
            print(f"| {row} | {role.label} | {' | '.join(cells)} | {ratios} | {verdict} | "
                  f"{own_cell} | {control} |")
        their_tied = theirs["rows"][row].get("tied_head", False)
        bad += tied != their_tied
        print(f"| {row} | head tied to the embedding | {their_tied} | {tied} | | | | "
              f"{'yes' if tied == their_tied else 'NO'} | | |")
    print(f"\n{bad} check(s) failed" if bad else "\nevery role agrees; every control that "
          "must read NO does")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    sys.exit(main())
