"""aiayn's greedy and beam search on a loaded checkpoint give the tokens HF's ``generate`` gives.

Greedy search is the same algorithm in both. Beam search is not: aiayn's beam shrinks as
hypotheses finish (Marian's rule, ``aiayn/decoding/beam.py``) while HF keeps K live beams until
K have finished, so with free output lengths HF sometimes returns a different (on these random
models, higher-scoring) hypothesis. With eos forbidden until a fixed length (``min_len =
max_len``, as the benchmark runs) the two are the same algorithm, and there they must agree.
"""

import pytest
import torch

from aiayn.decoding import LMAdapter, SearchConfig, Seq2SeqAdapter, beam_search, greedy_search
from aiayn.interop import from_pretrained
from tests.interop.hf_builders import gpt2, marian, padded_ids


def loaded_marian(tmp_path, eos_boost=4.0):
    """Weights large enough (init_std 0.2) that outputs depend on the source, and eos made likely
    enough that they end at different steps (random models otherwise run to the length limit)."""
    hf = marian(tmp_path, init_std=0.2)
    with torch.no_grad():
        hf.final_logits_bias[0, hf.config.eos_token_id] += eos_boost
    hf.save_pretrained(tmp_path)
    return hf, from_pretrained(tmp_path)


def hf_outputs(sequences: torch.Tensor, eos: int, pad: int, skip: int) -> list[list[int]]:
    """HF's generated ids per row, without the first ``skip`` (decoder start or prompt), up to and
    including eos, without the padding of rows that finished early."""
    out = []
    for row in sequences[:, skip:].tolist():
        out.append(row[: row.index(eos) + 1] if eos in row else [t for t in row if t != pad])
    return out


def ours(hyps) -> list[list[int]]:
    return [h[0].tokens for h in hyps]


@pytest.mark.parametrize("eos_boost", [3.0, 4.0])
def test_marian_greedy_matches_generate(tmp_path, eos_boost):
    hf, model = loaded_marian(tmp_path, eos_boost)
    src, mask = padded_ids([7, 4, 9, 5, 6, 8], 1, 60, 60, seed=0)
    ref = hf.generate(input_ids=src, attention_mask=mask, num_beams=1, do_sample=False, max_new_tokens=15)
    got = ours(greedy_search(Seq2SeqAdapter(model), src, 15))
    assert got == hf_outputs(ref, 0, 60, 1)
    assert len({len(t) for t in got}) > 1  # eos at different steps: a real test of stopping


@pytest.mark.parametrize(("beam", "alpha"), [(4, 1.0), (5, 0.6), (2, 0.0)])
def test_marian_fixed_length_beam_matches_generate(tmp_path, beam, alpha):
    hf, model = loaded_marian(tmp_path)
    src, mask = padded_ids([7, 4, 9, 5, 6, 8], 1, 60, 60, seed=0)
    ref = hf.generate(input_ids=src, attention_mask=mask, num_beams=beam, do_sample=False,
                      length_penalty=alpha, max_new_tokens=10, min_new_tokens=10)  # fmt: skip
    got = ours(
        beam_search(
            Seq2SeqAdapter(model),
            src,
            10,
            SearchConfig(beam=beam, lenpen=alpha, lenpen_kind="simple", min_len=10),
        )
    )
    assert got == ref[:, 1:].tolist()


def test_gpt2_greedy_and_beam_match_generate(tmp_path):
    hf = gpt2(tmp_path)
    model = from_pretrained(tmp_path)
    prompt = torch.randint(0, 52, (3, 5), generator=torch.Generator().manual_seed(3))
    common = dict(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                  pad_token_id=model.config.pad_id, max_new_tokens=12)  # fmt: skip
    greedy = hf.generate(**common, num_beams=1)
    assert ours(greedy_search(LMAdapter(model), prompt, 12)) == hf_outputs(greedy, 52, -1, 5)
    beam = hf.generate(**common, num_beams=4, min_new_tokens=12)
    got = ours(
        beam_search(
            LMAdapter(model), prompt, 12, SearchConfig(beam=4, lenpen=1.0, lenpen_kind="simple", min_len=12)
        )
    )
    assert got == beam[:, 5:].tolist()
