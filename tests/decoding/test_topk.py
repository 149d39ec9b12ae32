"""The block top-k equals torch.topk (values and indices) on long rows, with a ragged tail and -inf."""

import pytest
import torch

from aiayn.decoding.topk import BLOCK, topk


@pytest.mark.parametrize("size", ["long", "long-ragged", "just-blocked"])
@pytest.mark.parametrize("k", [1, 5])
def test_block_topk_equals_torch_topk(size, k):
    # "just-blocked": one block more than the 2k under which torch.topk is called directly
    sizes = {"long": BLOCK * 40, "long-ragged": BLOCK * 40 + 37, "just-blocked": BLOCK * (2 * k + 1) + 3}
    vocab = sizes[size]
    x = torch.randn(33, vocab, generator=torch.Generator().manual_seed(vocab + k))
    x[0, :-3] = float("-inf")  # the best entries sit in the tail
    middle = BLOCK * (vocab // BLOCK // 2)
    x[1, middle : middle + BLOCK] += 10.0  # all of the best entries in one block
    x[2, min(BLOCK, vocab) - 1], x[2, -1] = 100.0, 99.0  # block edges
    values, indices = topk(x, k)
    expected = x.topk(k, dim=-1)
    torch.testing.assert_close(values, expected.values, rtol=0, atol=0)
    finite = expected.values.isfinite()  # tied -inf entries may come in any order
    assert torch.equal(indices[finite], expected.indices[finite])
