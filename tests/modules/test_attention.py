"""Scaled dot-product and multi-head attention against PyTorch's own implementations."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from aiayn.masks import causal_mask, padding_mask
from aiayn.modules import MultiHeadAttention, attention, scaled_dot_product_attention
from aiayn.modules import dropout as dropout_module
from aiayn.modules.kv_cache import KVCache
from tests.helpers import assert_close, copy_mha, random_mask


@pytest.fixture(params=["fused", "explicit"])
def kernel(request, monkeypatch):
    """Run a test with each path: the threshold on the number of keys forces one or the other."""
    explicit = request.param == "explicit"
    for name in ("EXPLICIT_MAX_KEYS", "EXPLICIT_MAX_KEYS_BF16_TRAINING"):
        monkeypatch.setattr(attention, name, 1 << 30 if explicit else 0)
    monkeypatch.setattr(attention, "EXPLICIT_MIN_SINGLE_QUERIES", 0 if explicit else 1 << 30)
    monkeypatch.setattr(attention, "EXPLICIT_SINGLE_QUERY_KEYS", (0, 1 << 30))
    return request.param


@pytest.mark.parametrize("need_weights", [False, True], ids=["output", "weights"])
def test_sdpa_matches_torch_with_random_masks_and_empty_rows(need_weights, kernel):
    q, k, v = torch.randn(2, 3, 5, 8), torch.randn(2, 3, 7, 8), torch.randn(2, 3, 7, 6)
    mask = random_mask(2, 3, 5, 7, empty_rows=3)
    out, w = scaled_dot_product_attention(q, k, v, mask, need_weights=need_weights)
    assert (w is not None) == need_weights
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    ok = mask.any(-1)  # rows with something to attend to
    name = f"scaled_dot_product_attention[{kernel}, need_weights={need_weights}]"
    assert_close(f"{name} vs F.scaled_dot_product_attention", out[ok], ref[ok])
    assert (out[~ok] == 0).all() and (~ok).sum() == 3
    if need_weights:
        assert (w[~ok] == 0).all()
        torch.testing.assert_close(w[ok].sum(-1), torch.ones(int(ok.sum())))
        assert (w[~mask.expand_as(w)] == 0).all()


def test_sdpa_without_mask_matches_equation():
    q, k, v = torch.randn(4, 5, 16), torch.randn(4, 6, 16), torch.randn(4, 6, 3)
    expected = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(16), dim=-1) @ v
    for need_weights in (False, True):
        out, _ = scaled_dot_product_attention(q, k, v, need_weights=need_weights)
        assert_close("scaled_dot_product_attention vs eq. 1 by hand", out, expected)


@pytest.mark.parametrize("min_row", [8, 16])
def test_short_softmax_rows_are_padded_and_match_torch_softmax(min_row, monkeypatch):
    """Rows shorter than one SIMD vector are padded with −∞ before the softmax (PyTorch's CPU kernel
    is slow on them); values and gradients equal ``torch.softmax``'s, masked entries included."""
    monkeypatch.setattr(attention, "SOFTMAX_MIN_ROW", min_row)
    for n in range(1, min_row + 3):
        x = torch.randn(3, 4, 5, n, dtype=torch.float64)
        if n > 1:
            x[..., 1:, -1] = float("-inf")  # masked keys (every row keeps its first)
        ours_in, ref_in = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours, ref = attention.softmax_last(ours_in), torch.softmax(ref_in, dim=-1)
        assert ours.shape == ref.shape
        assert ours.stride(-2) == max(n, min_row)  # short rows: a view of the padded rows
        torch.testing.assert_close(ours, ref, rtol=0, atol=1e-15)
        grad = torch.randn_like(ref)
        (ours * grad).sum().backward()
        (ref * grad).sum().backward()
        torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=0, atol=1e-14)


def test_short_bf16_softmax_rows_are_padded_to_a_vector_of_bfloat16():
    """A SIMD vector holds twice as many bfloat16 values: rows are padded to 2 × SOFTMAX_MIN_ROW,
    and values and gradients stay those of ``torch.softmax`` in bfloat16."""
    min_row = 2 * attention.SOFTMAX_MIN_ROW
    for n in (3, attention.SOFTMAX_MIN_ROW, min_row - 1, min_row):
        x = torch.randn(2, 3, 4, n).bfloat16()
        x[..., 1:, -1] = float("-inf")
        ours_in, ref_in = x.clone().requires_grad_(), x.clone().requires_grad_()
        ours, ref = attention.softmax_last(ours_in), torch.softmax(ref_in, dim=-1)
        assert ours.dtype == torch.bfloat16 and ours.stride(-2) == max(n, min_row)
        torch.testing.assert_close(ours, ref, rtol=0, atol=2**-8)
        grad = torch.randn_like(ref)
        (ours * grad).sum().backward()
        (ref * grad).sum().backward()
        torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=0.02, atol=2**-7)


