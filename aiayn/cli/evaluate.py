"""``aiayn evaluate``: translate a test set and score it with sacreBLEU (BLEU and chrF), or, for a
classifier, label a labelled file and score it (accuracy, macro-F1, confusion matrix)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from dataclasses import asdict

from sacrebleu.metrics import BLEU, CHRF

from aiayn.atomic import write_text
from aiayn.cli.classify import add_long_text_arguments, long_text_of
from aiayn.cli.commands import summary
from aiayn.cli.decode_options import (
    add_ensemble_argument,
    add_model_argument,
    add_rerank_argument,
    add_search_arguments,
    check_bidirectional_options,
    check_outputs,
    formatter,
    quantized,
    search_config,
    warn,
)
from aiayn.data.corpus import load_parallel
from aiayn.data.labelled import load_labelled
from aiayn.decoding.bleu import bleu
from aiayn.decoding.classifier import DEFAULT_MAX_TOKENS as CLASSIFIER_MAX_TOKENS
from aiayn.decoding.classifier import load_classifier
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.rerank import Reranked, check_rerank_search
from aiayn.decoding.translator import DEFAULT_MAX_TOKENS, Translator
from aiayn.errors import ConfigError, ModelDirError
from aiayn.interop.model_dir import check_kind, model_meta
from aiayn.interop.pretrained import hf_model_type

EXAMPLES = """examples:
  aiayn evaluate --model runs/de-en                                  # multi30k test (2016 flickr)
  aiayn evaluate --model runs/de-en --split valid --beam 1 --json valid.json
  aiayn evaluate --model runs/de-en --src newstest.de --ref newstest.en --output newstest.hyp
  aiayn evaluate --model runs/de-en/step-003000 --ensemble-with runs/de-en/step-003250   # an ensemble
  aiayn evaluate --model runs/en-de --tokenized-bleu               # + BLEU as Multi30k papers report it
  aiayn evaluate --model runs/de-en --beam 8 --rerank-with runs/de-en-r2l   # n-best reranking
  aiayn evaluate --model runs/sst2-finetune --data sst2/dev.tsv --json dev.json   # a classifier

Scores are sacreBLEU's corpus BLEU and chrF on detokenized text, cased and lowercased, BLEU
tokenized for the target language as `sacrebleu -l` does (zh; ja and ko need sacreBLEU's extras); the
signatures printed say exactly how they were computed. --tokenized-bleu adds the BLEU that papers
trained on Multi30k's tokenised files report (lowercased, Moses-normalised and -tokenised text,
e.g. fairseq's "BLEU4"). Its words are not sacreBLEU's (quotes normalised and escaped, apostrophes
split off), so compare it with papers' figures, and the detokenized figures with each other.
Each sentence's best translation is scored (--nbest is refused: aiayn translate writes n-best lists).
A classifier is scored on a TSV/CSV/JSONL file (--data) with the columns it was trained on:
accuracy, macro-F1 and the confusion matrix.
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "evaluate",
        help=summary("evaluate"),
        description="Translate a test set and score it (BLEU, chrF), or label a labelled file and score a "
        "classifier (accuracy, macro-F1).",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    add_model_argument(p)
    p.add_argument("--dataset", default="multi30k", help="bundled dataset name (default: multi30k)")
    p.add_argument("--split", default="test", choices=["train", "valid", "test"], help="default: test")
    p.add_argument("--src", metavar="FILE", help="source sentences (with --ref: instead of --dataset)")
    p.add_argument("--ref", metavar="FILE", help="reference translations, line by line")
    p.add_argument("--src-lang", help="source language (default: the model's, else de)")
    p.add_argument("--tgt-lang", help="target language (default: the model's, else en)")
    p.add_argument("--data", metavar="FILE", help="a classifier: labelled TSV/CSV/JSONL file to score")
    p.add_argument("--text-column", help="the --data text column (default: the one the model was trained on)")
    p.add_argument("--label-column", help="the --data label column (default: as in training)")
    p.add_argument("--output", metavar="FILE", help="also write the translations (or labels) to FILE")
    p.add_argument("--json", metavar="FILE", help="write the scores and settings as JSON to FILE")
    p.add_argument(
        "--tokenized-bleu",
        action="store_true",
        help="also score lowercased, Moses-tokenised text, as papers on Multi30k do (needs sacremoses)",
    )
    add_long_text_arguments(p)
    add_ensemble_argument(
        p,
        "score the mean of these models' probabilities and --model's: next-token ones for "
        "translation (the same tokenizers), class ones for a classifier (the same labels)",
    )
    add_rerank_argument(p)
    add_search_arguments(p, classifier_max_tokens=CLASSIFIER_MAX_TOKENS)
    p.set_defaults(run=run)


def score(
    hyps: list[str], refs: list[str], tokenized_lang: str | None = None, tgt_lang: str = ""
) -> tuple[dict[str, float], dict[str, str]]:
    """Corpus BLEU and chrF, cased and lowercased: ``({name: score}, {name: signature})``, BLEU
    tokenized as sacreBLEU does for ``tgt_lang`` (``aiayn.decoding.bleu``); with ``tokenized_lang``
    also ``bleu_tok_lc``, the BLEU of papers (``tokenized_bleu``)."""
    metrics = {
        "bleu": bleu(tgt_lang),
        "bleu_lc": bleu(tgt_lang, lowercase=True),
        "chrf": CHRF(),
        "chrf_lc": CHRF(lowercase=True),
    }
    scores = {name: round(m.corpus_score(hyps, [refs]).score, 2) for name, m in metrics.items()}
    signatures = {name: str(m.get_signature()) for name, m in metrics.items()}
    if tokenized_lang is not None:
        scores["bleu_tok_lc"], signatures["bleu_tok_lc"] = tokenized_bleu(hyps, refs, tokenized_lang)
    return scores, signatures


def _sacremoses():
    """sacremoses' normaliser and tokenizer classes, or the one-line error saying to install it."""
    try:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    except ImportError as e:
        raise ConfigError("--tokenized-bleu needs sacremoses: pip install sacremoses") from e
    return MosesPunctNormalizer, MosesTokenizer


def moses_lc_tokenize(lines: list[str], lang: str) -> list[str]:
    """Lines as Multi30k's ``data/task1/tok/*.lc.norm.tok.*`` files hold them: lowercased, then
    the Moses scripts' punctuation normalisation and tokenisation (``lowercase.perl |
    normalize-punctuation.perl -l LANG | tokenizer.perl -l LANG``, escaping included), through
    sacremoses, which reproduces the German test2016 file word for word."""
    MosesPunctNormalizer, MosesTokenizer = _sacremoses()
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(s.lower()), return_str=True, escape=True) for s in lines]


