"""fla's side of the nsa comparison (results/cpu/nsa_vs_fla.md): loads
$CMP_DIR/nsa_inputs.npz (written by nsa_ours.py), runs flash-linear-attention's naive_nsa
(fla/ops/nsa/naive.py, the verbatim copy made by nsa_setup.sh) and a plain-torch re-write
of fla's NativeSparseAttention forward around it, and saves outputs, gradients and the
chosen blocks, converted to our layouts, to $CMP_DIR/nsa_fla.npz. Run with the torch venv:

    /tmp/torchvenv/bin/python scripts/fla_comparison/nsa_fla.py

naive.py imports Triton (mean_pooling) and flash_attn, neither of which runs here: its four
functions (naive_nsa_selection, naive_nsa_compression, naive_nsa_topk, naive_nsa) are
executed from its source verbatim, with two plain-torch stand-ins in their globals:
- mean_pooling: fla/ops/utils/pooling.py's kernel, a block's sum / min(BS, T - i BS);
- flash_attn_func(q, k, v, causal=True, window_size=(W - 1, 0)): softmax(q k^T K^-1/2)
  over keys i - W + 1 <= j <= i, query head h reading kv head h // (HQ / H) (GQA);
  flash_attn_varlen_func: the same per sequence of cu_seqlens; prepare_chunk_offsets
  (fla/ops/utils/index.py, imports Triton) re-typed in torch.
The layer runs naive_nsa where fla's runs parallel_nsa (Triton): the same rules (its topk
kernel sums the group's probabilities where naive averages them: the same order).

dtypes: "f32" runs fla's code as it is (naive_nsa_selection and _compression cast to
float32). "f64" is a float64 reference: the same source with `.float()` read as
`.double()` (its only casts); fla's rotary tables stay float32-computed, as fla makes them.

fla layouts: q BxTxHQxK, k/v BxTxHxK, gates BxTxHQ, block_indices BxTxHxS; ours q BxHQxLxK,
k/v BxHxLxK, gates BxHQxL, indices BxHxLxS. Layer weights: ours flax kernels D_in x D_out
(torch Linear weight = kernel^T). Rotary: fla rotates halves (i, i + K/2), ours pairs
(2i, 2i + 1): fla's q_proj / k_proj rows are ours permuted within each head (fla feature
i = ours 2i, i + K/2 = ours 2i + 1), which maps one rotation onto the other exactly.
"""
from __future__ import annotations

import ast
import os
import sys
import time
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange, repeat

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kda_fla import FLA_SRC, _read, npy, t  # noqa: E402

CMP_DIR = os.environ.get("CMP_DIR", "/tmp/fla_cmp")
OP_GRADS = ("q", "k", "v", "g_cmp", "g_slc", "g_swa")
ROPE_THETA = 10000.0  # NativeSparseAttention's rope_theta default


# ----------------------------------------------------------------------------- fla source


def mean_pooling(x, chunk_size, cu_seqlens=None, **kwargs):
    """fla/ops/utils/pooling.py mean_pooling_fwd_kernel in torch: block i of x BxTxHxD is
    sum(x[i BS : (i + 1) BS]) / min(BS, T - i BS); varlen (cu_seqlens, B = 1): each
    sequence's blocks in turn."""
    if cu_seqlens is not None:
        return torch.cat([mean_pooling(x[:, a:b], chunk_size)
                          for a, b in zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())], 1)
    T = x.shape[1]
    return torch.stack([x[:, i:i + chunk_size].sum(1) / min(chunk_size, T - i)
                        for i in range(0, T, chunk_size)], dim=1)


def prepare_chunk_offsets(cu_seqlens, chunk_size):
    """fla/ops/utils/index.py: F.pad(cdiv(lens, chunk_size), (1, 0)).cumsum(-1)."""
    return F.pad(-(-torch.diff(cu_seqlens) // chunk_size), (1, 0), value=0).cumsum(-1)


def flash_attn_func(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None):
    """flash_attn_func's semantics for the call in naive_nsa: causal, window (left, 0),
    GQA (kv head h // G), scale K^-1/2 by default."""
    assert causal and window_size[1] == 0
    G = q.shape[2] // k.shape[2]
    k, v = (x.repeat_interleave(G, dim=2) for x in (k, v))
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    i = torch.arange(q.shape[1])[:, None]
    j = torch.arange(k.shape[1])[None]
    s = s.masked_fill(~((j <= i) & (j >= i - window_size[0])), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           causal=False, window_size=(-1, -1), softmax_scale=None):
    """flash_attn_varlen_func: flash_attn_func per sequence of the packed q, k, v (TxHxK)."""
    assert torch.equal(cu_seqlens_q, cu_seqlens_k)
    bounds = zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist())
    return torch.cat([flash_attn_func(q[None, a:b], k[None, a:b], v[None, a:b], causal,
                                      window_size, softmax_scale)[0] for a, b in bounds], 0)


def load_functions(rel, names, ns, f64=False, casts=None):
    """The functions `names` of fla's file `rel`, their source verbatim (f64: `.float()`
    read as `.double()`, `casts` occurrences expected), executed in `ns`."""
    src = _read(rel)
    nodes = {n.name: n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)}
    code = "\n\n".join(ast.get_source_segment(src, nodes[n]) for n in names)
    if f64:
        assert code.count(".float()") == casts, f"{rel} changed: recheck the f64 substitution"
        code = code.replace(".float()", ".double()")
    exec(compile(code, rel, "exec"), ns)
    return [ns[n] for n in names]


