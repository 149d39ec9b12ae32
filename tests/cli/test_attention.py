"""``aiayn attention``: one PNG per layer and kind, for translation models and LMs; errors."""

import argparse
import json
import shutil

import pytest

from aiayn.cli.attention import _translation_maps, token_labels
from aiayn.cli.main import main
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import Translator
from tests.decoding.fixtures import translation_dir

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
    lm = ["attention", "--model", str(model_dirs["lm"]), "--out", str(tmp_path / "o")]
    assert main([*lm, "--src", "Ein \u2713"]) == 1  # drawn as an unknown id the model never read
    assert (
        "--src: the prompt has characters this model's vocabulary lacks ('\u2713')" in capsys.readouterr().err
    )
    assert main([*lm, "--src", ""]) == 1
    assert "--src is empty" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


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


def test_the_maps_go_only_where_nothing_else_is_overwritten(model_dirs, tmp_path, capsys):
    """A rerun replaces its own maps; a folder holding anything else, a file, and a folder inside the
    model are refused with one line before any work, and nothing in them changes."""
    model = tmp_path / "model"
    shutil.copytree(model_dirs["joint"], model)
    args = ["attention", "--model", str(model), "--src", "Ein Mann", "--out"]
    maps = tmp_path / "maps"
    assert main([*args, str(maps)]) == 0 and main([*args, str(maps)]) == 0  # a rerun, over its own maps
    # another model's maps replace them as a set: no translation model's layer is left beside the LM's
    lm = ["attention", "--model", str(model_dirs["lm"]), "--src", "Ein", "--out", str(maps)]
    assert main(lm) == 0
    assert sorted(p.name for p in maps.iterdir()) == ["decoder_self_layer0.png", "decoder_self_layer1.png"]
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine\n")
    before = sorted(p.name for p in model.iterdir())
    capsys.readouterr()
    for out, fragment in ((notes, "holds files this command does not write (todo.txt)"),
                          (notes / "todo.txt", "is a file; give a folder"),
                          (model / "maps", "is inside")):  # fmt: skip
        assert main([*args, str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and fragment in err[0], err
    assert sorted(p.name for p in notes.iterdir()) == ["todo.txt"]
    assert (notes / "todo.txt").read_text() == "mine\n"
    assert sorted(p.name for p in model.iterdir()) == before


def test_a_piece_with_two_dollar_signs_is_a_label_not_a_formula():
    """matplotlib reads ``$$`` as mathtext (and fails to parse it): a BPE vocabulary has such pieces."""
    import torch

    from aiayn.viz.attention import plot_heads
    from aiayn.viz.figures import png_bytes

    fig = plot_heads(torch.full((2, 2, 3), 1 / 3), ["$$", "a$b$"], ["$$", "x", "$5 and $6"], "title")
    assert png_bytes(fig).startswith(PNG)


def test_a_bidirectional_models_maps_read_the_right_to_left_search_translate_runs(tmp_path):
    """Before, attention ran the right-to-left pass greedily where the model's config.json says
    r2l_beam (the cache's search, which aiayn translate runs): it drew another memory than it reads."""
    bidir = translation_dir(tmp_path / "bidir", eos_bias=1.5, seed=1, bidirectional=True)
    meta = json.loads((bidir / "config.json").read_text())
    (bidir / "config.json").write_text(json.dumps({**meta, "r2l_beam": 4}))
    translator = Translator.from_dir(bidir)
    c = translator.model.config
    for text in ("Ein Mann", "Zwei Hunde spielen", "Fahrrad", "im Schnee!", "A man rides"):
        _, labels = _translation_maps(argparse.Namespace(model=str(bidir), device="cpu", src=text, tgt=None))
        hyp = translator.search([translator.src_tokenizer.encode(text)], SearchConfig(beam=1))[0][0]
        r2l = [c.bos_id, *(t for t in hyp.r2l.tokens if t != c.eos_id)]
        assert labels["r2l"] == token_labels(translator.tgt_tokenizer, r2l, c), text


def test_a_translation_cut_at_its_length_limit_is_drawn_as_the_decoder_read_it(tmp_path, capsys):
    """Before, the greedy output's last token was drawn as a decoder position (one past a learned
    table: an error), though no position reads the token the last one predicts."""
    model = translation_dir(tmp_path / "m", eos_bias=-20.0, positional="learned", max_len=16)  # no eos
    args = argparse.Namespace(model=str(model), device="cpu", src="Ein Mann", tgt=None)
    _, labels = _translation_maps(args)
    assert len(labels["tgt"]) == 16 and labels["tgt"][0] == "<s>"  # <s> + 15 of the 16 tokens written
    assert main(["attention", "--model", str(model), "--src", "Ein Mann", "--tgt", "x" * 16,
                 "--out", str(tmp_path / "o")]) == 1  # fmt: skip
    assert "--tgt has 17 tokens with <s>; this model reads at most 16" in capsys.readouterr().err


@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_greedy_translation_is_drawn_over_no_more_tokens_than_a_map_holds(tmp_path, bidirectional):
    """A 251-token source may translate to 301 tokens (its length + 50) where eos never comes: the
    greedy translation is cut at the 256 tokens an axis holds, and so is a bidirectional model's
    memory ([bos] + its tokens, here under its margin of the source's length + 10)."""
    model = translation_dir(tmp_path / "m", eos_bias=-20.0, seed=1, bidirectional=bidirectional)
    src = " ".join(["Ein Mann"] * 28)  # 251 characters: 251 pieces and </s>
    maps, labels = _translation_maps(argparse.Namespace(model=str(model), device="cpu", src=src, tgt=None))
    assert len(labels["src"]) == 252
    assert len(labels["tgt"]) == (255 if bidirectional else 256)
    assert maps["cross"][0].shape[-2:] == (len(labels["tgt"]), 252)
    if bidirectional:
        assert len(labels["r2l"]) == 256 and maps["cross_r2l"][0].shape[-1] == 256


def test_a_language_model_is_drawn_over_no_more_than_the_context_it_was_trained_on(
    model_dirs, tmp_path, capsys
):
    lm = tmp_path / "lm"
    shutil.copytree(model_dirs["lm"], lm)
    meta = json.loads((lm / "config.json").read_text())
    (lm / "config.json").write_text(json.dumps({**meta, "trained_max_len": 4}))  # as aiayn generate reads it
    assert main(["attention", "--model", str(lm), "--src", "Ein Mann", "--out", str(tmp_path / "o")]) == 1
    assert "--src has 8 tokens; this model reads at most 4" in capsys.readouterr().err
