"""aiayn models written as HF directories: transformers loads them and computes the same logits."""

import json

import pytest
import torch

from aiayn import EncoderConfig, EncoderModel, LanguageModel, LMConfig, Transformer, TransformerConfig
from aiayn.cli.main import main
from aiayn.data import CharTokenizer
from aiayn.decoding.adapters import LMAdapter
from aiayn.decoding.generator import Generator
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.search import search
from aiayn.decoding.translator import Translator
from aiayn.errors import ModelDirError
from aiayn.interop import export_hf, from_pretrained
from aiayn.interop.hf import SINUSOID_ROWS
from aiayn.models.io import save_model
from tests.decoding.fixtures import lm_dir
from tests.helpers import assert_close
from tests.interop.hf_builders import marian, padded_ids, randomise_, transformers

SMALL = dict(d_model=32, n_heads=4, d_ff=48, dropout=0.0)
TRANSFORMERS = {
    "paper-interleaved": {},  # exported through the d_model permutation
    "halves-silu-untied": dict(positional="sinusoidal_halves", activation="silu", tie_output=False),
    "prj-scaled-no-bias": dict(emb_scale="prj", bias=False, n_encoder_layers=1),
    "separate-vocabs-gelu": dict(share_embeddings=False, tgt_vocab_size=40, activation="gelu"),
    "shared-untied-gelu-tanh": dict(tie_output=False, activation="gelu_tanh", output_bias=True),
    "target-pieces": dict(output_pieces=30),  # output_vocab="target": −∞ in final_logits_bias elsewhere
}
LMS = {
    "gpt2-shaped": dict(norm_first=True, positional="learned", activation="gelu_tanh", emb_scale="none"),
    "pre-norm-sinusoidal-emb-scaled": dict(norm_first=True),
    "pre-norm-prj-untied-no-bias": dict(norm_first=True, emb_scale="prj", tie_output=False, bias=False),
}


def random_transformer(**kw) -> Transformer:
    torch.manual_seed(0)
    base = dict(src_vocab_size=50, tgt_vocab_size=50, n_encoder_layers=2, n_decoder_layers=2,
                output_bias=True, max_len=64, **SMALL)  # fmt: skip
    cfg = TransformerConfig(**{**base, **kw})
    return randomise_(Transformer(cfg))


@pytest.mark.parametrize("name", list(TRANSFORMERS))
def test_transformer_exports_as_marian(tmp_path, name):
    ours = random_transformer(**TRANSFORMERS[name])
    if ours.head.pieces is not None:
        others = [i for i in range(2, 50) if i != ours.config.unk_id]
        ours.head.set_pieces([ours.config.unk_id] + [others[i] for i in torch.randperm(len(others))[:29]])
    export_hf(ours, tmp_path)
    hf = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    c = ours.config
    src, src_mask = padded_ids([6, 9, 3], 4, c.src_vocab_size, c.pad_id)
    tgt = torch.randint(4, c.tgt_vocab_size, (3, 5))
    tgt[:, 0] = c.bos_id
    with torch.no_grad():
        ref, logits = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits, ours(src, tgt)
    if ours.head.pieces is not None:  # the same −∞ outside the pieces, the same logits at them
        assert torch.equal(torch.isneginf(logits), torch.isneginf(ref)) and torch.isneginf(ref).any()
        ref, logits = ref[..., ours.head.pieces], logits[..., ours.head.pieces]
    assert_close(f"export Marian[{name}] logits in transformers", logits, ref, atol=1e-4)


@pytest.mark.parametrize("name", list(LMS))
def test_language_model_exports_as_gpt2(tmp_path, name):
    torch.manual_seed(0)
    ours = randomise_(
        LanguageModel(LMConfig(vocab_size=40, n_layers=2, max_len=32, **{**SMALL, **LMS[name]}))
    )
    export_hf(ours, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 40, (2, 11))
    with torch.no_grad():
        assert_close(f"export GPT-2[{name}] logits in transformers", ours(ids), hf(ids).logits, atol=1e-4)


