"""Export to CTranslate2: ``ctranslate2.Translator`` on the converted model gives token for token
aiayn's greedy and beam-4 outputs, in several configurations; what cannot map is refused by name."""

import gzip
from pathlib import Path

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from aiayn import BidirectionalTransformer, Transformer, TransformerConfig  # noqa: E402
from aiayn.data import CharTokenizer, SentencePieceTokenizer, data_dir  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.device import cpu_flags  # noqa: E402
from aiayn.errors import ModelDirError  # noqa: E402
from aiayn.interop.ctranslate2 import export_ctranslate2  # noqa: E402
from tests.helpers import randomise_  # noqa: E402

CONFIGS = {
    "paper": {},
    "pre-norm-gelu": dict(norm_first=True, activation="gelu"),
    "prj-bias-learned": dict(emb_scale="prj", output_bias=True, positional="learned"),
    "marian-like": dict(emb_scale="none", activation="silu", positional="sinusoidal_halves", ln_eps=1e-6),
    "untied-unshared-nobias": dict(share_embeddings=False, tie_output=False, bias=False),
    "target-pieces-bias": dict(output_pieces=600, output_bias=True),  # output_vocab="target"
    # sinusoids are computed at any position: sentences and outputs longer than max_len translate
    "paper-max-len-8": dict(max_len=8),
    "decoder-starts-from-pad": dict(bos_id=0),  # Marian's convention: CTranslate2 started from <s>
}


@pytest.fixture(scope="module")
def data():
    def read(name):
        with gzip.open(data_dir() / "multi30k" / name, "rt", encoding="utf-8") as f:
            return f.read().splitlines()

    tok = SentencePieceTokenizer.train(read("train.de.gz")[:3000], 1000)
    return tok, read("val.de.gz")[:40]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_and_beam_outputs_are_token_identical(name, data, tmp_path):
    tok, sentences = data
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size,
                                      n_encoder_layers=2, n_decoder_layers=2, d_model=32, n_heads=4, d_ff=64,
                                      dropout=0.0, **CONFIGS[name])).eval()  # fmt: skip
    randomise_(m)  # every bias and norm gain random: a mapping that dropped or swapped one would show
    if m.head.bias is not None:
        with torch.no_grad():
            m.head.bias.normal_()  # a bias that matters
    if m.head.pieces is not None:  # eos, unk and 598 others; the rest get −∞ in CTranslate2's bias
        others = torch.randperm(tok.vocab_size - 4, generator=torch.Generator().manual_seed(0))[:598] + 4
        m.head.set_pieces(torch.cat([torch.tensor([m.config.eos_id, m.config.unk_id]), others]))
    export_ctranslate2(m, tok, tok, tmp_path / "ct2")
    theirs_model = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    ours_model = Translator(m, tok, tok)
    sources, _ = ours_model.encode(sentences)
    for beam in (1, 4):
        ours = ours_model.search(sources, SearchConfig(beam=beam, lenpen=0.0, max_len=20))
        pieces = [[tok.sp.id_to_piece(i) for i in s] for s in sources]
        options = dict(
            beam_size=beam, length_penalty=0.0, max_decoding_length=20, min_decoding_length=0
        )  # its default: 1
        theirs = theirs_model.translate_batch(pieces, **options)
        a = [[t for t in h[0].tokens if t != m.config.eos_id] for h in ours]
        b = [[tok.sp.piece_to_id(p) for p in r.hypotheses[0]] for r in theirs]
        assert a == b, f"{name}, beam {beam}"
        if m.head.pieces is not None:
            assert {i for s in a for i in s} <= set(m.head.pieces.tolist())
    assert any(len(x) > 2 for x in a)


def test_int8_exports_and_translates(data, tmp_path):
    """The int8 export holds 8-bit weights and scores a translation as the float32 export does,
    within int8's rounding (with VNNI; looser where CTranslate2's int8 kernel saturates, below)."""
    tok, sentences = data
    sizes = dict(n_encoder_layers=1, n_decoder_layers=1, d_model=32, n_heads=4, d_ff=64)
    torch.manual_seed(0)
    m = Transformer(TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, **sizes))
    out = export_ctranslate2(m.eval(), tok, tok, tmp_path / "int8", quantization="int8")
    full = export_ctranslate2(m, tok, tok, tmp_path / "float32")
    assert (out / "model.bin").stat().st_size < 0.7 * (full / "model.bin").stat().st_size
    pieces = [tok.sp.encode(s, out_type=str) for s in sentences[:8]]
    targets = [tok.sp.encode(s, out_type=str)[:10] for s in sentences[8:16]]
    int8, fp32 = (
        ctranslate2.Translator(str(d), compute_type=t) for d, t in ((out, "int8"), (full, "float32"))
    )
    a, b = (t.score_batch(pieces, targets) for t in (int8, fp32))
    assert [len(x.log_probs) for x in a] == [len(y.log_probs) for y in b]
    x, y = (torch.tensor([v for r in results for v in r.log_probs]) for results in (a, b))
    if cpu_flags() & {"avx512_vnni", "avx_vnni"}:
        assert x.tolist() == pytest.approx(y.tolist(), abs=0.05)
    else:  # its AVX2 int8 product saturates pairs of 8-bit products at 16 bits: scores move by up to a
        # nat on a random model, but still follow float32's token by token (a wrong export would not)
        assert (x - y).abs().mean() < 0.4 and torch.corrcoef(torch.stack([x, y]))[0, 1] > 0.9
    assert isinstance(int8.translate_batch(pieces[:1])[0].hypotheses[0], list)


