"""``aiayn attention``: one PNG per layer and kind, for translation models and LMs; errors."""

import argparse
import json
import shutil

from aiayn.cli.attention import _translation_maps
from aiayn.cli.main import main
from aiayn.decoding.translator import Translator

PNG = b"\x89PNG\r\n\x1a\n"


def test_translation_maps_with_and_without_target(model_dirs, tmp_path, capsys):
    for tgt in ([], ["--tgt", "A man rides"]):
        out = tmp_path / ("given" if tgt else "greedy")
        args = [
            "attention",
            "--model",
            str(model_dirs["joint"]),
            "--src",
            "Ein Mann",
            "--out",
            str(out),
            *tgt,
        ]
        assert main(args) == 0
        names = sorted(p.name for p in out.iterdir())
        assert names == sorted(
            f"{k}_layer{i}.png" for k in ("encoder", "decoder_self", "cross") for i in (0, 1)
        )
        assert all((out / n).read_bytes().startswith(PNG) for n in names)
        assert len(capsys.readouterr().out.splitlines()) == 6


def test_language_model_maps(model_dirs, tmp_path):
    assert (
        main(["attention", "--model", str(model_dirs["lm"]), "--src", "Ein Mann", "--out", str(tmp_path)])
        == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "decoder_self_layer0.png",
        "decoder_self_layer1.png",
    ]


def test_errors(model_dirs, tmp_path, capsys):
    args = ["attention", "--src", "x", "--out", str(tmp_path / "o")]
    assert main([*args, "--model", str(tmp_path / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main([*args, "--model", str(model_dirs["lm"]), "--tgt", "y"]) == 1
    assert "--tgt is for translation models" in capsys.readouterr().err
    assert main(["attention", "--model", str(model_dirs["joint"]), "--src", " ", "--out", str(tmp_path)]) == 1
    assert "--src is blank" in capsys.readouterr().err


def test_a_right_to_left_model_reads_the_given_target_backwards(model_dirs, tmp_path):
    """--tgt is written left to right; a reverse_target model reads (and is shown) its pieces reversed."""
    r2l = tmp_path / "r2l"
    shutil.copytree(model_dirs["joint"], r2l)
    meta = json.loads((r2l / "config.json").read_text())
    (r2l / "config.json").write_text(json.dumps({**meta, "reverse_target": True}))
    args = argparse.Namespace(model=str(r2l), device="cpu", src="Ein Mann", tgt="A man rides")
    _, labels = _translation_maps(args)
    tok = Translator.from_dir(r2l).tgt_tokenizer
    pieces = [tok.decode([i]).replace(" ", "␣") for i in tok.encode("A man rides")]
    assert labels["tgt"] == ["<s>", *pieces[::-1]]