def tokenized_bleu(hyps: list[str], refs: list[str], lang: str) -> tuple[float, str]:
    """BLEU over ``moses_lc_tokenize``d hypotheses and references, whitespace-split as they are:
    the figure papers trained on Multi30k's tokenised files report (fairseq's BLEU4 over them, or
    multi-bleu.perl), e.g. Wu et al. (2021)'s for Transformer-tiny en→de. Its words differ from
    sacreBLEU's ``13a`` ones only in quotes, apostrophes and normalised punctuation, so on Multi30k
    en→de outputs the two lowercased figures stay close (docs/results.md compares them)."""
    metric = BLEU(tokenize="none", force=True)
    result = metric.corpus_score(moses_lc_tokenize(hyps, lang), [moses_lc_tokenize(refs, lang)])
    return round(result.score, 2), f"{metric.get_signature()}|moses-lc-norm-tok:{lang}"


# the options only one kind of model reads: given for the other, they would be ignored
TRANSLATION_ONLY = (
    "dataset", "split", "src", "ref", "src_lang", "tgt_lang", "tokenized_bleu", "rerank_with", "no_cache",
    *(f.name for f in dataclasses.fields(SearchConfig) if f.name not in ("use_cache", "max_len_cap")),
)  # fmt: skip
CLASSIFIER_ONLY = ("data", "text_column", "label_column", "long_text", "window_stride")


def _refuse_others(args: argparse.Namespace, names: tuple[str, ...], kind: str, instead: str) -> None:
    """A ``ConfigError`` naming the options of ``names`` given away from their defaults."""
    parser = _parser()
    given = [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) != parser.get_default(n)]
    if given:
        raise ConfigError(f"{', '.join(given)}: not read for {kind}; {instead}")


def _parser() -> argparse.ArgumentParser:
    """``aiayn evaluate``'s own parser, for its defaults."""
    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    return sub.choices["evaluate"]


