"""The originals' side of the moba comparison (results/cpu/moba_vs_original.md): loads
$CMP_DIR/moba_inputs.npz (written by moba_ours.py), runs the original code from the
verbatim copies moba_setup.sh made in $CMP_DIR/moba_src/, and saves outputs, gradients and
the chosen blocks, converted to our layouts, to $CMP_DIR/moba_orig.npz. Run with the torch
venv (torch, einops, transformers 4.48.3):

    nice -n 10 /tmp/torchvenv/bin/python scripts/fla_comparison/moba_orig.py

Originals (all executed from their files' text, unchanged unless "f64" says otherwise):
- MoonshotAI/MoBA: `moba_attn_varlen_naive` (moba/moba_naive.py, plain torch: the
  reference), `moba_attn_varlen` (moba/moba_efficient.py, flash-attn), and the layer as
  MoBA ships it: the package `moba` imported as is, `register_moba(MoBAConfig(bs, k))`
  (ALL_ATTENTION_FUNCTIONS["moba_naive"] = moba_layer (moba/wrapper.py) + the naive op),
  run inside transformers 4.48.3's own `LlamaAttention` class (q/k/v/o_proj, RoPE; a
  LlamaConfig with attention_bias=True, _attn_implementation "moba_naive").
- fla: class `MoBA` (fla/layers/moba.py) and its op `parallel_moba` (fla/ops/moba/parallel.py,
  flash-attn), the files executed as modules of a stand-in `fla` package.

Stand-ins (plain torch; nothing here has a GPU, Triton or flash_attn):
- flash_attn: `_flash_attn_varlen_forward` (softmax(q k^T scale) v per segment of
  cu_seqlens_q / cu_seqlens_k, causal = key j <= query i + Lk - Lq, also the log-sum-exp
  H x T), `_flash_attn_varlen_backward` (flash-attn's formulas from the given out and lse:
  P = exp(s - lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO o)), dQ = scale dS K,
  dK = scale dS^T Q), `flash_attn_varlen_func` (the forward, autograd through torch). Two
  call conventions: fla's (flash-attn >= 2.7: forward returns (out, lse, S, rng)) and
  moba_efficient's (flash-attn 2.6.3, MoBA's requirements.txt: (out, q, k, v, out_padded,
  lse, S, rng)). `flash_attn_func` (decoding only) raises.
- triton: a stub so that fla/ops/utils/index.py imports (autotune / jit: the function
  unchanged; cdiv(a, b) = (a + b - 1) // b, triton's definition); fla.utils: tensor_cache =
  the function itself (no cache), autotune_cache_kwargs = {}.
- fla.modules: `RotaryEmbedding` (its class text from fla/modules/rotary.py, executed; its
  Triton `rotary_embedding` replaced by fla's own `rotary_embedding_ref` on the cached
  cos/sin rows 0..T-1) and `RMSNorm` (class text from fla/modules/layernorm.py; Triton
  `rms_norm` replaced by fla's own `rms_norm_ref`).

Cores of fla's layer: "naive" = parallel_moba replaced by MoonshotAI's naive op (the same
arguments: q[0], k[0], v[0], cu_seqlens, max_seqlen, chunk_size, topk), "parallel" = fla's
parallel_moba itself on the stand-ins. Two module swaps on fla's layer instance, so that it
is the layer ours is: o_norm -> nn.Identity (fla's RMSNorm of each head's output, which
ours does not have) and o_proj -> nn.Linear with a bias (our out.bias; fla: bias=False);
the DIFFERENCE rows keep fla's o_norm (weight 1, eps 1e-6).

dtypes: "f32" the code as it is. "f64" the same text with the float32 casts read as float64:
moba_naive `torch.float32` x5; moba_efficient `torch.float32` x3 and `.float()` x1;
parallel.py `torch.float32` x1 and `.float()` x2 (counted, asserted); the modules .double().
Rotary tables are made in float32 and cast to the input's dtype, as transformers and fla do.

Layouts: ours q/k/v BxHxLxK (op), the originals packed S x H x K (varlen: the real tokens of
each row, cu_seqlens). Layer weights: flax kernel D_in x D_out -> torch Linear weight
(kernel^T); both originals rotate halves (i, i + K/2) and ours pairs (2i, 2i + 1): their
q_proj / k_proj rows (and biases) are ours permuted within each head (their feature i =
ours 2i, i + K/2 = ours 2i + 1), which maps one rotation onto the other exactly and leaves
q.k and the block gate q.mean(k) unchanged without rotary.
"""
from __future__ import annotations

