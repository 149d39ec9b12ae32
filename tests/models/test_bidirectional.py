"""Asynchronous bidirectional decoding: the right-to-left decoder, the fourth sublayer that reads
its states, the joint loss, and the two-pass search (cached == uncached; the memory the search
builds is exactly the one training builds for the same sequence)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from aiayn import BidirectionalTransformer, Transformer, TransformerConfig
from aiayn.data.batching import TranslationBatch, pad_rows, reverse_targets
from aiayn.decoding.bidirectional import R2L_MARGIN, BidirectionalAdapter, r2l_inputs, r2l_translation
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.search import search
from aiayn.errors import ConfigError
from aiayn.models import R2LMemory
from aiayn.training import criteria
from tests.helpers import assert_close

V = 40


def model(seed=0, **kw) -> BidirectionalTransformer:
    torch.manual_seed(seed)
    cfg = TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, n_encoder_layers=2, n_decoder_layers=2,
                            d_model=32, n_heads=4, d_ff=64, dropout=0.0, bidirectional=True, output_bias=True,
                            **kw)  # fmt: skip
    m = BidirectionalTransformer(cfg).eval()
    with torch.no_grad():
        m.head.bias[cfg.eos_id] = 0.5  # outputs of varied length
    return m


def batch():
    g = torch.Generator().manual_seed(1)
    src = torch.randint(5, V, (3, 7), generator=g)
    src[1, 5:], src[1, 4] = 0, 2
    tgt_out = torch.randint(5, V, (3, 6), generator=g)
    tgt_out[0, 5] = 2
    tgt_out[1, 3:], tgt_out[1, 2] = 0, 2
    tgt_out[2, 1:], tgt_out[2, 0] = 0, 2
    tgt_in = torch.cat([torch.ones(3, 1, dtype=torch.long), tgt_out[:, :-1]], 1).masked_fill(tgt_out == 0, 0)
    return src, tgt_in, tgt_out


def test_right_to_left_targets_are_reversed_with_bos_and_eos_in_place():
    tgt_out = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0], [2, 0, 0, 0]])
    r2l_in, r2l_out = reverse_targets(tgt_out)
    assert r2l_in.tolist() == [[1, 7, 6, 5], [1, 8, 0, 0], [1, 0, 0, 0]]
    assert r2l_out.tolist() == [[7, 6, 5, 2], [8, 2, 0, 0], [2, 0, 0, 0]]


def test_fourth_sublayer_reads_the_r2l_states_under_their_padding_mask():
    m = model()
    src, tgt_in, tgt_out = batch()
    r2l_in, _ = reverse_targets(tgt_out)
    with torch.no_grad():
        base = m(src, tgt_in, r2l_tgt=r2l_in).l2r
        other = r2l_in.clone()
        other[0, 2] = 9 if other[0, 2] != 9 else 10
        assert not torch.allclose(m(src, tgt_in, r2l_tgt=other).l2r[0], base[0]), (
            "a changed memory changes nothing"
        )
        torch.testing.assert_close(m(src, tgt_in, r2l_tgt=other).l2r[1:], base[1:])
        padded = torch.cat([r2l_in, torch.zeros(3, 3, dtype=torch.long)], 1)
        assert_close("bidirectional: padded r2l memory", m(src, tgt_in, r2l_tgt=padded).l2r, base)
    plain_cfg = TransformerConfig(src_vocab_size=V, tgt_vocab_size=V, n_encoder_layers=2, n_decoder_layers=2,
                                  d_model=32, n_heads=4, d_ff=64)  # fmt: skip
    plain = Transformer(plain_cfg)
    assert plain.r2l_decoder is None and plain.decoder.layers[0].cross_attn_r2l is None
    with pytest.raises(ValueError, match="BidirectionalTransformer"):
        Transformer(m.config)


def test_joint_loss_is_l2r_plus_lambda_r2l_cross_entropy():
    m = model()
    src, tgt_in, tgt_out = batch()
    r2l_in, r2l_out = reverse_targets(tgt_out)
    with torch.no_grad():
        (loss, nll, n), (_, r2l_nll, r2l_n) = criteria.bidirectional_loss(
            m, TranslationBatch(src, tgt_in, tgt_out), 0.0, r2l_weight=0.5
        )
        logits = m(src, tgt_in, r2l_tgt=r2l_in).l2r
        r2l_logits = m.head(m.decode_r2l(r2l_in, m.context(src)))
    ref = F.cross_entropy(logits[tgt_out != 0], tgt_out[tgt_out != 0], reduction="sum")
    ref_r2l = F.cross_entropy(r2l_logits[r2l_out != 0], r2l_out[r2l_out != 0], reduction="sum")
    assert_close("bidirectional l2r NLL", nll, ref, atol=1e-4)
    assert_close("bidirectional r2l NLL", r2l_nll, ref_r2l, atol=1e-4)
    assert_close("bidirectional joint loss", loss, ref + 0.5 * ref_r2l, atol=1e-4)
    assert int(n) == int((tgt_out != 0).sum()) and int(r2l_n) == int((r2l_out != 0).sum())


@pytest.mark.parametrize("detach", [False, True])
def test_detaching_stops_the_l2r_gradient_into_the_r2l_decoder(detach):
    m = model()
    m.train()
    src, tgt_in, tgt_out = batch()
    loss = criteria.bidirectional_loss(m, TranslationBatch(src, tgt_in, tgt_out), 0.0, r2l_weight=0.0,
                                       memory=R2LMemory(detach=detach))[0]  # fmt: skip
    loss.loss.backward()
    grad = sum(p.grad.abs().sum() for p in m.r2l_decoder.parameters() if p.grad is not None)
    assert (grad == 0) if detach else (grad > 0)


def test_memory_of_another_sequence_feeds_the_l2r_loss_only():
    """With ``memory=R2LMemory(tgt)`` the left-to-right loss reads that sequence's states (exactly as if it
    were the teacher-forced ``r2l_tgt``), and the right-to-left loss stays the reference's."""
    m = model()
    src, tgt_in, tgt_out = batch()
    other = torch.randint(5, V, (3, 4), generator=torch.Generator().manual_seed(3))
    other[:, 0], other[2, 2:] = 1, 0
    b = TranslationBatch(src, tgt_in, tgt_out)
    with torch.no_grad():
        ref = criteria.bidirectional_loss(m, b, 0.0)
        read_other = criteria.bidirectional_loss(m, b, 0.0, memory=R2LMemory(other))
        h = m.hidden(src, tgt_in, other).l2r  # teacher-forced on ``other``
        as_if = criteria.smoothed_sums(m.head, h, tgt_out, 0.0, 0)
    assert_close("l2r NLL reading another sequence's states", read_other[0].nll, as_if.nll)
    assert_close("r2l NLL stays the reference's", read_other[1].nll, ref[1].nll)
    assert abs(float(read_other[0].nll - ref[0].nll)) > 1e-3, (
        "the memory made no difference: the test proves nothing"
    )


