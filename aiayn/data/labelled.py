"""Labelled text for classification: TSV, CSV or JSON-lines files with a text and a label column.

The format comes from the file name (``.tsv``, ``.csv``, ``.jsonl``, each optionally ``.gz``).
A TSV/CSV file has a header row when its first row names the columns asked for (or, when none are
named, holds a column called ``label`` and one called ``text``/``sentence``/…); without a header,
``text_column`` and ``label_column`` are 0-based column numbers (and a first row whose label is in no
other row is warned about: a header of other names, read as an example). A JSON-lines file holds one object
per line with those keys. TSV is read without quoting (GLUE's files hold bare quote characters);
CSV with the usual double quotes.

Labels are strings whatever their form in the file (``1``, ``"pos"``, ``true``); ``LabelMap``
orders them (numerically when all are integers) and maps them to class ids, and is saved with the
model. Every problem (a row with missing or extra fields, an empty label or text, a missing key,
one class only, a label holding a tab or a line break) is a ``DataError`` naming the file, the line
and the field.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiayn.data.files import check_file, iter_lines
from aiayn.errors import DataError
from aiayn.textfiles import why_not_json

FORMATS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl"}
TEXT_NAMES = ("text", "sentence", "content", "review", "document")  # what "text" may be called
LABEL_NAMES = ("label",)
SPLIT_NAMES = {"train": ("train",), "valid": ("valid", "val", "dev"), "test": ("test",)}
MAX_CSV_FIELD = 2**31 - 1  # characters in one CSV field: a long document (the tokenizer bounds it further)


def table_format(path: str | os.PathLike) -> str | None:
    """ "tsv", "csv" or "jsonl" from the file name (a trailing ``.gz`` ignored); None otherwise."""
    name = Path(path).name.lower().removesuffix(".gz")
    return next((fmt for suffix, fmt in FORMATS.items() if name.endswith(suffix)), None)


def find_table(folder: Path, split: str) -> Path | None:
    """``folder/{split}.{tsv,csv,jsonl}[.gz]`` (valid may be called val or dev), if there is one."""
    for stem in SPLIT_NAMES[split]:
        for suffix in FORMATS:
            for name in (stem + suffix, stem + suffix + ".gz"):
                if (folder / name).is_file():
                    return folder / name
    return None


@dataclass(frozen=True)
class LabelledCorpus:
    """Texts and their labels (strings), with the 1-based line of each in ``path``."""

    path: Path
    texts: list[str]
    labels: list[str]
    lines: list[int]

    def __len__(self) -> int:
        return len(self.texts)


def _column(
    spec: str, header: list[str] | None, names: tuple[str, ...], what: str, path: Path, first: int = 1
) -> int:
    """The index of the column ``spec`` names ("" = the default ``names``; digits = an index);
    ``first``: the number of the table's first line (blank lines before it are skipped)."""
    if header is None:
        if not spec.isdigit():
            raise DataError(
                f"{path}: line {first} is not a header naming the {what} column ({spec or '/'.join(names)}); "
                f"add a header or set {what}_column to a 0-based column number"
            )
        return int(spec)
    if spec.isdigit():
        return int(spec)
    wanted = (spec,) if spec else names
    cells = [c.strip().lower() for c in header]
    name = next((w.lower() for w in wanted if w.lower() in cells), None)
    if name is None:
        raise DataError(
            f"{path}: the header {header} has no {what} column named {' or '.join(map(repr, wanted))}; "
            f"set {what}_column to one of its names"
        )
    found = [i for i, c in enumerate(cells) if c == name]
    if len(found) > 1:  # which one is meant is anyone's guess
        raise DataError(
            f"{path}: the header names {name!r} {len(found)} times (columns {', '.join(map(str, found))}); "
            f"rename all but one, or set {what}_column to a 0-based column number"
        )
    return found[0]


def _is_header(row: list[str], text_column: str, label_column: str, labelled: bool) -> bool:
    """Whether the first row names columns: the ones asked for, or a text column and (for labelled
    data) a label column by their usual names."""
    cells = {c.strip().lower() for c in row}
    named = {c.lower() for c in (text_column, label_column) if c and not c.isdigit()}
    usual = bool(cells & set(TEXT_NAMES)) and (not labelled or bool(cells & set(LABEL_NAMES)))
    return bool(named & cells) or usual