def test_tutorial_attention_shapes():
    """Tutorial example: q (1,2,128), k (1,4,128), v (1,4,64) -> weights (1,2,4), output (1,2,64)."""
    q, k, v = torch.randn(1, 2, 128), torch.randn(1, 4, 128), torch.randn(1, 4, 64)
    out, weights = scaled_dot_product_attention(q, k, v, need_weights=True)
    assert weights.shape == (1, 2, 4) and out.shape == (1, 2, 64)


def test_fully_masked_rows_give_zeros_and_finite_gradients_not_nan(kernel):
    """Tutorial pitfall: masked_fill(-inf) then softmax turns a fully padded row into NaN."""
    q = torch.randn(1, 1, 3, 4, requires_grad=True)
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, False]])
    naive = torch.softmax((q @ q.transpose(-2, -1)).masked_fill(~mask, float("-inf")), -1)
    assert torch.isnan(naive).any()  # the pitfall is real
    for need_weights in (False, True):
        out, _ = scaled_dot_product_attention(q, q, q, mask, need_weights=need_weights)
        assert torch.isfinite(out).all() and (out[..., 1, :] == 0).all()
        (grad,) = torch.autograd.grad(out.sum(), q)
        assert torch.isfinite(grad).all()


def _reference_mha(d_model=32, n_heads=4, kdim=None):
    ref = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    ours = MultiHeadAttention(d_model, n_heads)
    copy_mha(ours, ref)
    return ours, ref


@pytest.fixture
def fused_calls(monkeypatch):
    """(calls, the kernel): a list that grows by one at every call of PyTorch's fused attention
    kernel, which is patched in ``F`` itself, and the unpatched kernel, for references."""
    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(
        attention.F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or fused(*a, **kw)
    )
    return calls, fused


def test_short_keys_take_the_explicit_products_on_the_cpu_long_ones_or_one_query_the_kernel(fused_calls):
    calls, fused = fused_calls
    short, long = attention.EXPLICIT_MAX_KEYS, attention.EXPLICIT_MAX_KEYS + 1
    # (queries, keys) -> calls of the fused kernel so far: one query is a decoding step (fused)
    for t_q, t_k, expected in [(4, short, 0), (4, long, 1), (1, short, 2)]:
        q, k = torch.randn(2, 3, t_q, 8), torch.randn(2, 3, t_k, 8)
        out, _ = scaled_dot_product_attention(q, k, k)
        assert_close(f"attention {t_q}×{t_k} vs F.scaled_dot_product_attention", out, fused(q, k, k))
        assert len(calls) == expected


def test_one_query_per_row_takes_the_explicit_products_over_many_rows_and_8_to_256_keys(fused_calls):
    """A decoding step over a batch of beams (batch × heads ≥ EXPLICIT_MIN_SINGLE_QUERIES rows):
    explicit products for 8-256 keys in float32, the fused kernel otherwise; the same output."""
    calls, fused = fused_calls
    many, few = attention.EXPLICIT_MIN_SINGLE_QUERIES, attention.EXPLICIT_MIN_SINGLE_QUERIES - 1
    fewest, most = attention.EXPLICIT_SINGLE_QUERY_KEYS
    # (rows, keys, dtype) -> calls of the fused kernel so far
    f32 = torch.float32
    cases = [(many, fewest, f32, 0), (many, most, f32, 0), (few, fewest, f32, 1), (many, fewest - 1, f32, 2),
             (many, most + 1, f32, 3), (many, fewest, torch.bfloat16, 4)]  # fmt: skip
    for rows, t_k, dtype, expected in cases:
        q = torch.randn(rows, 1, 1, 8, dtype=dtype)  # (B·h as one axis, 1 head, one query, d)
        k, v = torch.randn(rows, 1, t_k, 8, dtype=dtype), torch.randn(rows, 1, t_k, 8, dtype=dtype)
        out, _ = scaled_dot_product_attention(q, k, v)
        assert_close(f"one query, {rows} rows × {t_k} keys ({dtype}) vs the kernel", out.float(),
                     fused(q, k, v).float(), 2e-2 if dtype == torch.bfloat16 else 1e-5)  # fmt: skip
        assert len(calls) == expected