import __future__
import ast
import functools
import os
import sys
import time
import types

import warnings

import numpy as np
import torch
import torch.nn as nn
from einops import rearrange, repeat

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
SRC = os.path.join(CMP_DIR, "moba_src")
MOBA_SRC = os.path.join(SRC, "MoBA")
FLA_SRC = os.path.join(SRC, "fla")
TDTYPE = {"f32": torch.float32, "f64": torch.float64}
OP_GRADS = ("q", "k", "v")


def t(x, dtype, grad=False):
    return torch.tensor(np.asarray(x), dtype=TDTYPE[dtype], requires_grad=grad)


def npy(x):
    return x.detach().to(torch.float64).numpy()


def read(root, rel):
    with open(os.path.join(root, rel)) as fh:
        return fh.read()


def substitute(src, rel, subs):
    """`src` with each (old, new, expected count) of `subs` replaced (counts asserted)."""
    for old, new, count in subs:
        assert src.count(old) == count, f"{rel}: {src.count(old)} x {old!r}, expected {count}"
        src = src.replace(old, new)
    return src


def module(name, package=False, **attrs):
    m = types.ModuleType(name)
    if package:
        m.__path__ = []
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def exec_file(name, root, rel, subs=()):
    """The file executed as module `name` (its text, with `subs` for the f64 runs)."""
    m = types.ModuleType(name)
    m.__file__ = os.path.join(root, rel)
    src = substitute(read(root, rel), rel, subs)
    exec(compile(src, m.__file__, "exec"), m.__dict__)
    sys.modules[name] = m
    return m


def exec_defs(root, rel, names, ns):
    """The top-level functions / classes `names` of a file, their text verbatim, executed in
    `ns` (compiled with `from __future__ import annotations`, as those files are)."""
    src = read(root, rel)
    nodes = {n.name: n for n in ast.parse(src).body
             if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    code = "\n\n".join(ast.get_source_segment(src, nodes[n]) for n in names)
    exec(compile(code, os.path.join(root, rel), "exec",
                 flags=__future__.annotations.compiler_flag, dont_inherit=True), ns)
    return [ns[n] for n in names]


# ----------------------------------------------------------------------------- stand-ins


def _segments(cu_q, cu_k):
    cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
    return list(zip(cu_q[:-1], cu_q[1:], cu_k[:-1], cu_k[1:]))


def _scores(q, k, scale, causal):
    """H x Lq x Lk logits of one segment (q Lq x H x K, k Lk x H x K), flash-attn's causal
    alignment (bottom right)."""
    s = torch.einsum("ihd,jhd->hij", q, k) * scale
    if causal:
        lq, lk = q.shape[0], k.shape[0]
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None]
        s = s.masked_fill(j > i + lk - lq, float("-inf"))
    return s


def fa_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
               dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    """(out T x H x D, lse H x T) of flash-attn's varlen forward (plain torch)."""
    assert dropout_p == 0.0
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=q.dtype)
    for a, b, c, d in _segments(cu_seqlens_q, cu_seqlens_k):
        if b == a:
            continue
        s = _scores(q[a:b], k[c:d], scale, causal)
        m = torch.logsumexp(s, -1)  # H x Lq
        out[a:b] = torch.einsum("hij,jhd->ihd", torch.exp(s - m[..., None]), v[c:d])
        lse[:, a:b] = m
    return out, lse


def fa_forward_new(*args, **kwargs):
    """flash-attn >= 2.7 `_flash_attn_varlen_forward` (fla's call): out, lse, S, rng."""
    out, lse = fa_forward(*args, **kwargs)
    return out, lse, None, None