def test_a_sinusoidal_language_model_exports_the_context_it_trained_on(tmp_path):
    """n_positions was max_len (16) though the run trained on 40 tokens and aiayn generates from 40."""
    from aiayn.interop.gpt2 import export_gpt2

    torch.manual_seed(0)
    config = LMConfig(
        vocab_size=40, n_layers=1, max_len=16, **{**SMALL, **LMS["pre-norm-sinusoidal-emb-scaled"]}
    )
    ours = randomise_(LanguageModel(config))
    export_gpt2(ours, tmp_path, trained_max_len=40)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    assert hf.config.n_positions == 40
    with pytest.raises(ValueError, match="backend tokenizer"):  # no GPT-2 files: not an empty GPT2Tokenizer
        transformers.AutoTokenizer.from_pretrained(tmp_path)
    ids = torch.randint(0, 40, (2, 40))
    with torch.no_grad():
        assert_close("export GPT-2 past max_len, in transformers", ours(ids), hf(ids).logits, atol=1e-4)


def test_transformers_generate_on_the_export_never_emits_padding_either(tmp_path):
    """aiayn's searches never emit padding; the export's generation_config.json (bad_words_ids, as
    OPUS-MT's configs have) makes transformers' generate the same, even where the model wants it."""
    ours = random_transformer().eval()
    with torch.no_grad():
        ours.head.bias[ours.config.pad_id] = 30.0  # padding is every step's argmax
    export_hf(ours, tmp_path)
    hf = transformers.MarianMTModel.from_pretrained(tmp_path).eval()
    src = torch.tensor([[5, 6, 7, ours.config.eos_id]])
    with torch.no_grad():
        out = hf.generate(input_ids=src, num_beams=1, do_sample=False, max_new_tokens=6, min_new_tokens=6)
    theirs = out[0, 1:].tolist()
    (hyp,) = Translator(ours, CharTokenizer.train("abc"), CharTokenizer.train("abc")).search(
        [src[0, :-1].tolist()], SearchConfig(beam=1, max_len=6, min_len=6)
    )[0]  # the tokenizers are not read: the search runs on ids
    assert ours.config.pad_id not in theirs and theirs == hyp.tokens


def test_transformers_generate_on_a_gpt2_export_never_emits_padding_either(tmp_path):
    """The same for a language model: its final LayerNorm made constant (gain 0, bias b) and the
    padding row of its untied head 10·b, every step's argmax is padding."""
    torch.manual_seed(0)
    ours = LanguageModel(LMConfig(vocab_size=40, n_layers=1, max_len=32, **{**SMALL, **LMS["gpt2-shaped"]},
                                  tie_output=False)).eval()  # fmt: skip
    b = torch.randn(ours.config.d_model)
    with torch.no_grad():
        ours.layers.norm.weight.zero_()
        ours.layers.norm.bias.copy_(b)
        ours.head.proj.weight[ours.config.pad_id] = 10 * b
    export_hf(ours, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    prompt = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        assert int(hf(prompt).logits[0, -1].argmax()) == ours.config.pad_id
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=4,
                          min_new_tokens=4)  # fmt: skip
    theirs = out[0, 3:].tolist()
    (hyp,) = search(LMAdapter(ours), prompt, SearchConfig(beam=1, min_len=4), 4)[0]
    assert ours.config.pad_id not in theirs and theirs == hyp.tokens


