"""GPT-2 checkpoints loaded into aiayn's LanguageModel give HF's logits."""

import json

import pytest
import torch

from aiayn import LanguageModel, LMConfig
from aiayn.errors import ModelDirError
from aiayn.interop import from_pretrained
from tests.helpers import assert_close
from tests.interop.hf_builders import gpt2, padded_ids, transformers

CONFIGS = {
    "gpt2-like": {},
    "relu-n_inner-3-layers": dict(n_embd=48, n_head=6, n_layer=3, n_inner=80, activation_function="relu"),
    "gelu-1-head-untied": dict(n_embd=24, n_head=1, n_layer=1, activation_function="gelu",
                               tie_word_embeddings=False, layer_norm_epsilon=1e-6),
}  # fmt: skip


def logits_pair(hf, ours):
    """Right-padded batch: HF gets the attention mask, and real positions are compared (aiayn's
    causal mask already keeps a real position from seeing the padding after it)."""
    ids, mask = padded_ids([9, 5, 7], 0, hf.config.vocab_size, pad=ours.config.pad_id)
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask).logits
        got = ours(ids)
    real = mask.bool()
    return got[real], ref[real]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(tmp_path, name):
    hf = gpt2(tmp_path, **CONFIGS[name])
    ours = from_pretrained(tmp_path)
    assert isinstance(ours, LanguageModel)
    assert_close(f"GPT-2[{name}] logits vs transformers", *logits_pair(hf, ours), atol=1e-4)


def test_original_hub_layout_without_prefix_and_with_mask_buffers(tmp_path):
    hf = gpt2(tmp_path, fmt="original")
    ours = from_pretrained(tmp_path)
    assert_close("GPT-2[original .bin layout] logits vs transformers", *logits_pair(hf, ours), atol=1e-4)


def test_config_and_padding_choice(tmp_path):
    gpt2(tmp_path)
    c = from_pretrained(tmp_path).config
    assert (c.norm_first, c.positional, c.activation, c.emb_scale, c.tie_output) == (
        True, "learned", "gelu_tanh", "none", True)  # fmt: skip
    assert (c.bos_id, c.eos_id, c.pad_id) == (52, 52, 51)  # highest id that is not bos/eos
    assert from_pretrained(tmp_path, pad_id=7).config.pad_id == 7
    gpt2(tmp_path, pad_token_id=3)
    assert from_pretrained(tmp_path).config.pad_id == 3


def test_a_padding_id_for_a_model_that_has_its_own_is_refused_not_ignored(tmp_path):
    from aiayn.errors import ConfigError
    from aiayn.models.io import save_model

    save_model(LanguageModel(LMConfig(vocab_size=20, n_layers=1, d_model=8, n_heads=2, d_ff=16)), tmp_path)
    with pytest.raises(ConfigError, match="pad_id=5 is for GPT-2 directories"):
        from_pretrained(tmp_path, pad_id=5)
    assert from_pretrained(tmp_path).config.pad_id == 0


def test_a_gpt2_without_padding_exports_without_padding(tmp_path):
    """Read back, a GPT-2 without a pad token pads with a real token (51 here). The export wrote it as
    pad_token_id and banned it in generation_config.json: transformers then dropped it from prompts
    and never wrote it, so the export generated otherwise than the original."""
    from aiayn.interop import export_hf

    hf = gpt2(tmp_path / "hf").eval()
    ours = from_pretrained(tmp_path / "hf")
    assert ours.config.pad_id == 51
    export_hf(ours, tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["pad_token_id"] is None
    generation = json.loads((tmp_path / "out" / "generation_config.json").read_text())
    assert generation["pad_token_id"] is None and [51] not in generation.get("bad_words_ids", [])
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
    prompt = torch.tensor([[5, 51, 7]])  # the stand-in inside a prompt
    with torch.no_grad():
        kw = dict(do_sample=False, max_new_tokens=6, pad_token_id=52)
        assert back.generate(prompt, **kw).tolist() == hf.generate(prompt, **kw).tolist()
    assert from_pretrained(tmp_path / "out").config.pad_id == 51  # and it reads back as it was


def test_refuses_what_aiayn_cannot_run(tmp_path):
    gpt2(tmp_path, scale_attn_by_inverse_layer_idx=True)
    with pytest.raises(ModelDirError, match=r"config\.json: this GPT-2 scales attention other than"):
        from_pretrained(tmp_path)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=53, n_embd=32, n_layer=1, n_head=4, n_positions=40, pad_token_id=0
    )
    transformers.GPT2ForSequenceClassification(config).save_pretrained(tmp_path / "classifier")
    with pytest.raises(
        ModelDirError, match=r"architectures=\['GPT2ForSequenceClassification'\]: aiayn reads"
    ):
        from_pretrained(tmp_path / "classifier")


def test_config_json_fields_of_the_wrong_type_name_the_file(tmp_path):
    gpt2(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_layer": "2"}))
    with pytest.raises(
        ModelDirError, match=r"config\.json: LMConfig\.n_layers='2' must be a positive integer"
    ):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "layer_norm_epsilon": None, "n_head": [4]}))
    with pytest.raises(
        ModelDirError, match=r"config\.json: LMConfig\.n_heads=\[4\] must be a positive integer"
    ):
        from_pretrained(tmp_path)
