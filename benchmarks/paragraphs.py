"""Paragraphs translated whole against sentence by sentence, as ``/translate`` now reads them.

A LibreTranslate client sends paragraphs; a model trained on single sentences (Multi30k's captions)
given several at once translates the first one or two and drops the rest. This groups Multi30k's
test2016 into paragraphs of ``--group`` consecutive sentences (their references joined the same way)
and scores two readings of each with sacreBLEU: **whole** (one input, what ``/v1/translate`` and
``/translate`` before did) and **sentences** (``aiayn.serve.sentences.Sentences``: each sentence
translated on its own, the translations joined). ``--group 1`` is the control: both readings are one
sentence, so their scores must agree.

    python benchmarks/paragraphs.py --model runs/demo --group 1 3 --json results/paragraphs.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from provenance import run_main, write_result  # noqa: E402
from sacrebleu.metrics import BLEU, CHRF  # noqa: E402

from aiayn.data.corpus import load_parallel  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.interop.model_dir import model_meta  # noqa: E402
from aiayn.serve.sentences import Sentences  # noqa: E402


def group(lines: list[str], n: int) -> list[str]:
    """Consecutive lines joined by a space, ``n`` at a time (the last group may be shorter)."""
    return [" ".join(lines[i : i + n]) for i in range(0, len(lines), n)]


def translate_whole(translator: Translator, paragraphs: list[str], config: SearchConfig) -> list[str]:
    return translator.translate(paragraphs, config)


def translate_sentences(
    translator: Translator, paragraphs: list[str], config: SearchConfig, language: str
) -> tuple[list[str], int]:
    split = [Sentences(p, language) for p in paragraphs]
    pieces = [piece for s in split for piece in s.pieces]
    translations, out, start = translator.translate(pieces, config), [], 0
    for s in split:
        out.append(s.join(translations[start : start + len(s.pieces)]))
        start += len(s.pieces)
    return out, len(pieces)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a translation model directory or training run")
    ap.add_argument("--group", type=int, nargs="+", default=[1, 3], help="sentences per paragraph")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--split", default="test", help="Multi30k split (default: test2016)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    translator = Translator.from_dir(args.model)
    meta = model_meta(args.model)
    src_lang, tgt_lang = meta.get("src_lang", "de"), meta.get("tgt_lang", "en")
    corpus = load_parallel("multi30k", args.split, src_lang, tgt_lang)
    sources, references = (list(side) for side in zip(*corpus))
    config = SearchConfig(beam=args.beam)
    result = {"model": args.model, "split": args.split, "beam": args.beam, "sentences": len(sources)}
    result["runs"] = []
    for n in args.group:
        paragraphs, refs = group(sources, n), group(references, n)
        t0 = time.perf_counter()
        whole = translate_whole(translator, paragraphs, config)
        t1 = time.perf_counter()
        split, pieces = translate_sentences(translator, paragraphs, config, src_lang)
        t2 = time.perf_counter()
        row = {"group": n, "paragraphs": len(paragraphs), "sentences_found": pieces}
        for name, hyps, seconds in (("whole", whole, t1 - t0), ("sentences", split, t2 - t1)):
            row[name] = {
                "bleu": round(BLEU().corpus_score(hyps, [refs]).score, 2),
                "chrf": round(CHRF().corpus_score(hyps, [refs]).score, 2),
                "words_out_per_ref_word": round(
                    sum(len(h.split()) for h in hyps) / sum(len(r.split()) for r in refs), 3
                ),  # fmt: skip
                "seconds": round(seconds, 1),
            }
        result["runs"].append(row)
        print(row, flush=True)
    if args.json:
        write_result(args.json, result)


if __name__ == "__main__":
    run_main(main)