def test_marian_round_trip_writes_the_same_tensors(tmp_path):
    """The same tensors; the sinusoid tables (which transformers computes) longer, as aiayn reads them."""
    hf = marian(tmp_path / "hf")
    export_hf(from_pretrained(tmp_path / "hf"), tmp_path / "again")
    back = transformers.MarianMTModel.from_pretrained(tmp_path / "again")
    assert back.config.max_position_embeddings == max(hf.config.max_position_embeddings, SINUSOID_ROWS)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert theirs.keys() == ours.keys()
    for k in theirs:
        assert torch.equal(theirs[k], ours[k][: len(theirs[k])]), k


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            lambda: random_transformer(norm_first=True),
            r"pre-norm \(norm_first=True\) and Marian is post-norm",
        ),
        (lambda: random_transformer(positional="learned"), "learned and Marian's are fixed sinusoids"),
        (lambda: random_transformer(r2l_memory=True), "right-to-left memory"),
        (lambda: random_transformer(d_k=4, d_v=4), "not d_model/n_heads wide"),
        (lambda: random_transformer(ln_eps=1e-6), "LayerNorm ε is 1e-06"),
        (
            lambda: LanguageModel(LMConfig(vocab_size=20, n_layers=1, **SMALL)),
            "post-norm .* GPT-2 is pre-norm",
        ),
        (
            lambda: EncoderModel(EncoderConfig(vocab_size=20, n_layers=1, **SMALL)),
            r"cannot export as BERT: EncoderConfig.positional='sinusoidal'",
        ),
    ],
)
def test_refuses_what_the_target_cannot_express(tmp_path, model, message):
    with pytest.raises(ModelDirError, match=message):
        export_hf(model(), tmp_path)