def fa_forward_263(*args, **kwargs):
    """flash-attn 2.6.3 `_flash_attn_varlen_forward` (moba_efficient's call):
    out, q, k, v, out_padded, lse, S, rng."""
    out, lse = fa_forward(*args, **kwargs)
    return out, None, None, None, out, lse, None, None


def fa_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
                max_seqlen_q, max_seqlen_k, dropout_p=0.0, softmax_scale=None, causal=False,
                **kwargs):
    """flash-attn's varlen backward (both call conventions): writes dq, dk, dv (made when
    None) from the given out and lse; returns (dq, dk, dv, softmax_d)."""
    assert dropout_p == 0.0
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    dq = torch.zeros_like(q) if dq is None else dq.zero_()
    dk = torch.zeros_like(k) if dk is None else dk.zero_()
    dv = torch.zeros_like(v) if dv is None else dv.zero_()
    delta = (dout * out).sum(-1).t()  # H x T: rowsum(dO o)
    for a, b, c, d in _segments(cu_seqlens_q, cu_seqlens_k):
        if b == a:
            continue
        s = _scores(q[a:b], k[c:d], scale, causal)
        p = torch.exp(s - softmax_lse[:, a:b, None])
        dv[c:d] += torch.einsum("hij,ihd->jhd", p, dout[a:b])
        dp = torch.einsum("ihd,jhd->hij", dout[a:b], v[c:d])
        ds = p * (dp - delta[:, a:b, None])
        dq[a:b] += scale * torch.einsum("hij,jhd->ihd", ds, k[c:d])
        dk[c:d] += scale * torch.einsum("hij,ihd->jhd", ds, q[a:b])
    return dq, dk, dv, delta


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, **kwargs):
    """flash_attn_varlen_func, autograd through torch (the topk <= 1 short cut)."""
    assert dropout_p == 0.0
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    outs = [torch.einsum("hij,jhd->ihd", _scores(q[a:b], k[c:d], scale, causal).softmax(-1),
                         v[c:d]) for a, b, c, d in _segments(cu_seqlens_q, cu_seqlens_k)]
    return torch.cat(outs, 0)


def flash_attn_func(*args, **kwargs):
    raise NotImplementedError("flash_attn_func: decoding only, not run here")


def flash_attn_api(kind):
    """sys.modules' flash_attn in the call convention of `kind` ('new' fla, '263' MoBA)."""
    fwd = fa_forward_new if kind == "new" else fa_forward_263
    module("flash_attn", package=True, flash_attn_varlen_func=flash_attn_varlen_func,
           flash_attn_func=flash_attn_func)
    sys.modules["flash_attn"].flash_attn_interface = module(
        "flash_attn.flash_attn_interface", _flash_attn_varlen_forward=fwd,
        _flash_attn_varlen_backward=fa_backward)


