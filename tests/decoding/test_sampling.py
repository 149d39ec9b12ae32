"""Top-k and top-p filtering on hand-computed distributions."""

import math

import torch

from aiayn.decoding import filter_logits

PROBS = [0.05, 0.5, 0.15, 0.3]  # sorted: 0.5, 0.3, 0.15, 0.05


def _kept(**kw) -> list[bool]:
    logits = torch.tensor([[math.log(p) for p in PROBS]])
    return filter_logits(logits, **kw)[0].isfinite().tolist()


def test_top_k_keeps_the_k_most_probable():
    assert _kept(top_k=2) == [False, True, False, True]
    assert _kept(top_k=10) == [True] * 4


def test_top_p_keeps_the_smallest_set_reaching_p():
    assert _kept(top_p=0.79) == [False, True, False, True]  # 0.5 + 0.3 reaches 0.79
    assert _kept(top_p=0.81) == [False, True, True, True]
    assert _kept(top_p=0.1) == [False, True, False, False]  # the most probable token always stays
    assert _kept(top_p=1.0) == [True] * 4
    assert _kept(top_p=1e-46) == [False, True, False, False]  # 0 in float32: still the most probable


def test_top_k_then_top_p():
    assert _kept(top_k=3, top_p=0.9) == [False, True, True, True]
    assert _kept(top_k=1, top_p=0.99) == [False, True, False, False]
