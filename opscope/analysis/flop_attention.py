"""FLOPs of attention, ``softmax(q @ k^T) @ v``, from the shapes of q, k and v.

These are opscope's own formulas, not torch's registry: they give torch 2.13+'s
numbers on every torch version, grouped-query shapes included.

>>> attention_flops([1, 1, 2, 4], [1, 1, 3, 4], [1, 1, 3, 4])  # 2 * 2 * 3 * (4 + 4)
96
"""

from __future__ import annotations

from typing import Optional

# The fused kernels behind aten::scaled_dot_product_attention (each has a _backward op).
ATTENTION_KERNELS = ("_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_flash_attention_for_cpu",
                     "_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_cudnn_attention",
                     "_scaled_dot_product_fused_attention_overrideable")


# opscope's own formulas, not torch's registry: torch 2.4 to 2.12 assert that the
# query and key have as many heads, so a grouped-query call (``enable_gqa``, fewer key
# and value heads) got no count. Every query head attends over the keys of its group,
# so both formulas use the query's head count, as torch 2.13+ does.
def _attention_dims(q, k, v) -> Optional[tuple]:
    """(batch * query heads, s_q, s_k, d_qk, d_v) of a [b, h, s, d] attention, or None."""
    if any(s is None or len(s) != 4 for s in (q, k, v)):
        return None
    (b, h_q, s_q, d_q), (b_k, h_k, s_k, d_k), (b_v, h_v, s_v, d_v) = q, k, v
    if not (b == b_k == b_v and h_k == h_v and s_k == s_v and d_q == d_k):
        raise ValueError(f"attention shapes do not fit: q={q} k={k} v={v}")
    if h_k <= 0 or h_q % h_k != 0:
        raise ValueError(f"query heads {h_q} are not a multiple of key heads {h_k}")
    return b * h_q, s_q, s_k, d_q, d_v


def attention_flops(q, k, v) -> Optional[int]:
    """Forward FLOPs of ``softmax(q @ k^T) @ v`` on [batch, heads, seq, dim] shapes.

    Two matrix products per query head: scores (s_q x d x s_k) and output
    (s_q x s_k x d_v), 2 FLOPs per multiply-add. Key/value heads may be fewer than
    query heads (grouped-query attention).

    >>> attention_flops([2, 4, 6, 8], [2, 2, 7, 8], [2, 2, 7, 8])  # 2*8*6*7*(8+8)
    10752
    """
    dims = _attention_dims(q, k, v)
    if dims is None:
        return None
    bh, s_q, s_k, d_qk, d_v = dims
    return 2 * bh * s_q * s_k * (d_qk + d_v)


def attention_backward_flops(grad_out, q, k, v) -> Optional[int]:
    """Backward FLOPs of attention: the scores recomputed, then the gradients of the
    scores, of v, of q and of k: five products, three over d_qk and two over d_v.

    >>> attention_backward_flops([2, 4, 6, 8], [2, 4, 6, 8], [2, 2, 7, 8], [2, 2, 7, 8])
    26880
    """
    dims = _attention_dims(q, k, v)
    if dims is None or grad_out is None or len(grad_out) != 4:
        return None
    bh, s_q, s_k, d_qk, d_v = dims
    if list(grad_out) != [q[0], q[1], s_q, d_v]:
        raise ValueError(f"attention gradient shape {grad_out} does not fit q={q} v={v}")
    return 2 * bh * s_q * s_k * (3 * d_qk + 2 * d_v)