def run(args: argparse.Namespace) -> int:
    meta = model_meta(args.model)
    check_kind(args.model, ("transformer", "encoder"))  # a language model has nothing evaluate scores
    if meta["kind"] == "encoder":
        _refuse_others(args, TRANSLATION_ONLY, "an encoder-only model", "a classifier is scored on --data")
        return run_classifier(args, meta)
    _refuse_others(args, CLASSIFIER_ONLY, "a translation model", "use --src/--ref or --dataset")
    config = search_config(args)
    if config.nbest != 1:
        raise ConfigError(f"--nbest {config.nbest}: evaluate scores each sentence's best translation; "
                          "aiayn translate --nbest writes n-best lists")  # fmt: skip
    if args.rerank_with:
        check_rerank_search(config)
    if (args.src is None) != (args.ref is None):
        raise ConfigError("give both --src and --ref (or neither, to use --dataset)")
    if args.src is not None:
        _refuse_others(args, ("dataset", "split"), "--src/--ref", "they name the sentences; leave them out")
    own = hf_model_type(args.model) is None  # an OPUS-MT folder's codes name groups: "mul", "ROMANCE"
    for flag, key in (("--src-lang", "src_lang"), ("--tgt-lang", "tgt_lang")):
        given, saved = getattr(args, key), meta.get(key) if own else None
        if given and saved and given != saved:  # the other direction's files, or BLEU's tokenizer for it
            pair = f"{meta.get('src_lang', '?')}→{meta.get('tgt_lang', '?')}"
            raise ConfigError(f"{flag} {given}: {args.model} translates {pair} (its config.json); give "
                              f"{saved} or leave {flag} out")  # fmt: skip
    src_lang = args.src_lang or meta.get("src_lang", "de")
    tgt_lang = args.tgt_lang or meta.get("tgt_lang", "en")
    source = (args.src, args.ref) if args.src else args.dataset
    corpus = load_parallel(source, args.split, src_lang, tgt_lang)
    bleu(tgt_lang)  # these two before the decoding, not after it: a tokenizer they lack is an error
    if args.tokenized_bleu:
        _sacremoses()
    check_outputs(args, "--output", "--json", inputs=(corpus.src.path, corpus.tgt.path))
    translator = quantized(args, Translator.from_dirs([args.model, *args.ensemble_with], args.device))
    translator.tgt_lang = tgt_lang  # --mbr bleu tokenizes as the score does (a Marian folder may name none)
    check_bidirectional_options(args, translator)
    decoder = translator  # or, with --rerank-with, its n-best re-sorted by a second model too
    if args.rerank_with:
        decoder = Reranked(translator, quantized(args, Translator.from_dir(args.rerank_with, args.device)))
    srcs, refs = (list(side) for side in zip(*corpus))
    max_tokens = DEFAULT_MAX_TOKENS if args.max_tokens is None else args.max_tokens
    hyps = decoder.translate(srcs, config, max_tokens=max_tokens, warn=warn)
    if args.output:
        write_text(args.output, "".join(h + "\n" for h in hyps))
    scores, signatures = score(hyps, refs, tgt_lang if args.tokenized_bleu else None, tgt_lang)
    print(f"{corpus.name}: {len(hyps)} sentences, {args.model}")
    if translator.tgt_tokenizer.lowercase:
        print("the model writes lowercased text (a lowercase vocabulary): its cased scores say little")
    print(f"BLEU  {scores['bleu']:6.2f}   lowercased {scores['bleu_lc']:6.2f}")
    print(f"chrF  {scores['chrf']:6.2f}   lowercased {scores['chrf_lc']:6.2f}")
    if "bleu_tok_lc" in scores:
        print(f"BLEU  {scores['bleu_tok_lc']:6.2f}   lowercased Moses tokens (papers' BLEU, not comparable)")
    for name in ("bleu", "chrf", "bleu_tok_lc"):
        if name in signatures:
            print(f"{name} signature: {signatures[name]}")
    if args.json:
        report = {
            "corpus": corpus.name,
            "model": str(args.model),
            "ensemble_with": [str(d) for d in args.ensemble_with],
            "rerank_with": args.rerank_with,
            "sentences": len(hyps),
            "lowercase": translator.tgt_tokenizer.lowercase,
            **scores,
            "signatures": signatures,
            "search": asdict(translator.resolved(config)),  # with the r2l beam the model recorded
        }
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    return 0


def _saved_column(args: argparse.Namespace, meta: dict, what: str) -> str:
    """The ``{what}_column`` the model was trained with: a name, or digits for a 0-based number."""
    value = meta.get(f"{what}_column", "")
    if not isinstance(value, str):
        raise ModelDirError(f"{args.model}: its config.json's {what}_column={value!r} is not a column name "
                            f"or number in quotes; fix it there or give --{what}-column")  # fmt: skip
    return value


def run_classifier(args: argparse.Namespace, meta: dict) -> int:
    if args.data is None:
        raise ConfigError("this is a classifier: give the labelled file to score with --data FILE")
    text_column = args.text_column if args.text_column is not None else _saved_column(args, meta, "text")
    label_column = args.label_column if args.label_column is not None else _saved_column(args, meta, "label")
    data = load_labelled(args.data, text_column, label_column)
    check_outputs(args, "--output", "--json", inputs=(args.data,))
    directories = [args.model, *args.ensemble_with]  # several: their mean class probabilities
    classifier = quantized(args, load_classifier(directories, args.device, long_text_of(args)))
    max_tokens = CLASSIFIER_MAX_TOKENS if args.max_tokens is None else args.max_tokens  # classify's default
    m, predicted = classifier.score(data, max_tokens)  # a label the model does not know: an error
    if args.output:
        write_text(args.output, "".join(classifier.labels[i] + "\n" for i in predicted))
    also = f" + {len(args.ensemble_with)} more (an ensemble)" if args.ensemble_with else ""
    print(f"{data.path}: {len(data)} examples, {args.model}{also}")
    print(f"accuracy {m['accuracy']:6.2f}   macro-F1 {m['macro_f1']:6.2f}")
    width = max(len(y) for y in classifier.labels)
    print("confusion (rows: gold, columns: predicted)")
    print(" " * width + "".join(f" {y:>8}" for y in classifier.labels))
    for y, row in zip(classifier.labels, m["confusion"], strict=True):
        print(f"{y:>{width}}" + "".join(f" {c:>8}" for c in row))
    if args.json:
        report = {"data": str(data.path), "model": str(args.model),
                  "ensemble_with": [str(d) for d in args.ensemble_with], "examples": len(data),
                  "labels": classifier.labels, **m}  # fmt: skip
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    return 0
