"""Model directories: safetensors + JSON round trip, and clear errors for bad directories."""

import json

import pytest
import torch

from aiayn import LanguageModel, LMConfig, Transformer, TransformerConfig
from aiayn.errors import ConfigError, ModelDirError
from aiayn.models.io import load_model, read_config, resolve_model_dir, save_model


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


def test_round_trip_keeps_an_output_layers_pieces(tmp_path):
    cfg = TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=16, n_heads=2, d_ff=32,
                            n_encoder_layers=1, n_decoder_layers=1, output_pieces=12)  # fmt: skip
    model = Transformer(cfg).eval()
    model.head.set_pieces(torch.arange(3, 30, 2)[:12])
    save_model(model, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    assert torch.equal(loaded.head.pieces, model.head.pieces)
    src, tgt = torch.randint(4, 30, (2, 5)), torch.randint(4, 30, (2, 4))
    torch.testing.assert_close(loaded(src, tgt), model(src, tgt), rtol=0, atol=0)
    with pytest.raises(ConfigError, match=r"output_pieces=31 must be an integer in \[0, tgt_vocab_size=30\]"):
        TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, output_pieces=31)


def test_round_trip_language_model(tmp_path):
    model = LanguageModel(LMConfig(vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=1)).eval()
    loaded = load_model(save_model(model, tmp_path / "lm"))
    ids = torch.randint(4, 20, (1, 6))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)


