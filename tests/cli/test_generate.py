"""``aiayn generate``: seeded samples from a language model, greedy, errors."""

from aiayn.cli.main import main


def test_seeded_samples(model_dirs, capsys):
    args = ["generate", "--model", str(model_dirs["lm"]), "--prompt", "Ein ", "--max-new-tokens", "20"]
    outs = []
    for _ in range(2):
        assert (
            main([*args, "--num-samples", "2", "--seed", "4", "--top-k", "10", "--temperature", "0.8"]) == 0
        )
        outs.append(capsys.readouterr().out)
    assert outs[0] == outs[1]
    samples = outs[0].rstrip("\n").split("\n---------------\n")
    assert len(samples) == 2 and all(s.startswith("Ein ") and len(s) == 24 for s in samples)
    assert main([*args, "--greedy"]) == 0
    assert capsys.readouterr().out.startswith("Ein ")


def test_errors(model_dirs, capsys):
    assert main(["generate", "--model", str(model_dirs["joint"])]) == 1
    assert "this command needs a language model" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dirs["lm"]), "--prompt", ""]) == 1
    assert "prompt is empty" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dirs["lm"]), "--prompt", "Ein \u2713 Mann"]) == 1
    assert "the prompt has characters this model's vocabulary lacks ('\u2713')" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dirs["lm"]), "--prompt", "Ein\tMann,\u2713\x07"]) == 1
    assert "vocabulary lacks ('\\x07', '\\t', ',', '\u2713');" in capsys.readouterr().err  # whitespace shown
    assert main(["generate", "--model", str(model_dirs["lm"]), "--top-p", "2"]) == 1
    assert "top_p=2.0 must be in (0, 1]" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dirs["lm"]), "--greedy", "--top-k", "40"]) == 1
    assert "--greedy takes the most probable token, so --top-k would be ignored" in capsys.readouterr().err
    # before: a traceback (an allocation of terabytes, or an overflow), not one line
    for n, length in (("100000000", "5"), ("1", "100000000000000000000")):
        assert main(["generate", "--model", str(model_dirs["lm"]), "--prompt", "Ein", "--num-samples", n,
                     "--max-new-tokens", length, "--seed", "1"]) == 1  # fmt: skip
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "is over 16,777,216 tokens; ask for fewer" in err[0], err