def test_training_builds_the_memory_sequence_the_greedy_search_reads():
    """``r2l_memory_from="greedy"`` and decoding with beam 1 use the same right-to-left translation,
    within the memory's margin (``R2L_MARGIN``) whatever the left-to-right search's limit is."""
    m = model()
    src, _, _ = batch()
    limits = (src != 0).sum(1) - 1 + SearchConfig().max_len_b  # the left-to-right search's default
    adapter = BidirectionalAdapter(m, SearchConfig(beam=1, min_len=3, lenpen=1.0), limits)
    with torch.no_grad():
        search(adapter, src, SearchConfig(beam=1), limits)
    m.train()
    built = criteria.greedy_memory_input(m, src)
    assert m.training, "the training mode was not restored"
    assert torch.equal(built, r2l_inputs(adapter.r2l_hypotheses, 1, 2, 0, src.device))
    own = (src != 0).sum(1) - 1 + R2L_MARGIN
    with torch.no_grad():
        hyps, again = r2l_translation(m.eval(), src, m.context(src), SearchConfig(beam=1), own)
        _, longer = r2l_translation(m, src, m.context(src), SearchConfig(beam=1), limits)
    assert torch.equal(built, again)
    assert [len(h[0].tokens) for h in hyps] == own.tolist(), "an untrained model runs to its limit"
    assert longer.shape[1] > built.shape[1], "the margin made no difference: the test proves nothing"