def test_bf16_training_takes_the_explicit_products_up_to_its_own_threshold(fused_calls):
    """With gradients in bfloat16 the fused kernel's backward is slow on the CPU: the explicit
    products run up to EXPLICIT_MAX_KEYS_BF16_TRAINING keys; without gradients, the float32 rule."""
    calls, fused = fused_calls
    within, beyond = attention.EXPLICIT_MAX_KEYS + 1, attention.EXPLICIT_MAX_KEYS_BF16_TRAINING + 1
    # (keys, dtype, gradients) -> calls of the fused kernel so far
    cases = [(within, torch.bfloat16, True, 0), (within, torch.bfloat16, False, 1),
             (within, torch.float32, True, 2), (beyond, torch.bfloat16, True, 3)]  # fmt: skip
    for t_k, dtype, grad, expected in cases:
        q = torch.randn(2, 3, 4, 8, dtype=dtype, requires_grad=grad)
        k = torch.randn(2, 3, t_k, 8, dtype=dtype, requires_grad=grad)
        out, _ = scaled_dot_product_attention(q, k, k)
        assert_close(f"bf16={dtype == torch.bfloat16} grad={grad} attention {t_k} keys vs the kernel",
                     out.float(), fused(q, k, k).float(), 2e-2)  # fmt: skip
        assert len(calls) == expected


@pytest.mark.parametrize("need_weights", [False, True])
def test_self_attention_matches_nn_multihead_attention(need_weights, kernel):
    ours, ref = _reference_mha()
    x = torch.randn(3, 6, 32)
    ids = torch.tensor([[5, 5, 5, 5, 5, 5], [5, 5, 5, 5, 0, 0], [5, 5, 0, 0, 0, 0]])
    mask = padding_mask(ids, 0) & causal_mask(6)  # (3, 1, 6, 6)
    out, w = ours(x, x, x, mask, need_weights=need_weights)
    ref_out, ref_w = ref(x, x, x, key_padding_mask=ids == 0, attn_mask=~causal_mask(6),
                         need_weights=True, average_attn_weights=False)  # fmt: skip
    assert_close("MultiHeadAttention vs nn.MultiheadAttention (self)", out, ref_out)
    if need_weights:
        assert_close("MultiHeadAttention weights vs nn.MultiheadAttention", w, ref_w)


def test_attention_dropout_sits_where_nn_puts_it_and_only_in_training(monkeypatch):
    """``dropout`` (the config's ``attn_dropout``) drops attention weights, after the softmax and before
    ·V, as nn.MultiheadAttention's does. Every mask is made a constant 0.5 on the explicit path, ours
    through the mask function and nn's through ``F.dropout``, so a dropout left out, moved or applied
    at evaluation would differ; the fused kernel's own dropout is random in training and off in eval."""
    ref = nn.MultiheadAttention(32, 4, dropout=0.1, batch_first=True)
    ours = MultiHeadAttention(32, 4, dropout=0.1)
    copy_mha(ours, ref)
    x, ids = torch.randn(3, 6, 32), torch.tensor([[5] * 6, [5] * 4 + [0] * 2, [5] * 2 + [0] * 4])
    mask = padding_mask(ids, 0) & causal_mask(6)
    kw = dict(key_padding_mask=ids == 0, attn_mask=~causal_mask(6), need_weights=True)
    with torch.no_grad():
        plain, _ = ref.eval()(x, x, x, **kw)
        assert_close("attention dropout: off at evaluation", ours.eval()(x, x, x, mask)[0], plain)
        with monkeypatch.context() as m:
            m.setattr(dropout_module, "_scaled_mask", lambda t, p: torch.full_like(t, 0.5))
            real = F.dropout
            m.setattr(F, "dropout", lambda t, p=0.5, training=True, inplace=False: 0.5 * t if training else t)
            halved, _ = ref.train()(x, x, x, **kw)
            out, _ = ours.train()(x, x, x, mask, need_weights=True)
            assert F.dropout is not real
        assert_close("attention dropout placement vs nn.MultiheadAttention", out, halved)
        assert not torch.allclose(halved, plain, atol=1e-3), "the dropout made no difference"
        monkeypatch.setattr(attention, "EXPLICIT_MAX_KEYS", 0)  # the fused kernel
        torch.manual_seed(0)
        a, b = ours.train()(x, x, x, mask)[0], ours(x, x, x, mask)[0]
        assert not torch.allclose(a, b), "the fused kernel dropped nothing in training"
        assert_close("fused attention dropout: off at evaluation", ours.eval()(x, x, x, mask)[0], plain)