def test_cli_export_and_its_one_line_errors(tmp_path, capsys):
    save_model(random_transformer(), tmp_path / "model")
    assert main(["export", "--model", str(tmp_path / "model"), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert "wrote Transformer" in capsys.readouterr().out
    assert transformers.MarianMTModel.from_pretrained(tmp_path / "hf").config.d_model == 32
    capsys.readouterr()
    # an HF directory's tokenizer is its own (not written again), and an LM without one still exports: said
    assert main(["export", "--model", str(tmp_path / "hf"), "--to", "hf", str(tmp_path / "hf2")]) == 0
    assert "is a Hugging Face directory; copy its tokenizer files" in capsys.readouterr().err
    lm = LanguageModel(LMConfig(vocab_size=40, n_layers=1, **{**SMALL, **LMS["gpt2-shaped"]}))
    save_model(randomise_(lm), tmp_path / "lm")
    assert main(["export", "--model", str(tmp_path / "lm"), "--to", "hf", str(tmp_path / "lm-hf")]) == 0
    assert "no tokenizer files written" in capsys.readouterr().err
    # a translation model whose tokenizer file is unreadable: its weights export, the reason said
    save_model(random_transformer(), tmp_path / "bad-tok")
    CharTokenizer.train("abc").save(tmp_path / "bad-tok")
    meta = json.loads((tmp_path / "bad-tok" / "tokenizer.json").read_text())
    (tmp_path / "bad-tok" / "tokenizer.json").write_text(json.dumps({**meta, "chars": None}))
    assert main(["export", "--model", str(tmp_path / "bad-tok"), str(tmp_path / "bad-tok-hf")]) == 0
    assert "no tokenizer files written" in capsys.readouterr().err
    assert (tmp_path / "bad-tok-hf" / "model.safetensors").is_file()
    save_model(random_transformer(norm_first=True), tmp_path / "pre")
    assert main(["export", "--model", str(tmp_path / "pre"), str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("aiayn export: error: cannot export as MarianMT") and err.count("\n") == 1
    # a right-to-left model would write reversed translations in any other reader: refused, nothing written
    save_model(random_transformer(), tmp_path / "r2l", reverse_target=True)
    for to in ("hf", "ctranslate2"):
        assert main(["export", "--model", str(tmp_path / "r2l"), "--to", to, str(tmp_path / "y")]) == 1
        err = capsys.readouterr().err
        assert "right to left (trained with reverse_target=true)" in err and err.count("\n") == 1
    assert not (tmp_path / "y").exists()


def test_language_model_export_keeps_its_tokenizer_and_generates_as_the_original(tmp_path, capsys):
    """GPT-2's byte BPE is not aiayn's tokenizer: the export carries aiayn's in aiayn_tokenizer/, and
    aiayn generate on the export prints what it prints on the original."""
    lm_dir(tmp_path / "lm", **LMS["gpt2-shaped"])
    meta = json.loads((tmp_path / "lm" / "config.json").read_text())  # as a run trained on 8 positions
    run = {**meta, "trained_max_len": 8, "untrained_ids": [1, 2, 3]}  # bos, eos, unk: not in its text
    (tmp_path / "lm" / "config.json").write_text(json.dumps(run))
    assert main(["export", "--model", str(tmp_path / "lm"), "--to", "hf", str(tmp_path / "hf")]) == 0
    assert "aiayn's tokenizer in aiayn_tokenizer/" in capsys.readouterr().out
    assert Generator.from_dir(tmp_path / "hf").context == 8  # the export reads no more than the run
    assert Generator.from_dir(tmp_path / "hf").never == (1, 2, 3)  # and emits what the run emits
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["bad_words_ids"] == [[0], [1], [2], [3]]  # transformers' generate neither
    outputs = []
    for name in ("lm", "hf"):  # 20 characters: past the 8 positions, each step reads the last 8
        args = ["generate", "--model", str(tmp_path / name), "--prompt", "Ein", "--max-new-tokens", "20"]
        assert main([*args, "--greedy"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and len(outputs[0]) > 10


@pytest.mark.parametrize("made", ["int8", "bf16", "prepacked"])
def test_a_model_made_for_inference_is_refused_by_export_in_one_line(tmp_path, made):
    """An int8 or prepacked model's Linear weights are not in its state dict (the export raised
    AttributeError), a bfloat16 one became a file of mixed dtypes: refused by name, as save_model does."""
    from aiayn.errors import ConfigError
    from aiayn.interop.ctranslate2 import export_ctranslate2
    from aiayn.models.prepack import prepack
    from aiayn.models.quantize import quantize

    model = random_transformer()
    model = prepack(model) if made == "prepacked" else quantize(model, made)
    with pytest.raises(ConfigError, match=r"not float32 \(quantized, prepacked or cast .*\): export the"):
        export_hf(model, tmp_path / "hf")
    pytest.importorskip("ctranslate2")
    tok = CharTokenizer.train(["abc"])
    with pytest.raises(ConfigError, match="export the float32 model"):
        export_ctranslate2(model, tok, tok, tmp_path / "ct2")


def test_re_exporting_a_gpt2_export_keeps_its_trained_context_and_untrained_ids(tmp_path):
    """``aiayn export`` of an aiayn GPT-2 export read no kept fields (BERT's were read): the second
    export lost ``aiayn_trained_max_len``, ``aiayn_untrained_ids`` and their ``bad_words_ids``."""
    from aiayn.interop.gpt2 import export_gpt2

    torch.manual_seed(0)
    ours = randomise_(
        LanguageModel(LMConfig(vocab_size=40, n_layers=1, max_len=16, **{**SMALL, **LMS["gpt2-shaped"]}))
    )
    export_gpt2(ours, tmp_path / "a", trained_max_len=12, untrained_ids=(1, 2))
    assert main(["export", "--model", str(tmp_path / "a"), "--to", "hf", str(tmp_path / "b")]) == 0
    first, again = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("a", "b"))
    assert again["aiayn_trained_max_len"] == first["aiayn_trained_max_len"] == 12
    assert again["aiayn_untrained_ids"] == first["aiayn_untrained_ids"] == [1, 2]
    generation = [json.loads((tmp_path / d / "generation_config.json").read_text()) for d in ("a", "b")]
    assert generation[1]["bad_words_ids"] == generation[0]["bad_words_ids"]


def test_an_hf_gpt2_exported_again_gets_no_tokenizer_config_over_its_own_files(tmp_path):
    """The tokenizer_config.json that makes AutoTokenizer refuse an aiayn LM's export is not written for
    a Hugging Face GPT-2, whose own tokenizer files are copied beside the export as they are."""
    sizes = dict(vocab_size=40, n_positions=16, n_embd=32, n_layer=1, n_head=4)
    cfg = transformers.GPT2Config(**sizes, bos_token_id=1, eos_token_id=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(tmp_path / "hf")
    assert main(["export", "--model", str(tmp_path / "hf"), "--to", "hf", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "config.json").is_file()
    assert not (tmp_path / "out" / "tokenizer_config.json").exists()