def test_a_directory_with_files_is_never_written_over(data, tmp_path):
    """CTranslate2's converter deletes its output directory first: one with files is refused."""
    tok, _ = data
    sizes = dict(n_encoder_layers=1, n_decoder_layers=1, d_model=32, n_heads=4, d_ff=64)
    m = Transformer(TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, **sizes))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    with pytest.raises(ModelDirError, match="not an empty directory"):
        export_ctranslate2(m.eval(), tok, tok, tmp_path / "run")
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    assert (export_ctranslate2(m, tok, tok, tmp_path / "empty") / "model.bin").is_file()


def test_what_does_not_map_is_refused_by_name(data, tmp_path):
    tok, _ = data
    small = dict(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, n_encoder_layers=1,
                 n_decoder_layers=1, d_model=32, n_heads=4, d_ff=64)  # fmt: skip
    cases = [
        (BidirectionalTransformer(TransformerConfig(**small, bidirectional=True)), tok, "bidirectional"),
        (Transformer(TransformerConfig(**small, d_k=4, d_v=4)), tok, "d_k=4"),
        (Transformer(TransformerConfig(**small)), CharTokenizer.train("abc"), "CharTokenizer"),
    ]
    for model, t, fragment in cases:
        with pytest.raises(ModelDirError, match=fragment):
            export_ctranslate2(model, t, t, tmp_path / "x")
    with pytest.raises(ModelDirError, match="quantization 'int3'"):
        export_ctranslate2(cases[0][0], tok, tok, tmp_path / "x", quantization="int3")


def test_export_from_the_command_line(data, tmp_path, capsys):
    from aiayn.cli.main import main
    from aiayn.models.io import save_model

    tok, sentences = data
    sizes = dict(n_encoder_layers=1, n_decoder_layers=1, d_model=32, n_heads=4, d_ff=64)
    model_dir = tmp_path / "model"
    vocab = dict(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size)
    save_model(Transformer(TransformerConfig(**vocab, **sizes)), model_dir)
    tok.save(model_dir)
    out = tmp_path / "ct2"
    assert main(["export", "--model", str(model_dir), "--to", "ctranslate2", str(out)]) == 0
    assert (out / "model.bin").is_file()
    assert main(["export", "--model", str(model_dir), "--to", "ctranslate2", str(out)]) == 1  # holds a model
    assert main(["export", "--model", str(model_dir), "--to", "ctranslate2", str(out), "--force",
                 "--quantization", "int8"]) == 0  # fmt: skip
    assert (
        main(
            [
                "export",
                "--model",
                str(model_dir),
                "--to",
                "hf",
                str(tmp_path / "hf"),
                "--quantization",
                "int8",
            ]
        )
        == 1
    )
    assert "--quantization is for --to ctranslate2" in capsys.readouterr().err


def test_a_failed_export_leaves_nothing_under_the_name(data, tmp_path, monkeypatch):
    """The converter writes into a temporary directory; one that fails half-way leaves no directory
    (nor a half model.bin) under the name asked for, and a retry then succeeds."""
    from ctranslate2.specs.model_spec import ModelSpec

    tok, _ = data
    sizes = dict(n_encoder_layers=1, n_decoder_layers=1, d_model=32, n_heads=4, d_ff=64)
    m = Transformer(TransformerConfig(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, **sizes))
    save = ModelSpec.save

    def half(self, output_dir):
        (Path(output_dir) / "model.bin").write_bytes(b"half")
        raise OSError("disk gone")

    monkeypatch.setattr(ModelSpec, "save", half)
    with pytest.raises(OSError, match="disk gone"):
        export_ctranslate2(m.eval(), tok, tok, tmp_path / "ct2")
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    monkeypatch.setattr(ModelSpec, "save", save)
    assert (export_ctranslate2(m, tok, tok, tmp_path / "ct2") / "model.bin").stat().st_size > 1000