@pytest.mark.parametrize(("batch", "t_q"), [(0, 4), (2, 0)])
def test_empty_batch_or_sequence_matches_nn_multihead_attention(batch, t_q, kernel):
    ours, ref = _reference_mha()
    x, memory = torch.randn(batch, t_q, 32), torch.randn(batch, 5, 32)
    out, _ = ours(x, memory, memory)
    ref_out, _ = ref(x, memory, memory)
    assert out.shape == ref_out.shape == (batch, t_q, 32)
    assert_close("MultiHeadAttention vs nn.MultiheadAttention (empty)", out, ref_out)


def test_cross_attention_and_distinct_key_value_match_nn_multihead_attention(kernel):
    ours, ref = _reference_mha()
    x, memory, other = torch.randn(2, 5, 32), torch.randn(2, 9, 32), torch.randn(2, 9, 32)
    src = torch.randint(1, 9, (2, 9))
    src[1, 6:] = 0
    mask = padding_mask(src, 0)
    out, _ = ours(x, memory, memory, mask)
    ref_out, _ = ref(x, memory, memory, key_padding_mask=src == 0)
    assert_close("MultiHeadAttention vs nn.MultiheadAttention (cross)", out, ref_out)
    out, _ = ours(x, memory, other, mask)
    ref_out, _ = ref(x, memory, other, key_padding_mask=src == 0)
    assert_close("MultiHeadAttention vs nn.MultiheadAttention (k != v)", out, ref_out)


def test_free_d_k_d_v_shapes_and_weights():
    mha = MultiHeadAttention(d_model=30, n_heads=3, d_k=7, d_v=5)
    x = torch.randn(2, 4, 30)
    out, w = mha(x, x, x, need_weights=True)
    assert out.shape == (2, 4, 30) and w.shape == (2, 3, 4, 4)
    assert mha.w_qkv.weight.shape == (3 * 7 * 2 + 3 * 5, 30) and mha.w_o.weight.shape == (30, 15)


def test_mha_needs_divisible_width_unless_d_k_given():
    with pytest.raises(ValueError, match="d_model=30 must be divisible by n_heads=4"):
        MultiHeadAttention(30, 4)


@pytest.mark.parametrize("need_weights", [False, True])
def test_gradcheck_multi_head_attention_float64(need_weights, kernel):
    mha = MultiHeadAttention(8, 2, d_k=3, d_v=5).double()
    q = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    kv = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[True, True, False, True]]).expand(3, 4)

    def f(q, kv):
        return mha(q, kv, kv, mask, need_weights=need_weights)[0]

    assert torch.autograd.gradcheck(f, (q, kv), eps=1e-6, atol=1e-5)


def test_cache_appends_self_attention_and_reuses_static_memory():
    mha = MultiHeadAttention(16, 2).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    full, _ = mha(x, x, x, causal_mask(5))
    cache = KVCache()
    steps = [mha(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=cache)[0] for t in range(5)]
    assert len(cache) == 5
    assert_close("MultiHeadAttention cached vs full (self)", torch.cat(steps, 1), full)
    cross, _ = mha(x, memory, memory)
    cache = KVCache(static=True)
    steps = [mha(x[:, t : t + 1], memory, memory, cache=cache)[0] for t in range(5)]
    assert len(cache) == 7
    assert_close("MultiHeadAttention cached vs full (cross)", torch.cat(steps, 1), cross)
    # held contiguous, not as the heads' transposed view, which every step's product would copy again
    assert cache.k.is_contiguous() and cache.v.is_contiguous()
    primed = KVCache(static=True)
    primed.update(*mha.project_memory(memory))
    assert primed.k.is_contiguous() and torch.equal(primed.k, cache.k) and torch.equal(primed.v, cache.v)