def _rows(path: Path, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """Non-blank rows of a TSV/CSV file with their 1-based line numbers."""
    lines = iter_lines(path)
    if fmt == "tsv":
        for i, line in enumerate(lines, start=1):
            if line.strip():
                yield i, line.split("\t")
        return
    csv.field_size_limit(MAX_CSV_FIELD)  # Python's default, 131,072 characters, is a short document
    # strict: a stray quote is an error, not a field that swallows the rows up to the next quote
    # (a quoted field may still span lines: line_num is where a row ends)
    reader, start = csv.reader((line + "\n" for line in lines), strict=True), 1
    try:
        for row in reader:
            if any(c.strip() for c in row):
                yield reader.line_num, row
            start = reader.line_num + 1
    except csv.Error as e:
        end, where = reader.line_num, f"{start}"
        if "new-line character seen in unquoted field" in str(e):  # a lone \r (the file's lines end in \n)
            raise DataError(f"{path}:{end}: a carriage return (\\r) inside a field that is not quoted; "
                            'quote the field ("…") or remove the \\r') from None  # fmt: skip
        if end > start:  # the row began on an earlier line: where its quote opened
            where, e = f"{start}-{end}", f"{e}; a quote opened on line {start} runs on to line {end}"
        raise DataError(f"{path}:{where}: not valid CSV ({e}); a field holding quotes is quoted "
                        'whole, its quotes doubled: "say ""hi"""') from None  # fmt: skip


def _check_cell(path: Path, line: int, value: str, what: str, column: str) -> str:
    if not value.strip():
        raise DataError(f"{path}:{line}: the {what} (column {column}) is empty")
    return value


def _read_table(path: Path, fmt: str, text_column: str, label_column: str, labelled: bool):
    rows = _rows(path, fmt)
    first = next(rows, None)
    if first is None:
        raise DataError(f"{path} has no rows")
    header = first[1] if _is_header(first[1], text_column, label_column, labelled) else None
    names_text = {c.strip().lower() for c in first[1]} & set(TEXT_NAMES)
    if header is None and labelled and not label_column.isdigit() and names_text:
        raise DataError(f"{path}: line {first[0]} names a text column ({', '.join(sorted(names_text))}) but "
                        f"no label column ({label_column or '/'.join(LABEL_NAMES)}); set label_column to the "
                        "name of its label column")  # fmt: skip
    t = _column(text_column, header, TEXT_NAMES, "text", path, first[0])
    y = _column(label_column, header, LABEL_NAMES, "label", path, first[0]) if labelled else None
    if y is not None and y == t:
        raise DataError(f"{path}: the text and the label are the same column ({t}); set text_column and "
                        "label_column to two columns")  # fmt: skip
    width = len(header) if header else len(first[1])
    names = header or [str(i) for i in range(width)]
    for index, what in ((t, "text"), (y, "label")):
        if index is not None and index >= width:
            raise DataError(f"{path}: {what} column {index} does not exist (rows have {width} fields)")
    texts, labels, lines = [], [], []
    for line, row in rows if header else [first, *rows]:
        if len(row) != width:
            which = "missing" if len(row) < width else "extra"
            raise DataError(
                f"{path}:{line}: {len(row)} fields where line {first[0]} has {width} ({which} columns)"
            )
        texts.append(_check_cell(path, line, row[t], "text", repr(names[t])))
        if y is not None:
            labels.append(_check_cell(path, line, row[y], "label", repr(names[y])).strip())
        lines.append(line)
    if header is None and len(labels) >= 20 and labels.count(labels[0]) == 1:
        warnings.warn(f"{path}: line {first[0]}'s label {labels[0]!r} is in no other row; if that line "
                      "names the columns, give text_column (and label_column) by name, or it is read as an "
                      "example", stacklevel=2)  # fmt: skip
    return texts, labels, lines


def _read_jsonl(path: Path, text_column: str, label_column: str, labelled: bool):
    texts, labels, lines = [], [], []
    for line, raw in enumerate(iter_lines(path), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{line}: not JSON ({e.msg})") from None
        except (ValueError, RecursionError) as e:  # an integer past Python's digit limit; nesting too deep
            raise DataError(f"{path}:{line}: not JSON ({why_not_json(e)})") from None
        if not isinstance(obj, dict):
            raise DataError(f"{path}:{line}: not a JSON object")
        fields = [("text", text_column, TEXT_NAMES)] + (
            [("label", label_column, LABEL_NAMES)] if labelled else []
        )
        values, keys = [], []
        for what, spec, names in fields:
            key = spec or next((n for n in names if n in obj), names[0])
            if key in keys:  # given twice, or one given as the other's usual name
                raise DataError(f"{path}: the text and the label are the same key ({key!r}); set "
                                "text_column and label_column to two keys")  # fmt: skip
            keys.append(key)
            if key not in obj:
                raise DataError(f"{path}:{line}: no key {key!r} (the {what}); set {what}_column to its key")
            value = obj[key]
            if what == "text" and not isinstance(value, str):  # 5 or true is no text to classify
                raise DataError(f"{path}:{line}: the text {key!r} is a {type(value).__name__}, not a string")
            if isinstance(value, bool):
                value = str(value).lower()
            elif isinstance(value, float) and not math.isfinite(value):  # NaN, Infinity: no class
                raise DataError(f"{path}:{line}: the label {key!r} is {value}, not a class")
            elif isinstance(value, float) and value.is_integer():  # 1.0 (a float column's) is the label 1
                value = int(value)
            if not isinstance(value, str | int | float):
                raise DataError(
                    f"{path}:{line}: the {what} {key!r} is a {type(value).__name__}, not a string"
                )
            values.append(_check_cell(path, line, str(value), what, repr(key)))
        texts.append(values[0])
        if labelled:
            labels.append(values[1].strip())
        lines.append(line)
    return texts, labels, lines


def load_labelled(
    path: str | os.PathLike, text_column: str = "", label_column: str = "", labelled: bool = True
) -> LabelledCorpus:
    """The texts (and, if ``labelled``, labels) of a TSV/CSV/JSONL file; see the module docstring."""
    path = Path(path)
    fmt = table_format(path)
    if fmt is None:
        raise DataError(f"{path}: not a .tsv, .csv or .jsonl file (optionally .gz); rename it or convert it")
    check_file(path)
    if fmt == "jsonl":
        texts, labels, lines = _read_jsonl(path, text_column, label_column, labelled)
    else:
        texts, labels, lines = _read_table(path, fmt, text_column, label_column, labelled)
    if not texts:
        raise DataError(f"{path} has a header but no examples")
    return LabelledCorpus(path, texts, labels, lines)


def one_field(label: str) -> bool:
    """Whether ``label`` prints as one field of one line: no tab, no line break."""
    return "\t" not in label and label.splitlines() == [label]


def check_label(label: str, where: str) -> None:
    """A label must print as one field of one line (``aiayn classify`` writes one line per input,
    fields split by tabs): a tab or a line break in it is a ``DataError`` naming ``where``."""
    if not one_field(label):
        raise DataError(
            f"{where}: the label {label!r} holds a tab or a line break, which would break aiayn classify's "
            "one line per input; rename it in the data"
        )


class LabelMap:
    """Label strings <-> class ids 0..n-1, in a fixed order saved with the model (``labels`` in
    ``config.json``)."""

    def __init__(self, labels: Sequence[str]):
        self.labels = list(labels)
        if len(set(self.labels)) != len(self.labels) or not all(isinstance(x, str) for x in self.labels):
            raise DataError(f"a label map needs distinct strings, got {self.labels!r}")
        self.index = {label: i for i, label in enumerate(self.labels)}

    @classmethod
    def from_corpus(cls, corpus: LabelledCorpus) -> LabelMap:
        """The labels of a training file, integers in numeric order and the rest alphabetically;
        a ``DataError`` if it has fewer than two."""
        for label, line in zip(corpus.labels, corpus.lines, strict=True):
            check_label(label, f"{corpus.path}:{line}")
        seen = set(corpus.labels)
        if len(seen) < 2:
            raise DataError(
                f"{corpus.path}: every example has the label {next(iter(seen))!r}; a classifier needs "
                "at least two classes"
            )
        for label in sorted(seen):  # "1" and "1.0" in one file: one class or two? said, not guessed
            if re.fullmatch(r"-?[0-9]+\.0+", label) and (twin := str(_integer(label))) in seen:
                line = corpus.lines[corpus.labels.index(label)]
                raise DataError(f"{corpus.path}: the labels {twin!r} and {label!r} (line {line}) are one "
                                "number written two ways; write them alike")  # fmt: skip
        numeric = all(re.fullmatch(r"-?[0-9]+", s) for s in seen)  # "--1" and "²" are names, not numbers
        # "1" and "01" name two classes of one value: their order must not be the set's (hash seed)
        return cls(sorted(seen, key=lambda s: (int(s), s)) if numeric else sorted(seen))

    def __len__(self) -> int:
        return len(self.labels)

    def ids(self, corpus: LabelledCorpus) -> list[int]:
        """Class ids of ``corpus``'s labels; a ``DataError`` naming the line of an unknown one. An
        integer label finds the model's label of the same value written as a float (``1`` its
        ``1.0``, which a JSONL file's float column gave models trained before such labels were read
        as integers), and the other way round."""
        out = []
        for label, line in zip(corpus.labels, corpus.lines, strict=True):
            i = self.index.get(label)
            if i is None and (value := _integer(label)) is not None:
                same = [j for name, j in self.index.items() if _integer(name) == value]
                i = same[0] if len(same) == 1 else None
            if i is None:
                raise DataError(
                    f"{corpus.path}:{line}: label {label!r} is not one the model was trained on "
                    f"({', '.join(map(repr, self.labels))})"
                )
            out.append(i)
        return out


def _integer(label: str) -> int | None:
    """The value of an integer label, written as one (``-3``) or as a float (``-3.0``); else None."""
    return int(label.split(".")[0]) if re.fullmatch(r"-?[0-9]+(\.0+)?", label) else None
