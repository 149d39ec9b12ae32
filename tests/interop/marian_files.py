"""A tiny OPUS-MT-style tokenizer on disk: source.spm, target.spm and vocab.json, trained here."""

from __future__ import annotations

import io
import json
from pathlib import Path

import sentencepiece as spm

SOURCE = [
    "Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch im Park.",
    "Kinder spielen Fußball auf der Straße.", "Der alte Mann sitzt auf einer Bank.",
    "Ein Hund läuft über die Wiese.", "Die Sonne scheint über den Bergen.",
]  # fmt: skip
TARGET = [
    "A man rides a bike.", "Two dogs play in the snow.", "A woman reads a book in the park.",
    "Children play football in the street.", "The old man sits on a bench.",
    "A dog runs across the meadow.", "The sun shines over the mountains.",
]  # fmt: skip
LANGUAGE_CODES = [">>fra<<", ">>deu<<"]


def train_spm(lines: list[str], vocab_size: int) -> bytes:
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines * 3), model_writer=out, vocab_size=vocab_size,
                                   model_type="unigram", minloglevel=2, num_threads=1)  # fmt: skip
    return out.getvalue()


def write_marian_tokenizer(directory: Path) -> dict[str, int]:
    """Marian's layout: one vocab.json over both sides' pieces, ``</s>`` = 0, ``<unk>`` = 1, ``<pad>``
    last, so that its ids differ from either sentencepiece model's own."""
    directory.mkdir(parents=True, exist_ok=True)
    models = {"source.spm": train_spm(SOURCE, 50), "target.spm": train_spm(TARGET, 45)}
    vocab = {"</s>": 0, "<unk>": 1, **{c: 2 + i for i, c in enumerate(LANGUAGE_CODES)}}
    for name, model in models.items():
        (directory / name).write_bytes(model)
        sp = spm.SentencePieceProcessor(model_proto=model)
        for i in range(sp.get_piece_size()):
            if not (sp.is_control(i) or sp.is_unknown(i)):
                vocab.setdefault(sp.id_to_piece(i), len(vocab))
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps({"source_lang": "de", "target_lang": "en"}))
    return vocab