def test_cache_buffer_grows_and_reorders_like_concatenation():
    """The preallocated buffer holds exactly what torch.cat of the updates would, through growth
    (prefill of 3, then 1, 2, … positions) and beam reorders that copy only the filled part."""
    cache, ref_k, ref_v, rows = KVCache(), None, None, 4
    g = torch.Generator().manual_seed(0)
    for t, n in enumerate([3, 1, 1, 2, 1, 5, 1]):
        k, v = torch.randn(rows, 2, n, 3, generator=g), torch.randn(rows, 2, n, 5, generator=g)
        got_k, got_v = cache.update(k, v)
        ref_k = k if ref_k is None else torch.cat([ref_k, k], 2)
        ref_v = v if ref_v is None else torch.cat([ref_v, v], 2)
        assert torch.equal(got_k, ref_k) and torch.equal(got_v, ref_v) and len(cache) == ref_k.size(2)
        if t % 2:
            index = torch.randperm(rows, generator=g)[: rows - t // 3]  # reorder; later, drop rows too
            cache.reorder(index)
            rows = len(index)
            ref_k, ref_v = ref_k[index], ref_v[index]
            assert torch.equal(cache.k, ref_k) and torch.equal(cache.v, ref_v)


def test_beam_rows_fork_in_place_and_read_as_a_reorder_would():
    """``DecoderCache.fork``: a beam step's children keep their parent's row (the first child) or
    take a row no child continues (the others, with the parent's keys and values copied in), so a
    step copies only the extra children's rows. Read through the rows it returns, the cache equals
    the concatenated keys and values reordered by the parents, step after step, and each sentence
    keeps its own rows."""
    from aiayn.modules.kv_cache import DecoderCache

    g, k, sentences = torch.Generator().manual_seed(2), 4, 3
    n = k * sentences
    cache, rows, ref = DecoderCache(1), torch.arange(n), None
    slot = cache.layers[0]["self"]
    for step in range(6):
        new = torch.randn(n, 2, 1, 3, generator=g)  # this step's keys, in the cache's row order
        slot.update(new, new + 1)
        ref = new[rows] if ref is None else torch.cat([ref, new[rows]], 2)  # in the search's row order
        own = k * torch.arange(sentences)[:, None]  # each sentence's parents among its own rows
        parents = (torch.randint(0, k, (sentences, k), generator=g) + own).view(-1)
        if step == 0:
            parents = torch.arange(n)  # no fork: nothing copied, the rows unchanged
        buffer = slot.k.clone()  # the filled positions (the spare ones hold whatever memory held)
        rows = cache.fork(rows[parents])
        ref = ref[parents]
        assert torch.equal(slot.k[rows], ref) and torch.equal(slot.v[rows], ref + 1)
        assert torch.equal(rows.sort().values, torch.arange(n))  # a permutation
        assert torch.equal(rows // k, torch.arange(n) // k)  # within each sentence
        changed = (slot.k != buffer).flatten(1).any(1).sum()
        assert changed <= n - len(set(parents.tolist())), (changed, parents)  # only the extra children


def test_rows_join_in_place_as_concatenation_would_align_them():
    """Rows joining a cache (``KVCache.joined``) are written after the others into the buffers' spare
    rows: the result equals concatenating the caches (appending ones right-aligned behind zeros,
    static ones padded after), and a second join after rows left copies no old row."""
    g = torch.Generator().manual_seed(0)

    def filled(rows: int, n: int, static: bool = False) -> KVCache:
        cache = KVCache(static)
        if n or not static:
            cache.update(torch.randn(rows, 2, n, 3, generator=g), torch.randn(rows, 2, n, 5, generator=g))
        return cache

    def aligned(x: torch.Tensor, n: int, static: bool) -> torch.Tensor:
        pad = (0, 0, 0, n - x.size(2)) if static else (0, 0, n - x.size(2), 0)
        return torch.nn.functional.pad(x, pad)

    for static in (False, True):
        cache = filled(4, 6, static)
        ref_k, ref_v = cache.k.clone(), cache.v.clone()
        for rows, n in [(2, 0 if not static else 4), (3, 6), (1, 2)]:
            other = filled(rows, n, static)
            cache = cache.joined(other, max(len(cache), n))
            ref_k = torch.cat([ref_k, aligned(other.k, ref_k.size(2), static)])
            ref_v = torch.cat([ref_v, aligned(other.v, ref_v.size(2), static)])
            assert torch.equal(cache.k, ref_k) and torch.equal(cache.v, ref_v)
        index = torch.tensor([9, 0, 5, 2])  # rows leave; the buffers keep their room
        cache.reorder(index)
        ref_k, ref_v = ref_k[index], ref_v[index]
        buffer = cache._k.data_ptr()
        other = filled(3, 6, static)
        cache = cache.joined(other, 6)
        assert cache._k.data_ptr() == buffer  # written into the room left, no old row copied
        assert torch.equal(cache.k, torch.cat([ref_k, other.k]))
        assert torch.equal(cache.v, torch.cat([ref_v, other.v]))