def load_naive(dtype):
    ns = {"torch": torch, "repeat": repeat, "warnings": warnings,
          "mean_pooling": mean_pooling, "flash_attn_func": flash_attn_func,
          "flash_attn_varlen_func": flash_attn_varlen_func,
          "prepare_chunk_offsets": prepare_chunk_offsets}
    (naive_nsa,) = load_functions(
        "fla/ops/nsa/naive.py", ["naive_nsa_selection", "naive_nsa_compression",
                                 "naive_nsa_topk", "naive_nsa"],
        ns, f64=dtype == "f64", casts=2)[-1:]
    return naive_nsa


def fla_rotary(q, k):
    """RotaryEmbedding(dim=K, base=rope_theta).forward(q, k, seqlen_offset=0,
    max_seqlen=T): fla's cos/sin tables (float32, then q's dtype) and rotary_embedding_ref
    (fla/modules/rotary.py, executed verbatim) in place of the Triton kernel."""
    rotate_half, ref = load_functions("fla/modules/rotary.py",
                                      ["rotate_half", "rotary_embedding_ref"],
                                      {"torch": torch, "repeat": repeat, "rearrange": rearrange})
    dim, T = q.shape[-1], q.shape[1]
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    cos, sin = torch.cos(freqs).to(q.dtype), torch.sin(freqs).to(q.dtype)
    return ref(q, cos, sin, False), ref(k, cos, sin, False)


# ----------------------------------------------------------------------------- op level


def to_fla(x):
    return x.transpose(1, 2)  # BxHxL... <-> BxLxH...


def run_op(inp, out, case, mode, dtype, tag=None, counts=None):
    p = f"op/{case}/"
    bs, s, w = (int(a) for a in inp[p + "config"])
    args = [t(inp[p + a], dtype, grad=True) for a in OP_GRADS]
    q, k, v, g_cmp, g_slc, g_swa = (to_fla(a) for a in args)
    idx = (torch.tensor(inp[p + "block_idx"], dtype=torch.long).transpose(1, 2)
           if mode == "given" else None)
    naive_nsa = load_naive(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "block_indices is provided, overriding ..."
        o, chosen = naive_nsa(q, k, v, g_cmp, g_slc, g_swa, block_indices=idx,
                              block_counts=counts or s, block_size=bs, window_size=w,
                              return_block_indices=True)
    o = to_fla(o)
    torch.sum(t(inp[p + "w_o"], dtype) * o).backward()
    key = f"{p}{tag or mode}/{dtype}/"
    out[key + "o"] = npy(o)
    out[key + "block_idx"] = chosen.transpose(1, 2).numpy()
    for a, x in zip(OP_GRADS, args):
        out[key + "grad_" + a] = npy(x.grad)


# ----------------------------------------------------------------------------- layer


def head_perm(heads, head_dim):
    """Rows of fla's q_proj / k_proj weight from our kernel's columns: fla feature i of a
    head is ours 2i, feature i + K/2 ours 2i + 1."""
    half = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(heads)[:, None] * head_dim + half[None]).reshape(-1)


def layer_params(inp, case, dtype):
    """fla's weights (torch tensors with grad) and how each maps back to ours."""
    dim, heads, kv, head_dim, *_ = (int(a) for a in inp[f"layer/{case}/config"])
    pre = f"layer/{case}/param/"
    names = {k[len(pre):] for k in inp if k.startswith(pre)}
    assert names == {"query.kernel", "key.kernel", "value.kernel", "gate.kernel",
                     "out.kernel"}, f"parameters without an fla counterpart: {names}"
    perm = {"query.kernel": head_perm(heads, head_dim), "key.kernel": head_perm(kv, head_dim)}
    fla_name = {"query.kernel": "q_proj.weight", "key.kernel": "k_proj.weight",
                "value.kernel": "v_proj.weight", "gate.kernel": "g_proj.weight",
                "out.kernel": "o_proj.weight"}
    P, back = {}, {}
    for ours, name in fla_name.items():
        w = inp[pre + ours].T  # torch Linear weight = kernel^T
        rows = perm.get(ours, np.arange(w.shape[0]))
        P[name] = t(w[rows], dtype, grad=True)

        def undo(g, rows=rows):
            full = np.zeros_like(g)
            full[rows] = g
            return full.T
        back[ours] = (name, undo)
    return P, back, head_dim