def test_bad_directories_give_clear_errors(tmp_path):
    with pytest.raises(ModelDirError, match="does not exist"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelDirError, match="not an aiayn model directory"):
        load_model(tmp_path / "empty")
    save_model(_small(), tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(ModelDirError, match="model.safetensors is corrupt or truncated"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(ModelDirError, match=r"model\.safetensors is missing"):
        load_model(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").mkdir()  # was called missing
    with pytest.raises(ModelDirError, match=r"model\.safetensors is a directory, not a file"):
        load_model(tmp_path / "m")
    save_model(_small(), tmp_path / "m2")
    meta = json.loads((tmp_path / "m2" / "config.json").read_text())
    meta["config"]["d_model"] = 32  # weights no longer match
    (tmp_path / "m2" / "config.json").write_text(json.dumps(meta))
    with pytest.raises(ModelDirError, match="do not belong to this config"):
        load_model(tmp_path / "m2")
    (tmp_path / "m2" / "config.json").write_text("{not json")
    with pytest.raises(ModelDirError, match="not valid JSON"):
        load_model(tmp_path / "m2")
    # before: a traceback (ValueError: an int over Python's 4300 digits; RecursionError), not one line
    for text, reason in (('{"d_model": ' + "9" * 5000 + "}", "digits"), ("[" * 100_000, "nested too deeply")):
        (tmp_path / "m2" / "config.json").write_text(text)
        message = rf"config\.json is not valid JSON \(.*{reason}.*\); restore it"
        with pytest.raises(ModelDirError, match=message):
            load_model(tmp_path / "m2")


def _edit_config(directory, edit) -> None:
    meta = json.loads((directory / "config.json").read_text())
    edit(meta)
    (directory / "config.json").write_text(json.dumps(meta))


@pytest.mark.parametrize("lang", [["en"], 3, None, "", " "])
def test_a_language_that_is_not_a_code_names_the_file_and_field(tmp_path, lang):
    """A list or number as tgt_lang reached sacreBLEU (a TypeError traceback in evaluate) and the
    server (500 on /languages); refused where config.json is read."""
    save_model(_small(), tmp_path / "m", tgt_lang="en")
    load_model(tmp_path / "m")
    _edit_config(tmp_path / "m", lambda meta: meta.update(tgt_lang=lang))
    with pytest.raises(ModelDirError, match=r"m/config\.json: field 'tgt_lang' must be a language code"):
        load_model(tmp_path / "m")


@pytest.mark.parametrize("kind", [["transformer"], 3, {"name": "transformer"}, None, "transformers"])
def test_kind_that_is_not_a_known_string_names_the_file_and_field(tmp_path, kind):
    save_model(_small(), tmp_path / "m")
    _edit_config(tmp_path / "m", lambda meta: meta.update(kind=kind))
    pattern = r"m/config\.json: field 'kind' is .*; expected one of 'encoder', 'lm', 'transformer'"
    with pytest.raises(ModelDirError, match=pattern):
        read_config(tmp_path / "m")
    with pytest.raises(ModelDirError, match=pattern):
        load_model(tmp_path / "m")


@pytest.mark.parametrize(("config", "got"), [("hello", "a string"), ([16, 2], "an array"), (None, "null")])
def test_config_that_is_not_an_object_names_the_file(tmp_path, config, got):
    save_model(_small(), tmp_path / "m")
    _edit_config(tmp_path / "m", lambda meta: meta.update(config=config))
    with pytest.raises(
        ModelDirError, match=rf"m/config\.json: field 'config' must be a JSON object, got {got}"
    ):
        load_model(tmp_path / "m")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("norm_first", "yes", r"norm_first='yes' must be true or false"),
        ("pad_id", "0", r"pad_id='0' must be an integer ≥ 0"),
        ("d_model", [16], r"d_model=\[16\] must be a positive integer"),
        ("dropout", True, r"dropout=True must be in \[0, 1\)"),
        ("d_modle", 16, r"unknown field\(s\) \['d_modle'\]"),
    ],
)
def test_config_field_of_the_wrong_type_names_the_file_and_field(tmp_path, field, value, message):
    save_model(_small(), tmp_path / "m")
    _edit_config(tmp_path / "m", lambda meta: meta["config"].update({field: value}))
    with pytest.raises(ModelDirError, match=r"m/config\.json: TransformerConfig.*" + message):
        load_model(tmp_path / "m")


def test_weights_of_another_shape_name_the_tensor_and_both_shapes(tmp_path):
    save_model(_small(), tmp_path / "m")
    _edit_config(tmp_path / "m", lambda meta: meta["config"].update(d_ff=64))
    with pytest.raises(ModelDirError) as info:
        load_model(tmp_path / "m")
    assert str(info.value) == (
        f"{tmp_path / 'm' / 'model.safetensors'}: tensor encoder.layers.0.ff.w_1.weight has shape (32, 16) "
        "but config.json implies (64, 16); the weights do not belong to this config"
    )


def test_a_config_deeper_than_its_weights_is_refused_before_any_layer_is_built(tmp_path, monkeypatch):
    """A 200-byte config.json asking for a million layers spent minutes and gigabytes building them
    (on the meta device) before the shapes were compared."""
    save_model(_small(), tmp_path / "m")
    _edit_config(tmp_path / "m", lambda meta: meta["config"].update(n_encoder_layers=1_000_000))
    monkeypatch.setattr("aiayn.models.io.build_model", lambda *a: pytest.fail("built before the check"))
    with pytest.raises(ModelDirError, match=r"m/config\.json: n_encoder_layers=1000000 but .* 1 layers"):
        load_model(tmp_path / "m")


def test_weights_of_another_depth_name_the_layer_counts(tmp_path):
    save_model(_small(), tmp_path / "m")
    _edit_config(tmp_path / "m", lambda meta: meta["config"].update(n_encoder_layers=2))
    with pytest.raises(ModelDirError, match=r"n_encoder_layers=2 but .*safetensors holds 1 layers"):
        load_model(tmp_path / "m")


def test_from_dict_refuses_a_non_object():
    with pytest.raises(ConfigError, match="TransformerConfig: config must be a JSON object, got str"):
        TransformerConfig.from_dict("hello")
    with pytest.raises(ConfigError, match="LMConfig: config must be a JSON object, got list"):
        LMConfig.from_dict([("d_model", 16)])


@pytest.mark.parametrize("made", ["int8", "bf16", "prepacked", "prepared, nothing packed"])
def test_a_model_made_for_inference_only_is_not_saved_over_a_good_one(made, tmp_path, monkeypatch):
    """Quantized and prepacked models hold other weights than a model directory's float32 ones (a
    packed model's are not all in its state dict; one that ``--gemm auto`` prepared but found nothing
    to pack has its cross-attention split, without ``w_qkv``): saving one is refused, and the directory
    keeps the model it held."""
    from aiayn.models import prepack as prepack_module
    from aiayn.models.quantize import quantize

    m = _small()
    save_model(m, tmp_path)
    before = (tmp_path / "model.safetensors").read_bytes()
    if made == "prepacked":
        prepack_module.prepack(m, "onednn")
    elif made.startswith("prepared"):
        if not prepack_module.available() or not prepack_module.packs_dtype(torch.float32):
            pytest.skip("no oneDNN kernels for float32 here: auto prepares nothing")
        monkeypatch.setattr(prepack_module, "faster_kernels", lambda shapes, dtype: set())
        prepack_module.prepack(m, "auto")
        prepack_module.prepack(m, "auto")  # twice: the split attention is left as it is
    else:
        quantize(m, made)
    with pytest.raises(ConfigError, match="quantized, prepacked or cast for inference"):
        save_model(m, tmp_path)
    assert (tmp_path / "model.safetensors").read_bytes() == before
    load_model(tmp_path)


def test_a_run_directory_resolves_to_its_latest_step_by_number(tmp_path):
    for step in (999_999, 1_000_000):
        save_model(_small(), tmp_path / f"step-{step:06d}")
    assert resolve_model_dir(tmp_path).name == "step-1000000"
