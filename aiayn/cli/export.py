"""``aiayn export``: write a model directory in another library's layout: Hugging Face transformers, or
CTranslate2 (a translation model, optionally quantized)."""

from __future__ import annotations

import argparse

from aiayn.atomic import atomic_dir
from aiayn.cli.commands import summary
from aiayn.cli.decode_options import command_inputs, warn
from aiayn.data.tokenizer import SentencePieceTokenizer
from aiayn.errors import ConfigError, DataError, ModelDirError
from aiayn.interop import export_hf, from_pretrained
from aiayn.interop.bert import check_exportable as check_bert
from aiayn.interop.bert import export_bert
from aiayn.interop.ctranslate2 import QUANTIZATIONS, check_exportable, export_ctranslate2
from aiayn.interop.gpt2 import export_gpt2
from aiayn.interop.hf import AIAYN_TOKENIZER, position_rows
from aiayn.interop.marian import save_marian_tokenizer
from aiayn.interop.model_dir import load_encoder_dir, load_lm_dir, load_translation_dir, model_meta
from aiayn.models.lm import LanguageModel
from aiayn.outputs import check_output

EXAMPLES = """examples:
  aiayn export --model runs/de-en --to hf de-en-hf     # a Transformer -> MarianMTModel directory
  aiayn export --model runs/lm --to hf lm-hf           # a LanguageModel -> GPT2LMHeadModel directory
  aiayn export --model runs/sst2 --to hf sst2-hf       # an EncoderModel -> BertForSequenceClassification
  aiayn export --model runs/de-en --to ctranslate2 de-en-ct2 --quantization int8  # ctranslate2.Translator

A Transformer must be post-norm with sinusoidal positions (either layout) and LayerNorm ε 1e-5;
a LanguageModel must be pre-norm; an EncoderModel needs BERT's fields (docs/interop.md).
CTranslate2 takes an aiayn translation model with sentencepiece vocabularies, but not a bidirectional
one, nor heads narrower than d_model / n_heads (an imported OPUS-MT model's vocab.json ids are not its
sentencepiece ids: refused); neither layout takes a model that writes its target right to left
(reverse_target=true). Anything else is refused with the reason.

OUT is written whole or not at all. It may not be the model being exported (nor contain it); a
directory that already holds a model is replaced only with --force, and any other non-empty
directory is refused.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("export", help=summary("export"),
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", required=True, metavar="DIR", help="model directory (aiayn's or HF's)")
    p.add_argument(
        "--to", choices=["hf", "ctranslate2"], default="hf", help="the layout to write (default: hf)"
    )
    p.add_argument("--quantization", choices=QUANTIZATIONS, default="float32",
                   help="--to ctranslate2: the weights' type (default: float32)")  # fmt: skip
    p.add_argument("out", metavar="OUT", help="directory to write (created if missing)")
    p.add_argument(
        "--force", action="store_true", help="replace OUT if it already holds a model (never a training run)"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = check_output(
        args.out, command_inputs(args), directory=True, force=args.force, option="OUT", runs=False
    )
    meta = model_meta(args.model)
    if meta.get("reverse_target") is True:  # other readers would write it backwards
        raise ModelDirError(
            f"{args.model} writes its target right to left (trained with reverse_target=true): "
            "transformers and CTranslate2 would print reversed translations; export a left-to-right model"
        )
    if args.to == "ctranslate2":
        model, src_tok, tgt_tok = load_translation_dir(args.model)
        check_exportable(model, src_tok, tgt_tok)  # before any work
        with atomic_dir(out) as tmp:
            export_ctranslate2(model, src_tok, tgt_tok, tmp, args.quantization)
        print(f"wrote {out / 'model.bin'} ({args.quantization}) + vocabularies for ctranslate2.Translator")
        return 0
    if args.quantization != "float32":
        raise ConfigError("--quantization is for --to ctranslate2")
    if meta["kind"] == "encoder":  # BERT, with the class names and aiayn's tokenizer
        model, tok, meta = load_encoder_dir(args.model)
        check_bert(model)
        with atomic_dir(out) as tmp:
            export_bert(model, tmp, meta.get("labels"), tok, meta)
        print(f"wrote {type(model).__name__} as BERT: {out / 'config.json'} + model.safetensors + tokenizer")
        return 0
    model, tokenizers, lm_tokenizer, why_not = None, None, None, None
    if "config" not in meta:  # a Hugging Face directory: its tokenizer files are its own
        why_not = f"{args.model} is a Hugging Face directory; copy its tokenizer files into {out} as they are"
    elif meta["kind"] == "lm":
        try:
            model, lm_tokenizer, _ = load_lm_dir(args.model)
        except (ModelDirError, DataError) as e:  # weights without a tokenizer still export
            why_not = str(e)
    elif meta["kind"] == "transformer":  # an aiayn translation model
        try:
            model, *tokenizers = load_translation_dir(args.model)
        except (ModelDirError, DataError) as e:  # weights without a (readable) tokenizer still export
            why_not = str(e)
        if tokenizers and not all(isinstance(t, SentencePieceTokenizer) for t in tokenizers):
            tokenizers, why_not = None, "MarianTokenizer segments with sentencepiece only"
    if model is None:  # the weights alone, when no tokenizer came with them
        model = from_pretrained(args.model)
    trained = meta.get("trained_max_len")
    with atomic_dir(out) as tmp:
        if isinstance(model, LanguageModel):  # an HF GPT-2's own tokenizer files are copied as they are
            untrained = meta.get("untrained_ids")
            export_gpt2(model, tmp, trained if isinstance(trained, int) else None,  # its trained context
                        tuple(untrained) if isinstance(untrained, list) else (),
                        tokenizer_config="config" in meta or "trained_max_len" in meta)  # fmt: skip
        else:
            export_hf(model, tmp)
        if tokenizers is not None:  # source.spm, target.spm, vocab.json: MarianTokenizer.from_pretrained(OUT)
            rows = position_rows(model.config.max_len, model.config.positional)  # the export's own table
            save_marian_tokenizer(tmp, *tokenizers, meta.get("src_lang"), meta.get("tgt_lang"), rows)
        if lm_tokenizer is not None:  # aiayn's own, for aiayn generate (GPT-2's byte BPE is not it)
            lm_tokenizer.save(tmp / AIAYN_TOKENIZER)
    if why_not:
        warn(f"no tokenizer files written: {why_not}")
    extra = " + MarianTokenizer files" if tokenizers is not None else ""
    extra += f" + aiayn's tokenizer in {AIAYN_TOKENIZER}/" if lm_tokenizer is not None else ""
    print(f"wrote {type(model).__name__} as {out / 'config.json'} + model.safetensors{extra}")
    return 0