def triton_stub():
    def decorator(*args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda fn: fn
    tl = module("triton.language", constexpr=object)
    module("triton", autotune=decorator, jit=decorator, heuristics=decorator,
           Config=lambda *a, **k: None, cdiv=lambda a, b: (a + b - 1) // b, language=tl)


# ----------------------------------------------------------------------------- originals


class Originals:
    """The original code, loaded once: MoonshotAI's package and files, fla's files."""

    def __init__(self):
        # transformers first: it probes for triton / flash_attn (find_spec) on import, and
        # must find the real state (absent), not the stubs below.
        import transformers.modeling_utils  # noqa: F401
        import transformers.models.llama.modeling_llama  # noqa: F401
        triton_stub()
        # MoonshotAI/MoBA: the package as is (its efficient file imports flash_attn 2.6.3).
        flash_attn_api("263")
        sys.path.insert(0, MOBA_SRC)
        import moba  # noqa: E402  (MoonshotAI/MoBA's package, verbatim)
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        self.moba, self.attention_functions = moba, ALL_ATTENTION_FUNCTIONS
        assert moba.moba_naive.__file__.startswith(MOBA_SRC), moba.moba_naive.__file__
        self.naive = {"f32": moba.moba_attn_varlen_naive,
                      "f64": exec_file("moba_naive_f64", MOBA_SRC, "moba/moba_naive.py",
                                       [("torch.float32", "torch.float64", 5)])
                      .moba_attn_varlen_naive}
        self.efficient = {"f32": moba.moba_attn_varlen,
                          "f64": exec_file("moba_efficient_f64", MOBA_SRC,
                                           "moba/moba_efficient.py",
                                           [("torch.float32", "torch.float64", 3),
                                            (".float()", ".double()", 1)]).moba_attn_varlen}
        # fla: a stand-in package around its files.
        flash_attn_api("new")
        module("fla", package=True)
        module("fla.utils", tensor_cache=lambda fn: fn, autotune_cache_kwargs={})
        for pkg in ("fla.ops", "fla.ops.utils", "fla.layers", "fla.ops.moba"):
            module(pkg, package=True)
        exec_file("fla.ops.utils.index", FLA_SRC, "fla/ops/utils/index.py")
        self.parallel = {
            "f32": exec_file("fla.ops.moba.parallel", FLA_SRC, "fla/ops/moba/parallel.py")
            .parallel_moba,
            "f64": exec_file("fla_parallel_f64", FLA_SRC, "fla/ops/moba/parallel.py",
                             [("torch.float32", "torch.float64", 1),
                              (".float()", ".double()", 2)]).parallel_moba}
        sys.modules["fla.ops.moba"].parallel_moba = self.parallel["f32"]
        exec_file("fla.layers.utils", FLA_SRC, "fla/layers/utils.py")
        module("fla.modules", package=True, RotaryEmbedding=self._rotary_class(),
               RMSNorm=self._rmsnorm_class(), FusedRMSNormGated=None)
        self.fla_layer = exec_file("fla.layers.moba", FLA_SRC, "fla/layers/moba.py")

    @staticmethod
    def _rotary_class():
        ns = {"torch": torch, "nn": nn, "rearrange": rearrange, "repeat": repeat}
        rotate_half, ref = exec_defs(FLA_SRC, "fla/modules/rotary.py",
                                     ["rotate_half", "rotary_embedding_ref"], ns)

        def rotary_embedding(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                             cu_seqlens=None, max_seqlen=None, chunk_indices=None):
            """fla's Triton rotary_embedding for offset 0 and no cu_seqlens: its reference."""
            assert isinstance(seqlen_offsets, int) and seqlen_offsets == 0
            assert cu_seqlens is None
            T = x.shape[1]
            return ref(x, cos[:T], sin[:T], interleaved)
        ns["rotary_embedding"] = rotary_embedding
        (cls,) = exec_defs(FLA_SRC, "fla/modules/rotary.py", ["RotaryEmbedding"], ns)
        return cls

    @staticmethod
    def _rmsnorm_class():
        ns = {"torch": torch, "nn": nn}
        (ref,) = exec_defs(FLA_SRC, "fla/modules/layernorm.py", ["rms_norm_ref"], ns)

        def rms_norm(x, weight, bias, residual=None, eps=1e-5, prenorm=False,
                     residual_in_fp32=False):
            """fla's Triton rms_norm: its reference (no residual here)."""
            assert residual is None and not prenorm
            return ref(x, weight, bias, eps=eps)
        ns["rms_norm"] = rms_norm
        (cls,) = exec_defs(FLA_SRC, "fla/modules/layernorm.py", ["RMSNorm"], ns)
        return cls

    def naive_as_parallel(self, dtype):
        """MoonshotAI's naive op with parallel_moba's signature (fla's layer's call)."""
        naive = self.naive[dtype]

        def parallel_moba(q, k, v, cu_seqlens, max_seqlen, chunk_size, topk):
            return naive(q.squeeze(0), k.squeeze(0), v.squeeze(0), cu_seqlens, max_seqlen,
                         chunk_size, topk).unsqueeze(0)
        return parallel_moba


# ----------------------------------------------------------------------------- op level


def pack(x, lengths):
    """BxHxLxK -> S x H x K: the real tokens of each row, row after row."""
    return torch.cat([x[b, :, :n].transpose(0, 1) for b, n in enumerate(lengths)], 0)


def unpack(y, lengths, length):
    """S x H x K -> BxHxLxK, 0 on the padded positions."""
    rows, start = [], 0
    for n in lengths:
        r = y[start:start + n].transpose(0, 1)
        rows.append(torch.nn.functional.pad(r, (0, 0, 0, length - n)))
        start += n
    return torch.stack(rows, 0)


def op_call(orig, impl, dtype, q, k, v, cu, max_len, bs, top_k):
    if impl == "naive":
        return orig.naive[dtype](q, k, v, cu, max_len, bs, top_k)
    if impl == "efficient":
        return orig.efficient[dtype](q, k, v, cu, max_len, bs, top_k)
    return orig.parallel[dtype](q[None], k[None], v[None], cu, max_len, bs, top_k)[0]


def run_op(orig, inp, out, case, top_k, impl, dtype, tag=None, call_top_k=None):
    p = f"op/{case}/"
    lengths = [int(n) for n in inp[p + "lengths"]]
    bs = int(inp[p + "block_size"])
    length = inp[p + "q"].shape[2]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    args = [t(inp[p + a], dtype, grad=True) for a in OP_GRADS]
    q, k, v = (pack(a, lengths) for a in args)
    o = unpack(op_call(orig, impl, dtype, q, k, v, cu, max(lengths), bs,
                       call_top_k or top_k), lengths, length)
    torch.sum(t(inp[p + "w_o"], dtype) * o).backward()
    key = f"{p}k{top_k}/{tag or impl}/{dtype}/"
    out[key + "o"] = npy(o)
    for a, x in zip(OP_GRADS, args):
        out[key + "grad_" + a] = npy(x.grad)


def probe_chosen(orig, inp, out, case, top_k, impl, dtype):
    """Which blocks each query reads, from the op's own output: v = the one-hot of each
    key's block (K >= the number of blocks), so o[i, h, n] is the attention mass query i
    puts on block n: > 0 exactly where block n is read (every read block has a key the
    query sees; exp never underflows at these sizes). B x H x L x N bool, ours' N."""
    p = f"op/{case}/"
    lengths = [int(n) for n in inp[p + "lengths"]]
    bs = int(inp[p + "block_size"])
    _, heads, length, dim = inp[p + "q"].shape
    n_blocks = -(-length // bs)
    assert n_blocks <= dim
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32)
    q, k = (pack(t(inp[p + a], dtype), lengths) for a in ("q", "k"))
    onehot = torch.nn.functional.one_hot(torch.arange(length) // bs, dim).to(TDTYPE[dtype])
    v = pack(onehot[None, None].expand(len(lengths), heads, length, dim), lengths)
    with torch.no_grad():
        mass = unpack(op_call(orig, impl, dtype, q, k, v.contiguous(), cu, max(lengths), bs,
                              top_k), lengths, length)
    out[f"{p}k{top_k}/{impl}/{dtype}/chosen"] = (mass[..., :n_blocks] > 0).numpy()


# ----------------------------------------------------------------------------- layer


def head_perm(heads, head_dim):
    """Rows of the originals' q_proj / k_proj (rotate_half) from our kernel's columns
    (pairs): their feature i of a head is ours 2i, their i + K/2 ours 2i + 1."""
    half = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(heads)[:, None] * head_dim + half[None]).reshape(-1)


# ours -> the originals' parameter (both name their Linear layers alike)
PARAM_MAP = {"query.kernel": "q_proj.weight", "query.bias": "q_proj.bias",
             "key.kernel": "k_proj.weight", "key.bias": "k_proj.bias",
             "value.kernel": "v_proj.weight", "value.bias": "v_proj.bias",
             "out.kernel": "o_proj.weight", "out.bias": "o_proj.bias"}


def load_weights(module_, inp, heads, head_dim, permute=True):
    """Our weights into the module's q/k/v/o_proj; returns {ours: (param, undo)} to map
    each gradient back to our layout."""
    pre = "layer/param/"
    names = {k[len(pre):] for k in inp if k.startswith(pre)}
    assert names == set(PARAM_MAP), f"parameters without a counterpart: {names}"
    params = dict(module_.named_parameters())
    back = {}
    for ours, theirs in PARAM_MAP.items():
        w = inp[pre + ours]
        kernel = ours.endswith("kernel")
        w = w.T if kernel else w  # torch Linear weight = kernel^T
        rows = (head_perm(heads, head_dim) if permute and ours.split(".")[0] in ("query", "key")
                else np.arange(w.shape[0]))
        param = params[theirs]
        with torch.no_grad():
            param.copy_(torch.tensor(w[rows], dtype=param.dtype))

        def undo(g, rows=rows, kernel=kernel):
            full = np.zeros_like(g)
            full[rows] = g
            return full.T if kernel else full
        back[ours] = (param, undo)
    return back


def llama_attention(orig, dtype, bs, top_k, config_kw):
    """transformers' LlamaAttention with MoBA's registration (register_moba, verbatim for
    f32; its one line with the f64 naive op for f64)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    cfg = orig.moba.MoBAConfig(bs, top_k)
    if dtype == "f32":
        orig.moba.register_moba(cfg)
    else:  # register_moba's line, with the float64 reading of the naive op
        orig.attention_functions["moba_naive"] = functools.partial(
            orig.moba.wrapper.moba_layer, orig.naive["f64"], cfg)
    config = LlamaConfig(attention_bias=True, attention_dropout=0.0, rope_theta=10000.0,
                         **config_kw)
    config._attn_implementation = "moba_naive"
    attn = LlamaAttention(config, layer_idx=0).eval().to(TDTYPE[dtype])
    return attn, LlamaRotaryEmbedding(config)


def run_layer_llama(orig, inp, out, case, variant, dtype, tag=None, permute=True,
                    top_k_delta=0):
    """Ours (variant: rotary or not) against MoBA's LLaMA attention; without rotary the
    position embeddings are cos 1, sin 0 (LlamaAttention always applies them)."""
    p = f"layer/{case}/"
    length, bs, top_k = (int(a) for a in inp[p + "config"])
    dim, heads = 32, 2
    head_dim = dim // heads
    attn, rope = llama_attention(orig, dtype, bs, top_k + top_k_delta,
                                 dict(hidden_size=dim, num_attention_heads=heads,
                                      num_key_value_heads=heads, max_position_embeddings=length))
    back = load_weights(attn, inp, heads, head_dim, permute)
    x = t(inp[p + "x"], dtype, grad=True)
    if variant.endswith("rope"):
        pos = torch.arange(length)[None].expand(x.shape[0], length)
        cos, sin = rope(x, pos)
    else:
        cos = torch.ones(x.shape[0], length, head_dim, dtype=x.dtype)
        sin = torch.zeros_like(cos)
    y, _ = attn(x, position_embeddings=(cos, sin), attention_mask=None)
    torch.sum(t(inp[p + "w_y"], dtype) * y).backward()
    save_layer(out, f"{p}{tag or 'llama'}/{variant}/{dtype}/", y, x, back)


def run_layer_fla(orig, inp, out, case, core, dtype, padded=False, tag=None, keep_norm=False,
                  top_k_delta=0):
    """fla's class MoBA (qkv_bias=True) with o_norm -> Identity and o_proj with a bias
    (keep_norm: fla's o_norm kept); core 'naive' or 'parallel'; padded: attention_mask."""
    p = f"layer/{case}/"
    length, bs, top_k = (int(a) for a in inp[p + "config"])
    dim, heads = 32, 2
    layer = orig.fla_layer.MoBA(hidden_size=dim, num_heads=heads, qkv_bias=True,
                                moba_chunk_size=bs, moba_topk=top_k + top_k_delta)
    if not keep_norm:
        layer.o_norm = nn.Identity()
    layer.o_proj = nn.Linear(dim, dim, bias=True)
    layer = layer.eval().to(TDTYPE[dtype])
    orig.fla_layer.parallel_moba = (orig.naive_as_parallel(dtype) if core == "naive"
                                    else orig.parallel[dtype])
    back = load_weights(layer, inp, heads, dim // heads)
    x = t(inp[p + "x"], dtype, grad=True)
    mask = torch.tensor(inp[p + "mask"]).long() if padded else None
    y, _, _ = layer(x, attention_mask=mask)
    w_y = inp[p + ("w_y_padded" if padded else "w_y")]
    torch.sum(t(w_y, dtype) * y).backward()
    if padded:
        y = y * mask[..., None]
    key = f"{p}{'padded/' if padded else ''}{tag or 'fla_' + core}/{dtype}/"
    save_layer(out, key, y, x, back)


def save_layer(out, key, y, x, back):
    out[key + "y"], out[key + "grad_x"] = npy(y), npy(x.grad)
    for ours, (param, undo) in back.items():
        out[key + "grad_param/" + ours] = undo(npy(param.grad))


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    # moba_efficient.py and parallel.py call Tensor.index_reduce, which warns that it is beta.
    warnings.filterwarnings("ignore", message="index_reduce\\(\\) is in beta")
    inp = dict(np.load(os.path.join(CMP_DIR, "moba_inputs.npz")))
    orig = Originals()
    out = {}
    cases = sorted({k.split("/")[1] for k in inp if k.startswith("op/")})
    for case in cases:
        for top_k in (int(a) for a in inp[f"op/{case}/top_ks"]):
            for impl in ("naive", "efficient", "parallel"):
                for dtype in ("f32", "f64"):
                    run_op(orig, inp, out, case, top_k, impl, dtype)
            for impl, dtype in (("naive", "f32"), ("naive", "f64"), ("parallel", "f32")):
                probe_chosen(orig, inp, out, case, top_k, impl, dtype)
            # Control: the reference reading one block more per query.
            run_op(orig, inp, out, case, top_k, "naive", "f32", tag="control_topk",
                   call_top_k=top_k + 1)
            if top_k == 1:  # full causal attention: the reference reading every block
                n_blocks = -(-inp[f"op/{case}/q"].shape[2] // int(inp[f"op/{case}/block_size"]))
                run_op(orig, inp, out, case, top_k, "naive", "f64", tag="naive_all_blocks",
                       call_top_k=n_blocks)
            print(f"op {case} top_k {top_k} done ({time.time() - t0:.0f} s)", flush=True)
    for case in sorted({k.split("/")[1] for k in inp
                        if k.startswith("layer/") and k.endswith("/config")}):
        for dtype in ("f32", "f64"):
            for variant in ("plain", "rope"):
                run_layer_llama(orig, inp, out, case, variant, dtype)
            for core in ("naive", "parallel"):
                run_layer_fla(orig, inp, out, case, core, dtype)
                run_layer_fla(orig, inp, out, case, core, dtype, padded=True)
        # Controls: q/k rows not permuted (rotary); one block more per query (fla layer).
        run_layer_llama(orig, inp, out, case, "rope", "f32", tag="control_noperm",
                        permute=False)
        run_layer_fla(orig, inp, out, case, "naive", "f32", tag="control_topk", top_k_delta=1)
        # fla's layer as it is (o_norm kept): not our layer.
        run_layer_fla(orig, inp, out, case, "naive", "f32", tag="fla_with_o_norm",
                      keep_norm=True)
        print(f"layer {case} done ({time.time() - t0:.0f} s)", flush=True)
    import transformers
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/transformers_version"] = np.array(transformers.__version__)
    out["meta/moba_commit"] = np.array(read(MOBA_SRC, "COMMIT").strip())
    out["meta/fla_commit"] = np.array(read(FLA_SRC, "COMMIT").strip())
    np.savez(os.path.join(CMP_DIR, "moba_orig.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, transformers "
          f"{transformers.__version__}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