def unpad(x, indices):
    """fla.layers.utils.unpad_input(..., keepdim=True) for one tensor: its real tokens
    packed into 1 x total x ... (index_first_axis)."""
    return rearrange(x, "b s ... -> (b s) ...")[indices].unsqueeze(0)


def pad_input(x, indices, batch, length):
    """fla.layers.utils.pad_input: the packed tokens back in place, 0 elsewhere."""
    y = x.new_zeros(batch * length, *x.shape[1:])
    y[indices] = x
    return y.reshape(batch, length, *x.shape[1:])


def fla_layer_forward(P, x, head_dim, dtype, block_size, block_counts, window_size,
                      attention_mask=None):
    """fla/layers/nsa.py NativeSparseAttention.forward, no cache, no cu_seqlens argument
    (qkv_bias False), line by line, with parallel_nsa (Triton) replaced by naive_nsa and
    unpad_input / pad_input by their plain-torch equivalents above."""
    naive_nsa = load_naive(dtype)
    batch_size, q_len, _ = x.shape
    q = rearrange(F.linear(x, P["q_proj.weight"]), '... (h d) -> ... h d', d=head_dim)
    k = rearrange(F.linear(x, P["k_proj.weight"]), '... (h d) -> ... h d', d=head_dim)
    v = rearrange(F.linear(x, P["v_proj.weight"]), '... (h d) -> ... h d', d=head_dim)
    g = rearrange(F.linear(x, P["g_proj.weight"]), '... (h d) -> ... h d', d=3)
    q, k = fla_rotary(q, k)  # seqlen_offset 0: positions 0..T-1 of the padded rows
    nsa = dict(block_size=block_size, block_counts=block_counts, window_size=window_size)
    if attention_mask is not None:
        indices = torch.nonzero(attention_mask.flatten(), as_tuple=False).flatten()
        cu_seqlens = F.pad(attention_mask.sum(-1).cumsum(0), (1, 0)).long()
        q, g, k, v = (unpad(a, indices) for a in (q, g, k, v))
        g_cmp, g_slc, g_swa = g.sigmoid().unbind(-1)
        o = naive_nsa(q=q, k=k, v=v, g_cmp=g_cmp, g_slc=g_slc, g_swa=g_swa,
                      cu_seqlens=cu_seqlens, **nsa).squeeze(0)
        o = pad_input(o, indices, batch_size, q_len)
    else:
        g_cmp, g_slc, g_swa = g.sigmoid().unbind(-1)
        o = naive_nsa(q=q, k=k, v=v, g_cmp=g_cmp, g_slc=g_slc, g_swa=g_swa, **nsa)
    o = o.reshape(batch_size, q_len, -1)
    return F.linear(o, P["o_proj.weight"])


def run_layer(inp, out, case, dtype, tag=None, counts=None, padded=False):
    _, _, _, _, bs, s, w = (int(a) for a in inp[f"layer/{case}/config"])
    P, back, head_dim = layer_params(inp, case, dtype)
    x = t(inp[f"layer/{case}/x"], dtype, grad=True)
    mask = torch.tensor(inp[f"layer/{case}/mask"]) if padded else None
    y = fla_layer_forward(P, x, head_dim, dtype, bs, counts or s, w, attention_mask=mask)
    torch.sum(t(inp[f"layer/{case}/w_y"], dtype) * y).backward()
    key = f"layer/{case}/{'padded/' if padded else ''}{tag or 'naive'}/{dtype}/"
    out[key + "y"], out[key + "grad_x"] = npy(y), npy(x.grad)
    for ours, (name, undo) in back.items():
        out[key + "grad_param/" + ours] = undo(npy(P[name].grad))


def main():
    t0 = time.time()
    torch.set_num_threads(1)
    inp = dict(np.load(os.path.join(CMP_DIR, "nsa_inputs.npz")))
    with open(os.path.join(FLA_SRC, "COMMIT")) as fh:
        commit = fh.read().strip()
    out = {}
    for case in sorted({k.split("/")[1] for k in inp if k.startswith("op/")}):
        for mode in ("given", "chosen"):
            for dtype in ("f32", "f64"):
                run_op(inp, out, case, mode, dtype)
        # Control: two blocks fewer chosen per query.
        s = int(inp[f"op/{case}/config"][1])
        run_op(inp, out, case, "chosen", "f32", tag="control_counts", counts=s - 2)
    for case in sorted({k.split("/")[1] for k in inp if k.startswith("layer/")}):
        for dtype in ("f32", "f64"):
            run_layer(inp, out, case, dtype)
            run_layer(inp, out, case, dtype, padded=True)
        s = int(inp[f"layer/{case}/config"][5])
        run_layer(inp, out, case, "f32", tag="control_counts", counts=s - 2)
    out["meta/torch_version"] = np.array(torch.__version__)
    out["meta/fla_commit"] = np.array(commit)
    np.savez(os.path.join(CMP_DIR, "nsa_fla.npz"), **out)
    print(f"saved {len(out)} results to {CMP_DIR} (torch {torch.__version__}, "
          f"fla {commit}, {time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