@pytest.mark.parametrize("beam", [1, 4])
def test_two_pass_search_cached_equals_uncached(beam):
    m = model()
    src, _, _ = batch()
    limits = torch.tensor([9, 9, 9])
    out = {}
    for cache in (True, False):
        cfg = SearchConfig(beam=beam, nbest=beam, use_cache=cache)
        adapter = BidirectionalAdapter(m, cfg, limits)
        with torch.no_grad():
            hyps = search(adapter, src, cfg, limits)
        out[cache] = ([[(h.tokens, round(h.score, 4)) for h in hs] for hs in hyps],
                      [hs[0].tokens for hs in adapter.r2l_hypotheses])  # fmt: skip
    assert out[True] == out[False]
    assert any(len(h[0][0]) > 1 for h in out[True][0]), "only empty outputs: the test would prove little"


def greedy_two_pass(m):
    """``batch()``'s sources, their greedy two-pass hypotheses and the adapter (its r2l hypotheses)."""
    src, _, _ = batch()
    limits = torch.tensor([9, 9, 9])
    adapter = BidirectionalAdapter(m, SearchConfig(beam=1), limits)
    with torch.no_grad():
        return src, search(adapter, src, SearchConfig(beam=1), limits), adapter


def test_the_search_reads_the_memory_training_builds_for_the_same_sequence():
    """At every left-to-right step, the incremental decoder's whole next-token distribution equals
    the teacher-forced forward pass's at that position, given the right-to-left pass's own
    hypothesis as ``r2l_tgt``: decoding feeds the fourth sublayer exactly the states that training
    computes for that sequence, step by step (and so the hypothesis' log-probability is their sum)."""
    m = model()
    src, hyps, adapter = greedy_two_pass(m)
    with torch.no_grad():
        r2l_in = r2l_inputs(adapter.r2l_hypotheses, 1, 2, 0, src.device)
        for i, h in enumerate(hyps):
            tokens = h[0].tokens
            tgt_in = torch.tensor([[1, *tokens[:-1]]])
            forward = m(src[i : i + 1], tgt_in, r2l_tgt=r2l_in[i : i + 1]).l2r[0].log_softmax(-1)  # (T, V)
            chosen = forward.gather(1, torch.tensor(tokens)[:, None]).sum()
            assert chosen.item() == pytest.approx(h[0].log_prob, abs=1e-4)
            stepper = BidirectionalAdapter(m, SearchConfig(beam=1), torch.tensor([9]))
            prefix = stepper.start(src[i : i + 1])  # (1, 1): bos
            assert stepper.r2l_hypotheses[0][0].tokens == adapter.r2l_hypotheses[i][0].tokens
            for t, token in enumerate(tokens):
                assert_close(f"sentence {i}, step {t}", stepper.step(prefix)[0], forward[t], atol=1e-4)
                prefix = torch.cat([prefix, torch.tensor([[token]])], 1)
    assert any(len(h[0].tokens) > 2 for h in hyps), "outputs of one or two tokens prove little"


def test_bidirectional_with_r2l_memory_is_a_config_error():
    with pytest.raises(ConfigError, match="r2l_memory"):
        TransformerConfig(bidirectional=True, r2l_memory=True)


def cached_batch(pseudo_rows):
    """``batch()`` with ``r2l`` = each cached right-to-left translation + eos, as collate builds it."""
    src, tgt_in, tgt_out = batch()
    return TranslationBatch(src, tgt_in, tgt_out, pad_rows(pseudo_rows, 0, None, 2))


