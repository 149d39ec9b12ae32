"""Model directories: safetensors + JSON round trip, and clear errors for bad directories."""

import json

import pytest
import torch

from aiayn import LanguageModel, LMConfig, Transformer, TransformerConfig
from aiayn.models.io import load_model, read_config, save_model


def _small() -> Transformer:
    cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=1, n_decoder_layers=1)  # fmt: skip
    return Transformer(cfg).eval()


def test_round_trip_keeps_outputs_and_tying(tmp_path):
    model = _small()
    save_model(model, tmp_path / "m", step=7)
    loaded = load_model(tmp_path / "m")
    src, tgt = torch.randint(4, 30, (2, 5)), torch.randint(4, 30, (2, 4))
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), rtol=0, atol=0)
    assert loaded.head.proj.weight is loaded.src_embed.tokens.weight
    assert read_config(tmp_path / "m")["step"] == 7
    assert not list((tmp_path / "m").glob("*.tmp"))


def test_round_trip_language_model(tmp_path):
    model = LanguageModel(LMConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1)).eval()
    loaded = load_model(save_model(model, tmp_path / "lm"))
    ids = torch.randint(4, 20, (1, 6))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_bad_directories_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not an aiayn model directory"):
        load_model(tmp_path / "empty")
    save_model(_small(), tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="model.safetensors is corrupt"):
        load_model(tmp_path / "m")
    save_model(_small(), tmp_path / "m2")
    meta = json.loads((tmp_path / "m2" / "config.json").read_text())
    meta["config"]["d_model"] = 32  # weights no longer match
    (tmp_path / "m2" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match config.json"):
        load_model(tmp_path / "m2")
    (tmp_path / "m2" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model(tmp_path / "m2")
