"""PaTH attention (`path`; Yang et al. 2025, "PaTH Attention: Position Encoding via
Accumulating Householder Transformations"): softmax attention whose position encoding is
a data-dependent product of Householder-like transforms between query and key,

    logit_ij = q_i^T (H_i H_{i-1} ... H_{j+1}) k_j / sqrt(d),   H_s = I - beta_s w_s w_s^T

with w_s L2-normalised and beta_s = 2 sigmoid(.) in (0, 2) (negative eigenvalues allowed),
one (w, beta) per head and position; H = I everywhere is softmax attention. As fla's
`PaTHAttention` (fla/layers/path_attn.py at bc3b101) with its defaults: bias-free q/k/v/o
projections, w from a low-rank projection (D -> 32 -> D) through a 3-tap short convolution
and SiLU then L2-normalised per head, beta = 2 sigmoid(W_b x + b), no qk norm, no forget
gate (`forget_gate=True` adds fla's use_forget_gate: FoX's c_i - c_j on the logits before
their 1/sqrt(d) scale, as fla's PaTH does, where FoX adds it after), no
position embedding (pos_emb 'none': the transforms are the positions).

The logits two ways (hparam `impl`). `scan` (path_logits), as fla's decoding does it: a
running copy of every key, each new position s applying H_s to the keys before it
(k~ <- k~ - beta_s (k~ . w_s) w_s) and appending its own key untransformed, so at query i,
k~_j = H_i ... H_{j+1} k_j; a scan over the L positions (chunks of `chunk_size` steps
rematerialised in the backward pass). `chunked` (path_logits_chunked, the default): the
products split at chunk boundaries, each chunk's inside in closed form (the UT transform
PaTH's kernels use: one C x C triangular solve per chunk), L / C sequential steps, the
products between chunks as K x K matmuls; the same logits up to rounding
(tests/models/test_path.py). The layer's forward + backward (width 64, 2 heads, one CPU
core, 2026-12-06, when a chunk's inside was still a scan over its C positions): 684 -> 323
ms at L 128 batch 64, 2,539 -> 688 ms at L 256, 5,048 -> 867 ms at L 1024 batch 8.
Both O(L^2) logits, the dense form: fla's fused Triton kernels are not ported.
attention_impl='flash' (impl chunked; the config argument every task config takes): the
same chunk products with the query moved through them one key chunk at a time inside an
online softmax and a custom backward, O(L) memory (models/attention/path_flash.py; with
causal=False the mirror's call merged by log-sum-exp); tested equal to the dense form.
Padded positions transform nothing (beta = 0) and are masked as keys. causal=False
(ours) adds the mirror for keys after the query: logit_ij = q_i^T (H_i ... H_{j-1}) k_j,
from the same scan run from the end, one softmax over both.

Decoding: the cache holds the transformed keys, values and the short convolution's last 2
inputs; a step applies the new H to every cached key, as fla's `rank_one_update`. A
prefill's keys come by `impl` too: `path_keys_chunked` (each chunk's keys at its end, then
through the later chunks' products; 0.8 / 3.0 ms at L 512 / 2048, 4 heads of 16, chunks of
16 in closed form, against the position scan's 5.9 / 94 ms, one CPU core beside a training
queue, 2026-12-06) or `path_keys`.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from models import decoding, layers, registry
from models.attention import dense, path_flash
from models.attention.delta import causal_conv, conv_init, l2_normalise

W_RANK = 32  # fla: w_proj = Linear(D, 32) -> Linear(32, D)
CONV_SIZE = 3  # fla: w_conv1d, kernel 3, no bias, SiLU
DEFAULT_CHUNK = 16


def transform(k_BxHxSxK: jax.Array, w_BxHxK: jax.Array, beta_BxH: jax.Array) -> jax.Array:
    """H k for every key: k - beta (k . w) w."""
    return k_BxHxSxK - (beta_BxH[..., None, None] * jnp.einsum("bhsk,bhk->bhs", k_BxHxSxK,
                                                             w_BxHxK)[..., None]
                        * w_BxHxK[:, :, None])


def path_logits(q_BxHxLxK, k_BxHxLxK, w_BxHxLxK, beta_BxHxL, *, chunk_size: int):
    """q_i . H_i ... H_{j+1} k_j for j <= i (BxHxLxL, float32; j > i: 0)."""
    b, h, length, d = k_BxHxLxK.shape
    f32 = jnp.float32
    q, k, w, beta = (t.astype(f32) for t in (q_BxHxLxK, k_BxHxLxK, w_BxHxLxK, beta_BxHxL))
    c = max(1, min(chunk_size, length))
    n = -(-length // c)
    pad = n * c - length
    pad_t = lambda t: jnp.pad(t, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 3))  # noqa: E731
    steps = [jnp.moveaxis(pad_t(t), 2, 0).reshape((n, c) + t.shape[:2] + t.shape[3:])
             for t in (q, k, w, beta)]
    index = jnp.arange(n * c).reshape(n, c)

    def step(keys_BxHxLxK, xs):
        q_i, k_i, w_i, beta_i, i = xs
        keys = transform(keys_BxHxLxK, w_i, beta_i)  # H_i on the keys before i
        keys = jnp.where((jnp.arange(length) == i)[None, None, :, None], k_i[:, :, None], keys)
        return keys, jnp.einsum("bhk,bhsk->bhs", q_i, keys)

    @jax.checkpoint
    def chunk(keys, xs):
        return jax.lax.scan(step, keys, xs)

    _, rows_NxCxBxHxL = jax.lax.scan(chunk, jnp.zeros((b, h, length, d), f32),
                                     (*steps, index))
    rows = rows_NxCxBxHxL.reshape((n * c, b, h, length))[:length]
    return jnp.moveaxis(rows, 0, 2) * jnp.tril(jnp.ones((length, length), f32))


def path_logits_chunked(q_BxHxLxK, k_BxHxLxK, w_BxHxLxK, beta_BxHxL, *, chunk_size: int):
    """path_logits by chunks of C positions: L / C sequential steps instead of L, the
    products between chunks applied as K x K matrices (matmuls).

    Split H_i ... H_{j+1} at the chunk boundaries: for i in chunk t and j in an earlier chunk
    u, q_i^T (H_i ... H_{tC}) M_tu (H_{uC+C-1} ... H_{j+1}) k_j, with M_tu = P_{t-1} ... P_{u+1}
    and P_t = H_{tC+C-1} ... H_{tC} a chunk's whole product. `_inside_chunks` gives, for
    every chunk at once and in closed form, the keys k'_j = (H_{uC+C-1} ... H_{j+1}) k_j,
    the queries q'_i = (H_i ... H_{tC})^T q_i, P_t and the logits inside a chunk; a scan
    over the chunks carries every earlier chunk's keys through P_t: O(L^2 K^2 / C) for the
    products between chunks, the dense form's O(L^2 K) at C = K. Same values as
    `path_logits` up to rounding."""
    b, h, length, d = k_BxHxLxK.shape
    f32 = jnp.float32
    c, n, keys_out, prod_out, intra_BxHxNxCxC, q_out_NxBxHxCxK = _inside_chunks(
        q_BxHxLxK, k_BxHxLxK, w_BxHxLxK, beta_BxHxL, chunk_size)

    def across(carried_BxHxNxCxK, xs):
        q_t, keys_t, prod_t, t = xs
        rows = jnp.einsum("bhck,bhnjk->bhcnj", q_t, carried_BxHxNxCxK)  # chunks before t
        carried = jnp.einsum("bhkl,bhnjl->bhnjk", prod_t, carried_BxHxNxCxK)
        carried = jnp.where((jnp.arange(n) == t)[:, None, None], keys_t[:, :, None], carried)
        return carried, rows

    _, inter_NxBxHxCxNxC = jax.lax.scan(
        jax.checkpoint(across), jnp.zeros((b, h, n, c, d), f32),
        (q_out_NxBxHxCxK, jnp.moveaxis(keys_out, 2, 0), jnp.moveaxis(prod_out, 2, 0),
         jnp.arange(n)))
    inter = jnp.moveaxis(inter_NxBxHxCxNxC, 0, 2)  # BxHx(N t)xCx(N u)xC
    t_idx, u_idx = jnp.arange(n)[:, None, None, None], jnp.arange(n)[None, None, :, None]
    full = (jnp.where(u_idx < t_idx, inter, 0.0)
            + jnp.where(u_idx == t_idx, intra_BxHxNxCxC[:, :, :, :, None, :], 0.0))
    full = full.reshape(b, h, n * c, n * c)[:, :, :length, :length]
    return full * jnp.tril(jnp.ones((length, length), f32))


def path_keys_chunked(k_BxHxLxK, w_BxHxLxK, beta_BxHxL, *, chunk_size: int) -> jax.Array:
    """H_L ... H_{j+1} k_j for every j (BxHxLxK, float32): the keys as a query after the
    last position sees them (the decoding cache after a prefill; the running copy of
    `path_logits` at its end). By chunks: each chunk's keys at its end (`_inside_chunks`),
    then through every later chunk's product, P_{N-1} ... P_{u+1}, from a scan that runs
    from the last chunk back (a K x K product per chunk)."""
    b, h, length, d = k_BxHxLxK.shape
    c, n, keys_out, prod_out, _, _ = _inside_chunks(
        jnp.zeros_like(k_BxHxLxK), k_BxHxLxK, w_BxHxLxK, beta_BxHxL, chunk_size)

    def back(later_BxHxKxK, xs):  # later: P_{N-1} ... P_{t+1}
        keys_t, prod_t = xs
        return (jnp.einsum("bhkl,bhlm->bhkm", later_BxHxKxK, prod_t),
                jnp.einsum("bhkl,bhcl->bhck", later_BxHxKxK, keys_t))

    eye = jnp.broadcast_to(jnp.eye(d, dtype=jnp.float32), (b, h, d, d))
    _, keys_NxBxHxCxK = jax.lax.scan(back, eye, (jnp.moveaxis(keys_out, 2, 0),
                                                 jnp.moveaxis(prod_out, 2, 0)), reverse=True)
    keys = jnp.moveaxis(keys_NxBxHxCxK, 0, 2).reshape(b, h, n * c, d)
    return keys[:, :, :length]


def _inside_chunks(q_BxHxLxK, k_BxHxLxK, w_BxHxLxK, beta_BxHxL, chunk_size: int):
    """Every chunk at once, in closed form (path_logits_chunked): the chunk size c, the
    number of chunks n, each chunk's keys at its end BxHxNxCxK, its product BxHxNxKxK, the
    logits inside it BxHxNxCxC (0 above the diagonal) and the queries turned to its start
    NxBxHxCxK.

    The UT transform (PaTH's section 3.2, as the delta rule's chunks): within a chunk,
    H_i ... H_{j+1} = I - sum_{a, b in (j, i]} A_ab w_a w_b^T with A = (I + diag(beta)
    tril(W W^T, -1))^-1 diag(beta), lower triangular, so a window's block of A is its own
    (the diagonal blocks of a triangular inverse are the blocks' inverses). Then

        logits  q_i.k_j - sum_{j < b <= a <= i} (q_i.w_a) A_ab (w_b.k_j)
        keys    k_j - sum_a w_a [A (W K^T masked b > j)]_aj          (H_C ... H_{j+1} k_j)
        queries q_i - sum_b w_b [(Q W^T masked a <= i) A]_ib          ((H_i ... H_1)^T q_i)
        product I - W^T A W                                           (H_C ... H_1)

    with one C x C unit-triangular solve per chunk: O(L (C + K + K^2 / C)) memory per head
    (the last term the chunk products themselves), forward and backward, where a scan over
    the C positions kept a K x K product per position for its backward pass (O(L K^2) per
    head: what made path's flash form 1 GiB per 1K tokens).
    beta = 0 (padded positions) is H = I, with nothing divided by beta."""
    b, h, length, d = k_BxHxLxK.shape
    f32 = jnp.float32
    q, k, w, beta = (t.astype(f32) for t in (q_BxHxLxK, k_BxHxLxK, w_BxHxLxK, beta_BxHxL))
    c = max(1, min(chunk_size, length))
    n = -(-length // c)
    pad = n * c - length  # padded positions: beta 0 (H = I), q = k = 0, cropped at the end
    q, k, w, beta = [jnp.pad(t, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 3)).reshape(
        (b, h, n, c) + t.shape[3:]) for t in (q, k, w, beta)]
    hp = jax.lax.Precision.HIGHEST  # the solve's inputs and products: no TF32 / bf16 passes
    ein = functools.partial(jnp.einsum, precision=hp)
    row, col = jnp.arange(c)[:, None], jnp.arange(c)[None, :]
    strict = (col < row).astype(f32)  # [a, b]: b < a
    eye_c = jnp.eye(c, dtype=f32)
    ww = ein("zhnak,zhnck->zhnac", w, w)
    unit_lower = eye_c + beta[..., :, None] * ww * strict
    a_mat = jax.lax.linalg.triangular_solve(  # (I + diag(beta) L)^-1 diag(beta)
        unit_lower, jnp.broadcast_to(eye_c * beta[..., None, :], unit_lower.shape),
        left_side=True, lower=True, unit_diagonal=True)
    qw = ein("zhnik,zhnak->zhnia", q, w) * (col <= row)  # [i, a]: a <= i
    wk = ein("zhnbk,zhnjk->zhnbj", w, k) * strict  # [b, j]: b > j
    a_wk = ein("zhnab,zhnbj->zhnaj", a_mat, wk)
    qw_a = ein("zhnia,zhnab->zhnib", qw, a_mat)
    intra = (ein("zhnik,zhnjk->zhnij", q, k) - ein("zhnia,zhnaj->zhnij", qw, a_wk)
             ) * (col <= row)
    keys = k - ein("zhnaj,zhnak->zhnjk", a_wk, w)
    q_turned = q - ein("zhnib,zhnbk->zhnik", qw_a, w)
    prod = jnp.eye(d, dtype=f32) - ein("zhnak,zhnab,zhnbl->zhnkl", w, a_mat, w)
    return c, n, keys, prod, intra, jnp.moveaxis(q_turned, 2, 0)


def path_keys(k_BxHxLxK, w_BxHxLxK, beta_BxHxL, *, chunk_size: int) -> jax.Array:
    """path_keys_chunked's keys by the running copy of `path_logits`, one position a step."""
    del chunk_size  # one position a step
    length = k_BxHxLxK.shape[2]

    def apply(keys, xs):  # the keys after every position's transform
        k_i, w_i, beta_i, i = xs
        keys = transform(keys, w_i, beta_i)
        return jnp.where((jnp.arange(length) == i)[None, None, :, None], k_i[:, :, None],
                         keys), None

    keys, _ = jax.lax.scan(apply, jnp.zeros(k_BxHxLxK.shape, jnp.float32),
                           (jnp.moveaxis(k_BxHxLxK.astype(jnp.float32), 2, 0),
                            jnp.moveaxis(w_BxHxLxK.astype(jnp.float32), 2, 0),
                            jnp.moveaxis(beta_BxHxL.astype(jnp.float32), 2, 0),
                            jnp.arange(length)))
    return keys


LOGITS = {"chunked": path_logits_chunked, "scan": path_logits}
KEYS = {"chunked": path_keys_chunked, "scan": path_keys}  # a prefill's cache, by `impl`


class PaTHAttention(dense.MultiHeadAttention):
    """fla's PaTHAttention (module docstring); `query`, `key`, `value`, `out` bias-free."""

    def __init__(self, *, dim: int, num_heads: int, causal: bool, qkv_dim: int | None,
                 attention_dropout: float, conv_size: int, forget_gate: bool,
                 chunk_size: int, impl: str, rngs: nnx.Rngs, attention_impl: str = "dense"):
        if impl not in LOGITS:
            raise ValueError(f"path: impl={impl!r}; choose one of {', '.join(LOGITS)}")
        if attention_impl == "flash" and impl != "chunked":
            raise registry.RegistryError(
                "path: attention_impl='flash' (models/attention/path_flash.py) moves the "
                f"queries through the chunk products; got impl={impl!r} (use impl='chunked', "
                "or attention_impl='dense')")
        super().__init__(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, use_bias=False, rngs=rngs)
        self.impl, self.attention_impl = impl, attention_impl
        width = self.num_heads * self.head_dim
        self.conv_size, self.chunk_size = conv_size, chunk_size
        self.w_down = layers.dense(dim, W_RANK, ("embed", None), use_bias=False, rngs=rngs)
        self.w_up = layers.dense(W_RANK, width, (None, "qkv"), use_bias=False, rngs=rngs)
        self.w_conv = (layers.param(conv_init(conv_size), (None, "qkv"), (conv_size, width),
                                    rngs=rngs) if conv_size else None)
        self.beta = layers.dense(dim, num_heads, ("embed", "heads"), rngs=rngs)
        self.forget = (layers.dense(dim, num_heads, ("embed", "heads"), rngs=rngs)
                       if forget_gate else None)

    def w_raw(self, x_BxLxD: jax.Array) -> jax.Array:
        """The convolution's input BxHxLxK."""
        return self.split_heads(self.w_up(self.w_down(x_BxLxD))).astype(jnp.float32)

    def w_of(self, raw_BxHxLxK: jax.Array) -> jax.Array:
        if self.w_conv is not None:
            kernel = self.w_conv[...].astype(jnp.float32).reshape(self.conv_size,
                                                                   self.num_heads, -1)
            raw_BxHxLxK = causal_conv(raw_BxHxLxK, kernel)
        return l2_normalise(jax.nn.silu(raw_BxHxLxK))

    def gates(self, x_BxLxD: jax.Array, real_BxL: jax.Array):
        """beta BxHxL in (0, 2), 0 where padded; log f BxHxL (0 without the gate)."""
        beta = 2.0 * jax.nn.sigmoid(self.beta(x_BxLxD).astype(jnp.float32))
        beta = jnp.where(real_BxL[..., None], beta, 0.0).transpose(0, 2, 1)
        if self.forget is None:
            return beta, jnp.zeros_like(beta)
        # fla's PaTH-FoX adds the gate before the scale, softmax((q.Hk + c_i - c_j) K^-0.5)
        # (fla/ops/path_attn/naive.py 94-95, its kernels, `do_gate_scale` in decoding),
        # unlike FoX's own layer: scaling log f here gives every form that convention
        # (results/cpu/path_vs_fla.md).
        log_f = (jax.nn.log_sigmoid(self.forget(x_BxLxD).astype(jnp.float32))
                 / math.sqrt(self.head_dim))
        return beta, jnp.where(real_BxL[..., None], log_f, 0.0).transpose(0, 2, 1)

    def __call__(self, x_BxLxD: jax.Array, padding_mask: jax.Array | None = None,
                 deterministic: bool = True) -> jax.Array:
        b, length = x_BxLxD.shape[:2]
        real_BxL = layers.valid_mask(padding_mask, b, length)
        q, k, v = self.project_qkv(x_BxLxD)
        raw = jnp.where(real_BxL[:, None, :, None], self.w_raw(x_BxLxD), 0.0)
        w = self.w_of(raw)
        beta, log_f = self.gates(x_BxLxD, real_BxL)
        if self.attention_impl == "flash":
            o = self._flash(q, k, v, raw, w, beta, jnp.cumsum(log_f, axis=-1), real_BxL,
                            deterministic)
            return self.out(self.merge_heads(o.astype(v.dtype)))
        logits_fn = LOGITS[self.impl]
        logits = logits_fn(q, k, w, beta, chunk_size=self.chunk_size)
        if not self.causal:
            # The mirror: the same scan from the end gives q_i . H_i ... H_{j-1} k_j, j >= i;
            # the reversed scan's convolution reads the later positions (its own order).
            flip = lambda t: jnp.flip(t, axis=2)  # noqa: E731
            w_back = self.w_of(flip(raw))
            back = flip(flip(logits_fn(flip(q), flip(k), w_back, flip(beta),
                                       chunk_size=self.chunk_size)).swapaxes(2, 3)
                        ).swapaxes(2, 3)
            strict_upper = jnp.triu(jnp.ones((length, length), jnp.bool_), 1)
            logits = jnp.where(strict_upper, back, logits)
        c = jnp.cumsum(log_f, axis=-1)
        diff = c[..., :, None] - c[..., None, :]
        logits = logits / math.sqrt(self.head_dim) + (diff if self.causal else -jnp.abs(diff))
        mask = dense.make_attention_mask(padding_mask, causal=self.causal, q_len=length,
                                         kv_len=length)
        o = dense.attend_logits(logits, v, mask=mask, dropout_fn=self.dropout_fn(deterministic))
        return self.out(self.merge_heads(o))

    def _flash(self, q, k, v, raw, w, beta, c_BxHxL, real_BxL, deterministic):
        """attention_impl='flash' (models/attention/path_flash.py): j <= i, and with
        causal=False the mirror's j > i over the reversed sequence, merged by lse."""
        rate = 0.0 if deterministic else self.attention_dropout.rate
        seed = self.dropout_seed() if rate > 0 else None

        def attend(q, k, v, w, beta, real, c, **kw):
            _, _, keys, prod, intra, q_turned = _inside_chunks(q, k, w, beta, self.chunk_size)
            return path_flash.flash_path_attention(
                q_turned, keys, prod, intra, v, real, c, scale=1.0 / math.sqrt(self.head_dim),
                dropout_rate=rate, **kw)

        o, lse = attend(q, k, v, w, beta, real_BxL, c_BxHxL, dropout_seed=seed)
        if self.causal:
            return o
        flip = lambda t: jnp.flip(t, axis=2)  # noqa: E731
        o_b, lse_b = attend(flip(q), flip(k), flip(v), self.w_of(flip(raw)), flip(beta),
                            jnp.flip(real_BxL, axis=1), -flip(c_BxHxL), strict=True,
                            dropout_seed=None if seed is None else seed + 1)
        return path_flash.merge(o, lse, flip(o_b), flip(lse_b))

    # ------------------------------------------------------------------ decoding

    def init_cache(self, batch: int, max_len: int) -> decoding.Cache:
        decoding.require_causal(self, "path")
        h, d, w = self.num_heads, self.head_dim, max(self.conv_size - 1, 0)
        zeros = lambda *s: jnp.zeros((batch, h) + s, jnp.float32)  # noqa: E731
        return {"pos": jnp.zeros((batch,), jnp.int32), "k": zeros(max_len, d),
                "v": zeros(max_len, d), "c": zeros(max_len), "c_now": zeros(),
                "w_window": zeros(w, d)}

    def prefill(self, cache: decoding.Cache, x_BxLxD: jax.Array,
                padding_mask: jax.Array | None) -> tuple[jax.Array, decoding.Cache]:
        """The parallel outputs, and the keys as the last real position sees them (the
        padded positions' beta is 0: H = I after the row's end)."""
        decoding.require_causal(self, "path")
        b, length = x_BxLxD.shape[:2]
        y = self(x_BxLxD, padding_mask=padding_mask, deterministic=True)
        real_BxL = layers.valid_mask(padding_mask, b, length)
        _, k, v = self.project_qkv(x_BxLxD)
        raw = jnp.where(real_BxL[:, None, :, None], self.w_raw(x_BxLxD), 0.0)
        w = self.w_of(raw)
        beta, log_f = self.gates(x_BxLxD, real_BxL)
        keys = KEYS[self.impl](k, w, beta, chunk_size=self.chunk_size)
        keys = jnp.where(real_BxL[:, None, :, None], keys, 0.0)
        lengths_B = decoding.lengths_of(padding_mask, b, length)
        nw = max(self.conv_size - 1, 0)
        index = (lengths_B[:, None] + jnp.arange(nw)[None])[:, None, :, None]
        window = jnp.take_along_axis(jnp.pad(raw, ((0, 0), (0, 0), (nw, 0), (0, 0))), index,
                                     axis=2)
        c = jnp.cumsum(log_f, axis=-1)
        put = lambda buf, t: jax.lax.dynamic_update_slice(  # noqa: E731
            buf, t.astype(jnp.float32), (0,) * buf.ndim)
        return y, {"pos": lengths_B, "k": put(cache["k"], keys),
                   "v": put(cache["v"], jnp.where(real_BxL[:, None, :, None], v, 0.0)),
                   "c": put(cache["c"], c), "c_now": c[..., -1], "w_window": window}

    def step(self, cache: decoding.Cache, x_BxD: jax.Array) -> tuple[jax.Array, decoding.Cache]:
        decoding.require_causal(self, "path")
        pos_B = cache["pos"]
        x_Bx1xD = x_BxD[:, None]
        q, k, v = (self.split_heads(p(x_Bx1xD)) for p in (self.query, self.key, self.value))
        raw_BxHx1xK = self.w_raw(x_Bx1xD)
        window = jnp.concatenate([cache["w_window"], raw_BxHx1xK], axis=2)
        w = self.w_of(window)[:, :, -1]
        beta, log_f = self.gates(x_Bx1xD, jnp.ones((x_BxD.shape[0], 1), jnp.bool_))
        beta, log_f = beta[..., 0], log_f[..., 0]
        write = lambda buf, t: decoding.write_row(  # noqa: E731
            jnp.moveaxis(buf, 2, 1), pos_B, t).swapaxes(1, 2)
        keys = write(transform(cache["k"], w, beta), k[:, :, 0].astype(jnp.float32))
        values = write(cache["v"], v[:, :, 0].astype(jnp.float32))
        c_now = cache["c_now"] + log_f
        c = write(cache["c"], c_now)
        logits = (jnp.einsum("bhk,bhsk->bhs", q[:, :, 0].astype(jnp.float32), keys)
                  / math.sqrt(self.head_dim) + c_now[..., None] - c)
        seen = (jnp.arange(keys.shape[2])[None] <= pos_B[:, None])[:, None, None]
        o = dense.attend_logits(logits[:, :, None], values.astype(x_BxD.dtype), mask=seen)
        y = self.out(self.merge_heads(o))[:, 0]
        return y, {"pos": pos_B + 1, "k": keys, "v": values, "c": c, "c_now": c_now,
                   "w_window": window[:, :, 1:]}


@registry.register("path", capabilities=registry.Capabilities(
    description="PaTH: softmax attention with data-dependent Householder products between "
                "query and key as positions (Yang et al. 2025); causal=False mirrors them",
    causal=True, decode="kv_cache", padding=True, variable_length=True,
    test_hparams={"chunk_size": 4}, pos_emb="none", short_conv_hparam="conv_size",
    rotary_refusal="its Householder products between query and key are its positions"))
def build_path(*, dim: int, num_heads: int, max_len: int, causal: bool, rngs: nnx.Rngs,
               qkv_dim: int | None = None, attention_dropout: float = 0.1,
               conv_size: int = CONV_SIZE, forget_gate: bool = False,
               chunk_size: int = DEFAULT_CHUNK, impl: str = "chunked",
               attention_impl: str = "dense") -> PaTHAttention:
    """fla's PaTHAttention defaults: low-rank w (32) through a 3-tap convolution, beta in
    (0, 2), no forget gate, no qk norm, no biases but beta's. impl: how the logits are
    formed, `chunked` (path_logits_chunked) or `scan` (path_logits, one position a step).
    attention_impl: 'dense' (those logits, then a softmax) or 'flash' (impl chunked: the
    O(L)-memory form of models/attention/path_flash.py)."""
    del max_len  # any length
    if attention_impl not in ("dense", "flash"):
        raise registry.RegistryError(
            f"path: attention_impl={attention_impl!r} is not available; use 'dense' or "
            "'flash' (its logits are transformed per query, so the block-sparse forms do "
            "not apply)")
    return PaTHAttention(dim=dim, num_heads=num_heads, causal=causal, qkv_dim=qkv_dim,
                         attention_dropout=attention_dropout, conv_size=conv_size,
                         forget_gate=forget_gate, chunk_size=chunk_size, impl=impl,
                         rngs=rngs, attention_impl=attention_impl)
