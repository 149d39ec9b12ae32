"""``aiayn attention``: one PNG per layer and kind, for translation models and LMs; errors."""

from aiayn.cli.main import main

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
