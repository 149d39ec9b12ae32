"""OPUS-MT (MarianMT) checkpoints loaded into aiayn's Transformer give HF's logits."""

import json
import re
import time

import pytest
import torch

from aiayn import Transformer
from aiayn.errors import ModelDirError
from aiayn.interop import from_pretrained
from aiayn.interop.model_dir import load_encoder_dir, load_lm_dir, load_translation_dir
from tests.helpers import assert_close
from tests.interop.hf_builders import gpt2, marian, padded_ids

CONFIGS = {
    "opus-mt-like": {},
    "gelu-unscaled-1-layer": dict(d_model=48, encoder_attention_heads=3, decoder_attention_heads=3,
                                  encoder_layers=1, decoder_layers=1, activation_function="gelu",
                                  scale_embedding=False),
    "relu-8-heads-3+1-layers": dict(d_model=64, encoder_attention_heads=8, decoder_attention_heads=8,
                                    encoder_layers=3, decoder_layers=1, encoder_ffn_dim=96,
                                    decoder_ffn_dim=96, activation_function="relu"),
    "separate-vocabs": dict(share_encoder_decoder_embeddings=False, decoder_vocab_size=45, pad_token_id=44,
                            decoder_start_token_id=44),
    "untied-gelu-new": dict(tie_word_embeddings=False, activation_function="gelu_new"),
    "shared-despite-decoder-vocab": dict(decoder_vocab_size=45, pad_token_id=44, decoder_start_token_id=44),
}  # fmt: skip


def logits_pair(hf, ours, seed=1):
    c = hf.config
    src, src_mask = padded_ids([7, 4, 9], 1, c.pad_token_id, c.pad_token_id, seed)
    tgt = torch.randint(1, c.decoder_vocab_size - 1, (3, 6), generator=torch.Generator().manual_seed(seed))
    tgt[:, 0] = c.decoder_start_token_id
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        return ours(src, tgt), ref


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(tmp_path, name):
    hf = marian(tmp_path, **CONFIGS[name])
    ours = from_pretrained(tmp_path)
    assert isinstance(ours, Transformer) and not ours.training
    assert_close(f"Marian[{name}] logits vs transformers", *logits_pair(hf, ours), atol=1e-4)


def test_pytorch_model_bin_with_every_alias_and_position_table(tmp_path):
    hf = marian(tmp_path, fmt="bin")
    assert not (tmp_path / "model.safetensors").exists()
    ours = from_pretrained(tmp_path)
    assert_close("Marian[pytorch_model.bin] logits vs transformers", *logits_pair(hf, ours), atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_checkpoint_with_its_position_tables_loads(tmp_path, dtype):
    """A 16-bit pytorch_model.bin stores its positional tables rounded to 16 bits: still Marian's."""
    hf = marian(tmp_path, fmt="bin")
    state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    torch.save({k: v.to(dtype) for k, v in state.items()}, tmp_path / "pytorch_model.bin")
    ours = from_pretrained(tmp_path)
    # the same weights; transformers keeps the rounded tables, aiayn computes them: 1e-3 apart at most
    assert_close(
        f"Marian[{dtype}] logits vs transformers", *logits_pair(hf.to(dtype).float(), ours), atol=1e-3
    )
    wrong = {k: v.to(dtype) for k, v in state.items()}
    wrong["model.encoder.embed_positions.weight"] = wrong["model.encoder.embed_positions.weight"].roll(1, 0)
    torch.save(wrong, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelDirError, match="is not Marian's sinusoidal table"):
        from_pretrained(tmp_path)


def test_config_maps_marian_conventions(tmp_path):
    marian(tmp_path)
    c = from_pretrained(tmp_path).config
    assert (c.positional, c.activation, c.emb_scale, c.norm_first) == (
        "sinusoidal_halves",
        "silu",
        "emb",
        False,
    )
    assert (c.pad_id, c.bos_id, c.eos_id, c.output_bias, c.share_embeddings) == (60, 60, 0, True, True)


def test_strict_loading_names_the_problem(tmp_path):
    hf = marian(tmp_path, fmt="bin")
    state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    state["model.encoder.layers.0.extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelDirError, match=r"unexpected tensors \['model.encoder.layers.0.extra.weight'\]"):
        from_pretrained(tmp_path)
    del state["model.encoder.layers.0.extra.weight"], state["model.decoder.layers.1.fc2.bias"]
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelDirError, match="tensor model.decoder.layers.1.fc2.bias is missing"):
        from_pretrained(tmp_path)
    state = dict(hf.state_dict())
    state["lm_head.weight"] = state["lm_head.weight"] + 1
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelDirError, match="differ, but the config ties them"):
        from_pretrained(tmp_path)
    state["lm_head.weight"] = torch.zeros(5, 32)
    state["model.shared.weight"] = state["model.encoder.embed_tokens.weight"] = torch.zeros(5, 32)
    state["model.decoder.embed_tokens.weight"] = torch.zeros(5, 32)
    torch.save(state, tmp_path / "pytorch_model.bin")
    with pytest.raises(ModelDirError, match=r"has shape \(5, 32\), config.json implies \(61, 32\)"):
        from_pretrained(tmp_path)


