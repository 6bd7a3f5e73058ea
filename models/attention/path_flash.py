"""PaTH attention in O(L) memory: `path`'s attention_impl='flash' (models/attention/path.py).

path_logits_chunked splits the transform between query i (chunk t) and key j (chunk u < t)
at the chunk boundaries,

    logit_ij = q'_i . (P_{t-1} ... P_{u+1} k'_j),

with q'_i the query turned to its chunk's start, k'_j the key carried to its chunk's end and
P_s the K x K product of chunk s (all from path._inside_chunks), and carries every earlier
chunk's keys through each P: the L x L logits, then a softmax. Here the query moves instead
(PaTH's FlashAttention-style form, Yang et al. 2025, section 3.3, without its fused UT
kernel): for query chunk t, r_{t-1} = q'_t and r_{u-1} = r_u P_u, so logit(t, u) = r_u
k'_u^T, one C x C tile at a time, folded into an online softmax (FlashAttention-2) as u
runs from t - 1 down to 0; the chunk's own tile is path's intra-chunk logits. Nothing of
size L x L exists, forward or backward: the backward pass (a custom VJP) keeps only the
output and each row's log-sum-exp; per query chunk it recomputes the r_u (C x K each,
O(L K) for one chunk at a time), then walks u upwards accumulating dr_u (the chain's
cotangent: dr_{u+1} += dr_u P_{u+1}^T, dP_{u+1} += r_{u+1}^T dr_u) with the tiles'
gradients, as FlashAttention-2's backward does for q, k and v. Compute stays O(L^2 (C + K)
K / C), the chunked form's.

The forget gate (`forget_gate=True`, FoX's c_i - c_j) is added per tile, its gradient
summed per row and column; attention dropout is the counter-based hash of the chunked
softmax (models/kernels/block_sparse_tiles.dropout_multiplier, per (batch * heads + head,
query, key)), the normaliser over the undropped weights. The output comes with each row's
log-sum-exp (differentiable too), so the bidirectional layer (causal=False) runs this
twice, forward over j <= i and over the reversed sequence for j > i (its mirror chain,
strict: the diagonal is the forward call's; its dropout under seed + 1), and merges the
two by their lse: one softmax over both, as path's dense mirror.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from models.kernels.block_sparse_tiles import dropout_multiplier


def flash_path_attention(q_NxBxHxCxK: jax.Array, keys_BxHxNxCxK: jax.Array,
                         prod_BxHxNxKxK: jax.Array, intra_BxHxNxCxC: jax.Array,
                         v_BxHxLxD: jax.Array, valid_BxL: jax.Array, c_BxHxL: jax.Array, *,
                         scale: float, dropout_rate: float = 0.0,
                         dropout_seed: jax.Array | None = None, strict: bool = False
                         ) -> tuple[jax.Array, jax.Array]:
    """softmax over j <= i (j < i with `strict`) of (logit_ij * scale + c_i - c_j)
    [dropout] @ v, from path._inside_chunks' outputs (queries turned, keys carried, chunk
    products, intra-chunk logits), keys masked by valid_BxL: (o BxHxLxD float32, lse BxHxL:
    each row's log-sum-exp, -inf for a row without a key, whose o is 0). Two calls over
    disjoint keys merge by their lse (merge); both outputs are differentiable."""
    n, b, h, c, _ = q_NxBxHxCxK.shape
    length, d_v = v_BxHxLxD.shape[2], v_BxHxLxD.shape[3]
    pad = n * c - length
    chunk = lambda t, fill=0: jnp.pad(  # noqa: E731  BxHxL... -> BxHxNxC...
        t, [(0, 0), (0, 0), (0, pad)] + [(0, 0)] * (t.ndim - 3), constant_values=fill
    ).reshape((t.shape[0], t.shape[1], n, c) + t.shape[3:])
    v = chunk(v_BxHxLxD.astype(jnp.float32))
    valid = chunk(valid_BxL[:, None].astype(jnp.bool_), False)[:, 0]  # BxNxC
    cf = chunk(c_BxHxL.astype(jnp.float32))
    seed = jnp.zeros((), jnp.int32) if dropout_seed is None else jnp.asarray(dropout_seed,
                                                                             jnp.int32)
    o, lse = _attention(_Config(float(scale), float(dropout_rate), bool(strict)),
                        jnp.moveaxis(q_NxBxHxCxK.astype(jnp.float32), 0, 2),
                        keys_BxHxNxCxK.astype(jnp.float32),
                        prod_BxHxNxKxK.astype(jnp.float32),
                        intra_BxHxNxCxC.astype(jnp.float32), v, cf, valid, seed)
    return (o.reshape(b, h, n * c, d_v)[:, :, :length],
            lse.reshape(b, h, n * c)[:, :, :length])


def merge(o_a: jax.Array, lse_a: jax.Array, o_b: jax.Array, lse_b: jax.Array) -> jax.Array:
    """One softmax over the keys of two flash_path_attention calls (disjoint key sets):
    each output weighted by its share of the rows' total exp(lse); 0 for a row with none."""
    m = jnp.maximum(lse_a, lse_b)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w_a, w_b = jnp.exp(lse_a - m), jnp.exp(lse_b - m)
    total = w_a + w_b
    return (o_a * w_a[..., None] + o_b * w_b[..., None]) / jnp.where(total > 0, total,
                                                                     1.0)[..., None]


class _Config:
    """The static part (hashable: the custom VJP's non-differentiable argument)."""

    def __init__(self, scale: float, rate: float, strict: bool):
        self.key = (scale, rate, strict)
        self.scale, self.rate, self.strict = self.key

    def __hash__(self):
        return hash(self.key)

    def __eq__(self, other):
        return isinstance(other, _Config) and self.key == other.key


def _tile(cfg, s_BxHxCxC, t, u, cf, valid, seed, c):
    """(logits with the forget bias, masked to -inf; the mask; the dropout multiplier or
    None) of tile (query chunk t, key chunk u)."""
    b, h = s_BxHxCxC.shape[:2]
    i = t * c + lax.iota(jnp.int32, c)
    j = u * c + lax.iota(jnp.int32, c)
    earlier = (j[None, :] < i[:, None]) if cfg.strict else (j[None, :] <= i[:, None])
    mask = valid[:, u][:, None, None, :] & earlier[None, None]
    s = s_BxHxCxC * cfg.scale + cf[:, :, t][..., :, None] - cf[:, :, u][..., None, :]
    keep = None
    if cfg.rate:
        bh = (lax.broadcasted_iota(jnp.int32, (b, h), 0) * h
              + lax.broadcasted_iota(jnp.int32, (b, h), 1))
        keep = dropout_multiplier(seed, bh[:, :, None, None], i[None, None, :, None],
                                  j[None, None, None, :], cfg.rate)
    return jnp.where(mask, s, -jnp.inf), mask, keep


def _forward(cfg, q, keys, prod, intra, v, cf, valid, seed):
    """(o BxHxNxCxD, lse BxHxNxC; -inf on rows with no key)."""
    b, h, n, c, _ = q.shape

    def query_chunk(t):
        def fold(carry, s, mask, keep, u):
            m, l, acc = carry
            m_new = jnp.maximum(m, s.max(-1))
            m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.where(mask, jnp.exp(s - m_safe[..., None]), 0.0)
            alpha = jnp.exp(m - m_safe)  # 0 while m is -inf
            l = l * alpha + p.sum(-1)
            if keep is not None:
                p = p * keep
            return m_new, l, acc * alpha[..., None] + jnp.einsum("bhij,bhjd->bhid", p,
                                                                 v[:, :, u])

        s, mask, keep = _tile(cfg, intra[:, :, t], t, t, cf, valid, seed, c)
        init = fold((jnp.full((b, h, c), -jnp.inf), jnp.zeros((b, h, c)),
                     jnp.zeros((b, h, c, v.shape[-1]))), s, mask, keep, t)

        def earlier(carry, step):
            u = t - 1 - step

            def tile(carry):
                r, stats = carry
                s, mask, keep = _tile(cfg, jnp.einsum("bhik,bhjk->bhij", r, keys[:, :, u]),
                                      t, u, cf, valid, seed, c)
                return (jnp.einsum("bhik,bhkl->bhil", r, prod[:, :, u]),
                        fold(stats, s, mask, keep, u))

            return lax.cond(u >= 0, tile, lambda c_: c_, carry), None

        (_, (m, l, acc)), _ = lax.scan(earlier, (q[:, :, t], init), jnp.arange(n - 1))
        o = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
        lse = jnp.where(l > 0, m + jnp.log(jnp.where(l > 0, l, 1.0)), -jnp.inf)
        return o, lse

    o_n, lse_n = lax.map(query_chunk, jnp.arange(n))
    return jnp.moveaxis(o_n, 0, 2), jnp.moveaxis(lse_n, 0, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg, q, keys, prod, intra, v, cf, valid, seed):
    return _forward(cfg, q, keys, prod, intra, v, cf, valid, seed)


def _attention_fwd(cfg, q, keys, prod, intra, v, cf, valid, seed):
    o, lse = _forward(cfg, q, keys, prod, intra, v, cf, valid, seed)
    return (o, lse), (q, keys, prod, intra, v, cf, valid, seed, o, lse)


def _attention_bwd(cfg, res, cotangents):
    q, keys, prod, intra, v, cf, valid, seed, o, lse = res
    do, d_lse = cotangents
    b, h, n, c, k_dim = q.shape
    # d logit_ij = p_ij (dp_ij - sum_j' p_ij' dp_ij' + d lse_i): the last two terms per row.
    d_rows = (jnp.einsum("bhnid,bhnid->bhni", do, o)
              - jnp.where(jnp.isfinite(lse), d_lse, 0.0))

    def tile_grads(s_raw, t, u):
        """(p with dropout, ds: d loss / d (scaled, biased) logits) of tile (t, u)."""
        s, mask, keep = _tile(cfg, s_raw, t, u, cf, valid, seed, c)
        p = jnp.where(mask, jnp.exp(s - lse[:, :, t][..., None]), 0.0)
        dp = jnp.einsum("bhid,bhjd->bhij", do[:, :, t], v[:, :, u])
        p_kept = p
        if keep is not None:
            p_kept, dp = p * keep, dp * keep
        return p_kept, p * (dp - d_rows[:, :, t][..., None])

    def query_chunk(acc, t):
        d_keys, d_prod, d_v, d_cf = acc
        # The chunk's own tile: its logits are the intra-chunk ones.
        p, ds = tile_grads(intra[:, :, t], t, t)
        d_intra = ds * cfg.scale
        d_v = d_v.at[:, :, t].add(jnp.einsum("bhij,bhid->bhjd", p, do[:, :, t]))
        d_cf = d_cf.at[:, :, t].add(ds.sum(-1) - ds.sum(-2))
        if n == 1:  # no earlier chunk: no chain
            return (d_keys, d_prod, d_v, d_cf), (jnp.zeros((b, h, c, k_dim)), d_intra)

        # r_u for u = t-1 .. 0 (r[u]; the rest unused): one chunk's O(L K).
        def chain(r, step):  # emits r_u, carries r_{u-1} = r_u P_u
            u = t - 1 - step
            return jnp.where(u >= 0, jnp.einsum("bhik,bhkl->bhil", r,
                                                prod[:, :, jnp.maximum(u, 0)]), r), r

        _, r_steps = lax.scan(chain, q[:, :, t], jnp.arange(n - 1))
        # r_steps[step] = r_{t-1-step}; index by u: r_of(u) = r_steps[t-1-u].
        r_of = lambda u: r_steps[jnp.clip(t - 1 - u, 0, n - 2)]  # noqa: E731

        def upward(carry, u):  # u = 0 .. n-1, live for u < t
            def tile(carry):
                g, d_keys, d_prod, d_v, d_cf = carry
                r_u = r_of(u)
                p, ds = tile_grads(jnp.einsum("bhik,bhjk->bhij", r_u, keys[:, :, u]), t, u)
                d_v = d_v.at[:, :, u].add(jnp.einsum("bhij,bhid->bhjd", p, do[:, :, t]))
                d_keys = d_keys.at[:, :, u].add(
                    cfg.scale * jnp.einsum("bhij,bhik->bhjk", ds, r_u))
                d_cf = d_cf.at[:, :, t].add(ds.sum(-1)).at[:, :, u].add(-ds.sum(-2))
                dr_u = cfg.scale * jnp.einsum("bhij,bhjk->bhik", ds, keys[:, :, u]) + g
                # r_u = r_{u+1} P_{u+1}: the cotangent goes on to r_{u+1}, and to P_{u+1}.
                up = jnp.minimum(u + 1, n - 1)
                d_prod = d_prod.at[:, :, up].add(jnp.where(
                    u + 1 < t, jnp.einsum("bhik,bhil->bhkl", r_of(u + 1), dr_u), 0.0))
                g = jnp.where(u + 1 < t, jnp.einsum("bhil,bhkl->bhik", dr_u,
                                                    prod[:, :, up]), dr_u)
                return g, d_keys, d_prod, d_v, d_cf

            return lax.cond(u < t, tile, lambda c_: c_, carry), None

        init = (jnp.zeros((b, h, c, k_dim)), d_keys, d_prod, d_v, d_cf)
        (g, d_keys, d_prod, d_v, d_cf), _ = lax.scan(upward, init, jnp.arange(n))
        d_q = jnp.where(t > 0, g, 0.0)  # dr_{t-1} = d q'_t
        return (d_keys, d_prod, d_v, d_cf), (d_q, d_intra)

    zeros = (jnp.zeros_like(keys), jnp.zeros_like(prod), jnp.zeros_like(v), jnp.zeros_like(cf))
    (d_keys, d_prod, d_v, d_cf), (d_q, d_intra) = lax.scan(query_chunk, zeros, jnp.arange(n))
    return (jnp.moveaxis(d_q, 0, 2), d_keys, d_prod, jnp.moveaxis(d_intra, 0, 2), d_v, d_cf,
            np.zeros(valid.shape, jax.dtypes.float0), np.zeros(seed.shape, jax.dtypes.float0))


_attention.defvjp(_attention_fwd, _attention_bwd)
