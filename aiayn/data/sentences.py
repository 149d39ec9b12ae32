"""Single sentences (or labelled ones) by name or path, for the encoder-only tasks.

A source is a bundled name (``multi30k``: both languages' sentences; ``shakespeare``: its lines),
a TSV/CSV/JSONL table (``labelled.py``), a folder holding ``{train,valid|val|dev}.{tsv,csv,jsonl}``,
or a plain or gzipped text file (one sentence per line). ``split`` is ``train``, ``valid`` or
``all``: a table without a separate validation file is cut by rows, the first 90% for training and
the rest for validation; a text file at the first line that starts past 90% of its characters (as
``load_text`` cuts an LM's text, but never inside a line).
"""

from __future__ import annotations

import os
from pathlib import Path

from aiayn.data.corpus import MULTI30K_LANGS, TEXT_DATASETS, load_parallel, load_text
from aiayn.data.files import split_lines
from aiayn.data.labelled import LabelledCorpus, find_table, load_labelled, table_format
from aiayn.errors import DataError

VALID_FRACTION = 0.1


def split_for(source: str | os.PathLike, wanted: str) -> str:
    """The split to read of a source given *separately* for training or validation: a file is used
    whole ("all"); a bundled name or a folder gives its own ``wanted`` split."""
    return "all" if Path(source).is_file() else wanted


def _cut(corpus: LabelledCorpus, split: str) -> LabelledCorpus:
    if split == "all":
        return corpus
    cut = int(len(corpus) * (1 - VALID_FRACTION))
    part = slice(0, cut) if split == "train" else slice(cut, None)
    if cut == 0 or cut == len(corpus):
        raise DataError(
            f"{corpus.path}: {len(corpus)} examples are too few to hold out a validation tenth; "
            "give a separate validation file (valid_dataset=…)"
        )
    return LabelledCorpus(corpus.path, corpus.texts[part], corpus.labels[part], corpus.lines[part])


def load_examples(
    source: str | os.PathLike,
    split: str,
    text_column: str = "",
    label_column: str = "",
    labelled: bool = True,
) -> LabelledCorpus:
    """Examples of a table file or of a folder of tables (``{split}.tsv`` etc.)."""
    if split not in ("train", "valid", "all"):
        raise DataError(f"split={split!r} is not one of train, valid, all")
    path = Path(source)
    if path.is_dir():
        if split == "all":
            raise DataError(f"{path} is a folder: read its train or valid table, not split='all'")
        found = find_table(path, split)
        if found is None:
            raise DataError(
                f"{path}: no {split} file (expected {split}.tsv, .csv or .jsonl, optionally .gz; "
                "validation may be called valid, val or dev)"
            )
        return load_labelled(found, text_column, label_column, labelled)
    return _cut(load_labelled(path, text_column, label_column, labelled), split)


def is_text_file(source: str | os.PathLike) -> bool:
    """Whether ``source`` is read as plain text, one sentence (or document) per line: a bundled text
    (``shakespeare``) or a file that is not a table; not ``multi30k``, a folder or a table."""
    key, path = str(source), Path(source)
    return key != "multi30k" and (key in TEXT_DATASETS or not (path.is_dir() or table_format(path)))


def load_sentences(source: str | os.PathLike, split: str, text_column: str = "") -> tuple[list[str], str]:
    """``(sentences, label)``: the non-blank sentences of ``source`` and a name for messages."""
    key = str(source)
    if key == "multi30k":
        part = "valid" if split == "valid" else "train"
        corpus = load_parallel("multi30k", part, *MULTI30K_LANGS)
        return [s for s in corpus.sentences("both") if s.strip()], f"multi30k.{part}"
    if not is_text_file(source):
        examples = load_examples(source, split, text_column, labelled=False)
        return examples.texts, str(examples.path)
    text = load_text(source, split, whole_lines=True)
    lines = [line for chunk in text.chunks() for line in split_lines(chunk) if line.strip()]
    if not lines:
        raise DataError(f"{text.file.path}: the {split} split holds no non-blank line")
    return lines, str(text.file.path)
