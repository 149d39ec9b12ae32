"""``aiayn translate`` end to end: pipe and files, line alignment, n-best, sampling, errors."""

import io
import subprocess
import sys

import pytest

from aiayn.cli.main import main


def _stdin(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_stdin_to_stdout_keeps_line_alignment(model_dirs, monkeypatch, capsys):
    _stdin(monkeypatch, "Ein Mann fährt Fahrrad.\n\nZwei Hunde\r\n   \nA".encode())
    assert main(["translate", "--model", str(model_dirs["joint"]), "--beam", "2"]) == 0
    out = capsys.readouterr().out
    assert out.endswith("\n")
    lines = out[:-1].split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[3] == ""


def test_a_gzipped_input_translates_as_the_plain_one_from_a_file_or_a_pipe(model_dirs, tmp_path, capsys):
    import gzip

    text = "Ein Mann fährt Fahrrad.\n\nZwei Hunde\n".encode()
    plain, packed = tmp_path / "in.de", tmp_path / "in.de.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    argv = ["translate", "--model", str(model_dirs["joint"]), "--beam", "2", "--input"]
    assert main([*argv, str(plain)]) == 0
    expected = capsys.readouterr().out
    assert len(expected.splitlines()) == 3
    assert main([*argv, str(packed)]) == 0
    assert capsys.readouterr().out == expected
    command = [sys.executable, "-m", "aiayn", *argv[:-1]]
    piped = subprocess.run(command, input=gzip.compress(text), capture_output=True, check=True)
    assert piped.stdout.decode() == expected
    packed.write_bytes(gzip.compress(text)[:-12])  # cut short: no end-of-stream marker
    assert main([*argv, str(packed)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"aiayn translate: error: {packed}: cannot read it") and err.count("\n") == 1


def test_a_byte_order_mark_before_the_first_line_is_not_text():
    from aiayn.cli.decode_options import read_lines
    from aiayn.data.files import BOM

    lines = read_lines(io.BytesIO(BOM + b"Ein Hund\r\n" + BOM + b"x\n"), "in.txt")
    assert list(lines) == ["Ein Hund", "\ufeffx"]  # only the file's first line can start with one


def test_a_seed_gives_a_repeated_line_new_samples_across_batches_and_chunks(
    model_dirs, tmp_path, monkeypatch, capsys
):
    """The same line six times, one sentence per batch (--max-tokens 1) and two lines per chunk: the
    samples differ (each copy draws from streams of its own, keyed by how many copies came before it,
    counted across chunks), and the same seed gives the same output again."""
    import aiayn.cli.decode_options

    monkeypatch.setattr(aiayn.cli.decode_options, "CHUNK_LINES", 2)
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad\n" * 6, encoding="utf-8")
    args = ["translate", "--model", str(model_dirs["joint"]), "--input", str(src), "--sample", "--seed", "1",
            "--max-len", "12", "--min-len", "12", "--max-tokens", "1"]  # fmt: skip
    outs = []
    for _ in range(2):
        assert main(args) == 0
        outs.append(capsys.readouterr().out.splitlines())
    assert outs[0] == outs[1] and len(outs[0]) == 6
    assert len(set(outs[0])) == 6  # six draws of 12 characters each: no two alike


def test_files_nbest_and_sampling(model_dirs, tmp_path, capsys):
    src = tmp_path / "in.de"
    src.write_text("Ein Mann\nZwei Hunde spielen\n", encoding="utf-8")
    out = tmp_path / "out.en"
    base = ["translate", "--model", str(model_dirs["src-tgt"]), "--input", str(src)]
    assert main([*base, "--output", str(out), "--beam", "1"]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    assert not list(tmp_path.glob("*.tmp")) and capsys.readouterr().out == ""
    assert main([*base, "--beam", "3", "--nbest", "3"]) == 0
    nbest = capsys.readouterr().out.splitlines()
    assert [line.split(" ||| ")[0] for line in nbest] == ["0"] * 3 + ["1"] * 3
    scores = [float(line.split(" ||| ")[2]) for line in nbest[:3]]
    assert scores == sorted(scores, reverse=True)
    runs = []
    for _ in range(2):
        assert main([*base, "--sample", "--top-p", "0.9", "--temperature", "0.7", "--seed", "3"]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1]


def test_truncation_warns_and_strict_refuses(model_dirs, tmp_path, capsys):
    src = tmp_path / "in.de"
    src.write_text("Ein Mann fährt Fahrrad.\nZwei\n", encoding="utf-8")
    base = ["translate", "--model", str(model_dirs["joint"]), "--input", str(src), "--max-src-len", "8"]
    assert main([*base, "--beam", "1"]) == 0
    err = capsys.readouterr().err
    assert "line 1 is over 8 source tokens; truncated" in err and "line 2" not in err
    assert main([*base, "--strict"]) == 1
    assert "line 1 has 24 source tokens, over the maximum of 8" in capsys.readouterr().err


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "does not exist"),
        ("lm", "holds a language model (kind 'lm')"),
        ("corrupt", "model.safetensors is corrupt"),
        ("bad-utf8", "<stdin>: line 2 is not valid UTF-8"),
        ("sample-beam", "--beam 7 sizes a beam search, which --sample does not run"),
        ("sample-beam-4", "--beam 4 sizes a beam search, which --sample does not run"),  # the default, given
        # each sample is a row decoded beside the others: a million ran out of memory with a traceback
        ("samples", "--nbest 1025: --sample draws at most 1024 samples per input"),
    ],
)
def test_errors_are_one_line(case, message, model_dirs, tmp_path, monkeypatch, capsys):
    model = {"missing": tmp_path / "nope", "lm": model_dirs["lm"]}.get(case, model_dirs["joint"])
    if case == "corrupt":
        model = tmp_path / "corrupt"
        model.mkdir()
        for f in model_dirs["joint"].iterdir():
            (model / f.name).write_bytes(f.read_bytes())
        (model / "model.safetensors").write_bytes(b"\x00garbage")
    _stdin(monkeypatch, b"Ein Mann\nfa\xe4hrt\n")
    extra = {"sample-beam": ["--sample", "--beam", "7"], "sample-beam-4": ["--sample", "--beam", "4"],
             "samples": ["--sample", "--nbest", "1025"]}.get(case, [])  # fmt: skip
    assert main(["translate", "--model", str(model), *extra]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("aiayn translate: error:")


def test_works_as_a_pipe(model_dirs):
    proc = subprocess.run(
        [sys.executable, "-m", "aiayn", "translate", "--model", str(model_dirs["joint"]), "--beam", "1"],
        input="Ein Mann fährt Fahrrad.\n".encode(),
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert len(proc.stdout.decode().splitlines()) == 1


def test_a_reader_that_goes_away_ends_it_quietly(model_dirs, tmp_path):
    """`aiayn translate … | head -n 1`: the writes after the reader closed its end are dropped, the
    command ends with 141 (as `yes | head` ends yes) and says nothing: no error line, and no notice of
    Python's about a BrokenPipeError at exit."""
    source = tmp_path / "in.de"
    source.write_text("Ein Mann fährt Fahrrad.\n" * 12_000)  # over a pipe's buffer of output
    command = [sys.executable, "-m", "aiayn", "translate", "--model", str(model_dirs["joint"]), "--beam", "1"]
    with open(source, "rb") as stdin:
        proc = subprocess.Popen(command, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=120) == 141, err.decode()
    assert first.endswith(b"\n") and err == b""


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_quantize_translates_and_unknown_precisions_are_refused(model_dirs, monkeypatch, capsys, precision):
    args = ["translate", "--model", str(model_dirs["joint"]), "--beam", "2"]
    _stdin(monkeypatch, "Ein Mann fährt Fahrrad.\nZwei Hunde\n".encode())
    assert main([*args, "--quantize", precision]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--quantize", "int4"])
    assert exit_info.value.code == 2 and "--quantize: invalid choice: 'int4'" in capsys.readouterr().err


def test_gemm_onednn_translates_as_blas_does_and_mixing_it_with_int8_is_one_line(
    model_dirs, monkeypatch, capsys
):
    args = ["translate", "--model", str(model_dirs["joint"]), "--beam", "2", "--nbest", "2"]
    outputs = {}
    for gemm in ("blas", "onednn", "auto"):
        _stdin(monkeypatch, "Ein Mann fährt Fahrrad.\nZwei Hunde\n".encode())
        assert main([*args, "--gemm", gemm]) == 0
        outputs[gemm] = capsys.readouterr().out
    assert outputs["onednn"] == outputs["blas"] == outputs["auto"] and len(outputs["blas"].splitlines()) == 4
    _stdin(monkeypatch, b"Ein Mann\n")
    assert main([*args, "--gemm", "onednn", "--quantize", "int8"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--quantize int8" in err


def test_mbr_from_the_command_line(model_dirs, monkeypatch, capsys):
    model = str(model_dirs["joint"])
    _stdin(monkeypatch, b"Ein Mann\nZwei Hunde spielen\n")
    assert main(["translate", "--model", model, "--beam", "4", "--nbest", "2", "--mbr", "chrf"]) == 0
    assert [line.split(" ||| ")[0] for line in capsys.readouterr().out.splitlines()] == ["0", "0", "1", "1"]
    _stdin(monkeypatch, b"Ein Mann\n")
    assert main(["translate", "--model", model, "--beam", "4", "--mbr", "bleu", "--rerank-with", model]) == 1
    err = capsys.readouterr().err
    assert "--rerank-with and --mbr both choose" in err and err.count("\n") == 1


def test_evaluate_mbr_tokenizes_its_bleu_for_the_given_target_language(model_dirs, tmp_path, monkeypatch):
    """A model that names no target language (a Marian folder may not) scored with --tgt-lang zh: the
    minimum-Bayes-risk choice tokenizes as the score does, not with 13a, which scores Chinese near 0."""
    from aiayn.decoding import translator

    seen = []
    real = translator.mbr_order

    def spy(texts, utility, lang):
        seen.append(lang)
        return real(texts, utility, lang)

    monkeypatch.setattr(translator, "mbr_order", spy)
    (tmp_path / "s.de").write_text("Ein Mann\n", encoding="utf-8")
    (tmp_path / "r.zh").write_text("一个男人\n", encoding="utf-8")
    src, ref = str(tmp_path / "s.de"), str(tmp_path / "r.zh")
    files = ["--src", src, "--ref", ref, "--src-lang", "de", "--tgt-lang", "zh"]
    args = ["evaluate", "--model", str(model_dirs["joint"]), *files, "--beam", "3", "--mbr", "bleu"]
    assert main(args) == 0
    assert seen == ["zh"]


@pytest.fixture(scope="module")
def bidir_dir(tmp_path_factory):
    from tests.decoding.fixtures import translation_dir

    return translation_dir(tmp_path_factory.mktemp("bidir") / "m", eos_bias=1.5, seed=1, bidirectional=True)


LINES = ["Zwei Hunde spielen im Schnee", "Ein Mann", "A man rides a bike. Two dogs"]  # lengths unsorted


def test_a_bidirectional_model_shows_the_right_to_left_translation_it_read(bidir_dir, tmp_path, capsys):
    """Each hypothesis carries the right-to-left hypothesis of its own sentence (the search sorts a
    batch by length: each line decoded alone gives the same), and ``--show-r2l`` prints it left to
    right after a tab, or as one more n-best field; a plain model refuses the flag in one line."""
    from aiayn.decoding.options import SearchConfig
    from aiayn.decoding.translator import Translator

    t = Translator.from_dir(bidir_dir)
    config = SearchConfig(beam=3, nbest=2)
    together = t.search(t.encode(LINES)[0], config)
    alone = [t.search(t.encode([line])[0], config)[0] for line in LINES]
    for hyps, single in zip(together, alone):
        assert [h.r2l.tokens for h in hyps] == [single[0].r2l.tokens] * 2
    texts = [t.detokenize_r2l(hyps[0]) for hyps in together]
    assert all(texts) and len(set(texts)) >= 2, texts  # not one memory for all (two may run to one limit)
    r2l = together[0][0].r2l
    assert texts[0] == t.tgt_tokenizer.decode([x for x in r2l.tokens if x != 2][::-1])
    src = tmp_path / "in.de"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    base = ["translate", "--model", str(bidir_dir), "--input", str(src), "--beam", "3"]
    assert main([*base, "--show-r2l"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{t.detokenize(h[0])}\t{r}" for h, r in zip(together, texts)]
    assert main([*base, "--nbest", "2", "--show-r2l"]) == 0
    nbest = [line.split(" ||| ") for line in capsys.readouterr().out.splitlines()]
    assert [(f[0], f[3]) for f in nbest] == [(str(i), r) for i, r in enumerate(texts) for _ in range(2)]
    plain = tmp_path / "plain"
    from tests.decoding.fixtures import translation_dir

    translation_dir(plain)
    assert main(["translate", "--model", str(plain), "--input", str(src), "--show-r2l"]) == 1
    err = capsys.readouterr().err
    assert "--show-r2l" in err and "not a bidirectional model" in err and len(err.strip().splitlines()) == 1
    assert main(["translate", "--model", str(plain), "--input", str(src), "--r2l-beam", "2"]) == 1
    err = capsys.readouterr().err  # read by a bidirectional model only: refused, not ignored
    assert "--r2l-beam" in err and "not a bidirectional model" in err and len(err.strip().splitlines()) == 1


def test_a_translation_is_one_line_whatever_pieces_the_model_writes(tmp_path, monkeypatch, capsys):
    """Byte-fallback pieces decode to any character. A model that wrote ``<0x0A>`` (a line break)
    shifted every later output line against its source: 2 inputs gave 6 lines before."""
    import torch

    from aiayn import TransformerConfig, build_transformer
    from aiayn.data.tokenizer import SentencePieceTokenizer
    from aiayn.decoding.translator import one_line
    from aiayn.models.io import save_model
    from tests.decoding.fixtures import TINY

    tok = SentencePieceTokenizer.train(
        ["the cat sat on the mat and the dog sat on the log"] * 50, vocab_size=300
    )
    sizes = dict(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, n_encoder_layers=1)
    model = build_transformer(TransformerConfig(n_decoder_layers=1, output_bias=True, **sizes, **TINY)).eval()
    with torch.no_grad():
        model.head.bias[tok.sp.piece_to_id("<0x0A>")] = 100.0  # every step writes a line break
    save_model(model, tmp_path / "m")
    tok.save(tmp_path / "m")
    _stdin(monkeypatch, b"the cat\nthe dog\n")
    assert main(["translate", "--model", str(tmp_path / "m"), "--beam", "2", "--max-len", "2"]) == 0
    assert capsys.readouterr().out.count("\n") == 2
    assert one_line("a\nb\r\nc\rd\u2028e\x85f\tg\n") == "a b c d e f g"


def test_a_demo_stopped_by_a_signal_decodes_nothing_and_exits_as_the_signal(tmp_path, monkeypatch, capsys):
    """Ctrl-C during the demo's training stopped the training, then the demo decoded the test set,
    printed its advice and exited 0."""
    import signal

    from aiayn.decoding.translator import Translator
    from aiayn.training import trainer

    monkeypatch.setattr(trainer.Trainer, "fit", lambda self: {"step": 3, "reason": "SIGINT"})
    monkeypatch.setattr(Translator, "from_dir", lambda *a, **k: pytest.fail("decoded after the signal"))
    assert main(["demo", "--out", str(tmp_path / "d"), "--minutes", "1"]) == 128 + signal.SIGINT
    assert "stopped by SIGINT after 3 updates" in capsys.readouterr().err