def test_a_cached_step_equals_the_hand_computed_one():
    """``r2l_target="pseudo"``: one right-to-left pass, teacher-forced on ``[bos] + cached``, gives
    both the right-to-left loss (against ``cached + [eos]``) and the memory, under its padding mask;
    computed here from the decoder stacks and ``F.cross_entropy``: the same losses and the same
    gradient for every parameter (what the optimiser step then applies)."""
    m = model()
    pseudo = [[7, 9, 11, 5], [12], []]
    b = cached_batch(pseudo)
    total, r2l = criteria.bidirectional_loss(m, b, 0.0, r2l_weight=0.5, r2l_target="pseudo")
    total.loss.backward()
    grads = {name: p.grad.clone() for name, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    r2l_in = torch.tensor([[1, 7, 9, 11, 5], [1, 12, 0, 0, 0], [1, 0, 0, 0, 0]])
    r2l_out = torch.tensor([[7, 9, 11, 5, 2], [12, 2, 0, 0, 0], [2, 0, 0, 0, 0]])
    assert torch.equal(criteria.cached_memory_input(b, m.config), r2l_in) and torch.equal(b.r2l, r2l_out)
    context = m.context(b.src)
    states = m.decode_r2l(r2l_in, context)
    memory = dataclasses.replace(context, r2l_memory=states, r2l_mask=(r2l_in != 0)[:, None, None, :])
    l2r_logits = m.head(m.decode(b.tgt_in, memory))
    ref_l2r = F.cross_entropy(l2r_logits.flatten(0, 1), b.tgt_out.flatten(), ignore_index=0, reduction="sum")
    ref_r2l = F.cross_entropy(m.head(states).flatten(0, 1), r2l_out.flatten(), ignore_index=0,
                              reduction="sum")  # fmt: skip
    assert_close("cached step: l2r NLL", total.nll, ref_l2r, atol=1e-4)
    assert_close("cached step: r2l NLL on the cached translation", r2l.nll, ref_r2l, atol=1e-4)
    assert_close("cached step: joint loss", total.loss, ref_l2r + 0.5 * ref_r2l, atol=1e-4)
    (ref_l2r + 0.5 * ref_r2l).backward()
    hand = {name: p.grad for name, p in m.named_parameters() if p.grad is not None}
    assert hand.keys() == grads.keys() and any(name.startswith("r2l_decoder") for name in hand)
    for name, grad in grads.items():
        assert_close(f"cached step: gradient of {name}", grad, hand[name], atol=1e-4)


def test_reference_target_reads_the_cache_as_memory_only():
    """``r2l_target="reference"``: the right-to-left loss is the reversed reference's, the memory the
    cached translation's states (a second pass)."""
    m = model()
    b = cached_batch([[7, 9, 11, 5], [12], [6, 6]])
    with torch.no_grad():
        total, r2l = criteria.bidirectional_loss(
            m, b, 0.0, memory=R2LMemory(criteria.cached_memory_input(b, m.config))
        )
        plain_ref = criteria.bidirectional_loss(m, b, 0.0)[1]  # reference for both
        pseudo = criteria.bidirectional_loss(m, b, 0.0, r2l_target="pseudo")[0]  # cache for both
    assert_close("reference target: r2l NLL is the reference's", r2l.nll, plain_ref.nll)
    assert_close("reference target: l2r reads the cached memory", total.nll, pseudo.nll)


def test_memory_dropout_leaves_a_row_bos_state_only():
    """A dropped row (``keep`` False) reads exactly what a memory of ``[bos]`` alone gives it; kept
    rows are untouched."""
    m = model()
    b = cached_batch([[7, 9, 11, 5], [12], [6, 6]])
    r2l_in = criteria.cached_memory_input(b, m.config)
    keep = torch.tensor([False, True, False])
    with torch.no_grad():
        dropped = m.hidden(b.src, b.tgt_in, r2l_in, R2LMemory(keep=keep)).l2r
        full = m.hidden(b.src, b.tgt_in, r2l_in).l2r
        bos_only = m.hidden(b.src, b.tgt_in, r2l_in, R2LMemory(tgt=r2l_in[:, :1])).l2r
    real = b.tgt_out != 0
    for row in range(3):
        expected = full[row] if keep[row] else bos_only[row]
        assert_close(f"memory dropout row {row}", dropped[row][real[row]], expected[real[row]], atol=1e-5)
    assert not torch.allclose(full[0][real[0]], bos_only[0][real[0]], atol=1e-3), (
        "the memory made no difference"
    )


def test_decoding_builds_the_memory_the_cached_training_step_reads():
    """The search's left-to-right log-probabilities, step by step, equal the cached training step's
    NLL when the cache holds the right-to-left search's own hypothesis (eos dropped, as the cache
    stores it): decoding and training build the fourth sublayer's memory identically."""
    m = model()
    src, hyps, adapter = greedy_two_pass(m)
    with torch.no_grad():
        pseudo = [[t for t in h[0].tokens if t != 2] for h in adapter.r2l_hypotheses]
        out = [h[0].tokens for h in hyps]
        tgt_out = pad_rows(out, 0)
        tgt_in = criteria.shifted_input(tgt_out, 1, 2, 0)
        b = TranslationBatch(src, tgt_in, tgt_out, pad_rows(pseudo, 0, None, 2))
        # the memory's input sequence, token for token: the cache's as training reads it, and the
        # search's (whose states feed each decoding step: the test above, step by step)
        searched = r2l_inputs(adapter.r2l_hypotheses, 1, 2, 0, src.device)
        cached = criteria.cached_memory_input(b, m.config)
        assert (
            torch.equal(cached[:, : searched.shape[1]], searched) and not cached[:, searched.shape[1] :].any()
        )
        for i in range(3):
            row = TranslationBatch(*(t[i : i + 1] for t in b))
            trim = int((row.tgt_out != 0).sum()), int((row.r2l != 0).sum())
            row = TranslationBatch(
                row.src, row.tgt_in[:, : trim[0]], row.tgt_out[:, : trim[0]], row.r2l[:, : trim[1]]
            )
            nll = criteria.bidirectional_loss(m, row, 0.0, r2l_target="pseudo")[0].nll
            assert -nll.item() == pytest.approx(hyps[i][0].log_prob, abs=1e-4)
    assert any(len(p) > 1 for p in pseudo) and any(len(o) > 1 for o in out), "empty outputs prove little"


def test_a_frozen_right_to_left_pass_has_no_loss_and_no_gradient():
    """``R2LMemory(frozen=True)`` (``r2l_freeze``): the same left-to-right loss as reading that memory
    unfrozen, nothing from the right-to-left head, and no gradient anywhere in its decoder."""
    m = model()
    m.train()  # dropout is 0 in model(): the passes are comparable
    b = cached_batch([[7, 9, 11, 5], [12], [6, 6]])
    frozen, r2l = criteria.bidirectional_loss(m, b, 0.1, r2l_target="pseudo", memory=R2LMemory(frozen=True))
    with torch.no_grad():
        plain, plain_r2l = criteria.bidirectional_loss(m, b, 0.1, r2l_target="pseudo")
    assert_close("frozen r2l pass: the l2r loss alone", frozen.loss, plain.loss - plain_r2l.loss)
    assert_close("frozen r2l pass: l2r NLL unchanged", frozen.nll, plain.nll)
    assert float(r2l.n) == float(r2l.loss) == 0 and float(plain_r2l.loss) > 0
    frozen.loss.backward()
    assert all(p.grad is None for p in m.r2l_decoder.parameters())
    assert any(p.grad is not None for p in m.decoder.parameters())
    m.zero_grad(set_to_none=True)  # reading another sequence's states (a cached memory): frozen too
    other = R2LMemory(criteria.cached_memory_input(b, m.config), frozen=True)
    criteria.bidirectional_loss(m, b, 0.1, r2l_target="pseudo", memory=other)[0].loss.backward()
    assert all(p.grad is None for p in m.r2l_decoder.parameters())