def test_unsupported_and_broken_directories(tmp_path):
    marian(tmp_path, encoder_attention_heads=2)
    with pytest.raises(ModelDirError, match="encoder_attention_heads=2 but decoder_attention_heads=4"):
        from_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["MarianForCausalLM"]}))
    with pytest.raises(
        ModelDirError, match=r"architectures=\['MarianForCausalLM'\]: aiayn reads MarianMTModel"
    ):
        from_pretrained(tmp_path)
    # a base MarianModel (no lm_head, keys without "model."): refused by name; before, accepted by name
    # and then "tensor model.shared.weight is missing"
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["MarianModel"]}))
    with pytest.raises(ModelDirError, match=r"architectures=\['MarianModel'\]: aiayn reads MarianMTModel$"):
        from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "t5"}')
    with pytest.raises(ModelDirError, match="model_type 't5' is not supported"):
        from_pretrained(tmp_path)
    for load in (load_translation_dir, load_lm_dir, load_encoder_dir):  # what every command reads first
        with pytest.raises(ModelDirError, match="model_type 't5' is not supported"):
            load(tmp_path)
    marian(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(ModelDirError, match="model.safetensors is corrupt"):
        from_pretrained(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ModelDirError, match="has no model.safetensors, pytorch_model.bin"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(d_model="32"), r"config\.json: TransformerConfig\.d_model='32' must be"),
        (lambda c: c.update(dropout="0.1x"), r"config\.json: could not convert string to float"),
        (lambda c: c.update(activation_function=["swish"]), r"config\.json: activation_function=\['swish'\]"),
        (lambda c: c.update(scale_embedding="yes", share_encoder_decoder_embeddings="no"),
         r"config\.json: TransformerConfig\.share_embeddings='no' must be true or false"),
        (lambda c: c.update(model_type=["marian"]), r"config\.json: 'model_type' must be a string"),
    ],
)  # fmt: skip
def test_config_json_fields_of_the_wrong_type_name_the_file(tmp_path, edit, message):
    marian(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    edit(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelDirError, match=message):
        from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "junk", [b"hello world", b"", b"PK\x03\x04 truncated zip", b"\x80\x02q\x05.", b"root:x:0:0"]
)
def test_corrupt_pytorch_model_bin_is_named(tmp_path, junk):
    marian(tmp_path, fmt="bin")
    (tmp_path / "pytorch_model.bin").write_bytes(junk)
    with pytest.raises(ModelDirError, match=r"pytorch_model\.bin is corrupt or not a plain tensor file"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("shard", ["../outside.safetensors", "/tmp/elsewhere.safetensors", "sub/x.bin"])
def test_a_sharded_index_naming_a_file_outside_the_directory_is_refused(tmp_path, shard):
    marian(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").rename(tmp_path / "outside.safetensors")
    index = {"weight_map": {"model.shared.weight": shard}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelDirError, match=f"names shard {re.escape(repr(shard))}: not a file name in"):
        from_pretrained(tmp_path / "m")


def test_corrupt_config_json_is_named(tmp_path):
    marian(tmp_path)
    text = (tmp_path / "config.json").read_text()
    (tmp_path / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(ModelDirError, match=r"config\.json is not valid JSON"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize(("build", "rows"), [(marian, 61), (gpt2, 53)], ids=["marian", "gpt2"])
def test_a_config_far_larger_than_its_weights_is_refused_before_any_memory_is_spent(tmp_path, build, rows):
    """Before, the model of config.json was built first: a vocab_size of 2**40 asked for terabytes
    (a RuntimeError traceback, or the memory of the machine) before the shapes were compared."""
    build(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "vocab_size": 2**40}))
    refused = rf"has shape \({rows}, 32\), config\.json implies \(1099511627776, 32\)"
    with pytest.raises(ModelDirError, match=refused):
        from_pretrained(tmp_path)


def test_attention_maps_match_transformers_output_attentions(tmp_path):
    """What `aiayn attention` and the page draw: every layer's and head's weights, encoder, decoder
    self-attention and cross-attention, against Marian's ``output_attentions`` (eager attention)."""
    hf = marian(tmp_path, encoder_layers=3, decoder_layers=2)
    hf.set_attn_implementation("eager")  # the fused kernels return no weights
    ours = from_pretrained(tmp_path)
    c = hf.config
    src, src_mask = padded_ids([7, 4, 9], 1, c.pad_token_id, c.pad_token_id, 1)
    tgt = torch.randint(1, c.decoder_vocab_size - 1, (3, 6), generator=torch.Generator().manual_seed(1))
    tgt[:, 0] = c.decoder_start_token_id
    with torch.no_grad():
        ref = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, output_attentions=True)
        got = ours.attention_weights(src, tgt)
    for ours_key, ref_key in (("encoder", "encoder_attentions"), ("decoder_self", "decoder_attentions"),
                              ("cross", "cross_attentions")):  # fmt: skip
        theirs = getattr(ref, ref_key)
        assert len(got[ours_key]) == len(theirs), ours_key
        for i, (a, b) in enumerate(zip(got[ours_key], theirs)):  # (B, h, T_q, T_k), padding included
            assert_close(f"Marian {ref_key}[{i}] vs aiayn", a, b, atol=1e-5)


@pytest.mark.parametrize(
    ("build", "field"),
    [(marian, "encoder_layers"), (marian, "decoder_layers"), (gpt2, "n_layer")],
)
def test_a_config_deeper_than_its_weights_is_refused_before_anything_is_built(tmp_path, build, field):
    """A million layers in config.json spent minutes and gigabytes building the name map and the model
    before the weights were compared."""
    build(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: 1_000_000}))
    t0 = time.perf_counter()
    with pytest.raises(
        ModelDirError, match=r"config\.json: 1000000 layers \(n_\w*layers\) but the weights hold 2"
    ):
        from_pretrained(tmp_path)
    assert time.perf_counter() - t0 < 10


def test_a_broken_vocab_json_is_named_alone(tmp_path):
    """It was reported as config.json's fault ("…/config.json: …/vocab.json does not hold …")."""
    marian(tmp_path)
    (tmp_path / "vocab.json").write_text("[1, 2, 3]")
    with pytest.raises(ModelDirError, match=r"^\S+/vocab\.json does not hold a JSON object") as info:
        from_pretrained(tmp_path)
    assert "config.json" not in str(info.value)
