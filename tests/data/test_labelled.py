"""Labelled tables (TSV/CSV/JSONL): headers, columns, labels, and every bad-input message."""

import gzip
import json

import pytest

from aiayn.data.labelled import LabelMap, load_labelled
from aiayn.data.sentences import load_examples, load_sentences
from aiayn.errors import DataError


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_tsv_with_header_any_column_order(tmp_path):
    c = load_labelled(write(tmp_path / "a.tsv", 'sentence\tlabel\nit \'s "good" .\t1\nbad .\t0\n'))
    assert c.texts == ['it \'s "good" .', "bad ."]  # TSV keeps bare quotes (GLUE's files have them)
    assert c.labels == ["1", "0"] and c.lines == [2, 3]


def test_gzipped_tsv_and_named_columns(tmp_path):
    path = tmp_path / "a.tsv.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("id\tstars\tbody\n7\tfive\tgreat\n8\tone\tawful\n")
    c = load_labelled(path, text_column="body", label_column="stars")
    assert c.texts == ["great", "awful"] and c.labels == ["five", "one"]


def test_csv_quotes_and_multiline_field(tmp_path):
    c = load_labelled(write(tmp_path / "a.csv", 'text,label\n"a, b",pos\n"two\nlines",neg\nc,pos\n'))
    assert c.texts == ["a, b", "two\nlines", "c"] and c.labels == ["pos", "neg", "pos"]
    assert c.lines == [2, 4, 5]


def test_a_csv_saved_by_excel_has_its_header_read_through_the_byte_order_mark(tmp_path):
    c = load_labelled(write(tmp_path / "a.csv", "\ufeffsentence,label\ngood,pos\nbad,neg\n"))
    assert c.texts == ["good", "bad"] and c.labels == ["pos", "neg"]


def test_no_header_needs_column_numbers(tmp_path):
    path = write(tmp_path / "a.tsv", "1\tgood\n0\tbad\n")
    with pytest.raises(DataError, match=r"a.tsv: line 1 is not a header .*text_column"):
        load_labelled(path)
    c = load_labelled(path, text_column="1", label_column="0")
    assert c.texts == ["good", "bad"] and c.labels == ["1", "0"]


def test_a_header_of_other_names_read_by_column_numbers_is_warned_about(tmp_path, recwarn):
    rows = "".join(f"{i % 2}\ttext {i}\n" for i in range(30))
    path = write(tmp_path / "a.tsv", "polarity\treview\n" + rows)
    with pytest.warns(UserWarning, match=r"a.tsv: line 1's label 'polarity' is in no other row"):
        c = load_labelled(path, text_column="1", label_column="0")
    assert c.labels[0] == "polarity"  # read as an example, as asked
    load_labelled(write(tmp_path / "b.tsv", rows), text_column="1", label_column="0")
    assert not recwarn.list  # no header: no warning


def test_jsonl_labels_of_any_form(tmp_path):
    """A float column's 1.0 (pandas writes a column with a NaN so) is the label 1, as a TSV's "1" is."""
    rows = [{"text": "a", "label": 1}, {"text": "b", "label": True}, {"sentence": "c", "label": "x"},
            {"text": "d", "label": 1.0}, {"text": "e", "label": 0.5}]  # fmt: skip
    c = load_labelled(write(tmp_path / "a.jsonl", "\n".join(map(json.dumps, rows)) + "\n\n"))
    assert c.texts == ["a", "b", "c", "d", "e"] and c.labels == ["1", "true", "x", "1", "0.5"]


@pytest.mark.parametrize(
    "name, text, match",
    [
        ("a.tsv", "sentence\tlabel\ngood\n", r"a.tsv:2: 1 fields where line 1 has 2 \(missing columns\)"),
        ("a.tsv", "\n\nsentence\tlabel\ngood\n", r"a.tsv:4: 1 fields where line 3 has 2 \(missing columns\)"),
        ("a.tsv", "sentence\tlabel\ngood\t1\textra\n", r"a.tsv:2: 3 fields .*\(extra columns\)"),
        ("a.tsv", "sentence\tlabel\ngood\t1\nbad\t \n", r"a.tsv:3: the label \(column 'label'\) is empty"),
        ("a.tsv", "sentence\tlabel\n\t1\n", r"a.tsv:2: the text \(column 'sentence'\) is empty"),
        ("a.tsv", "sentence\tlabel\n", r"a.tsv has a header but no examples"),
        ("a.jsonl", '{"text": "a"}\n', r"a.jsonl:1: no key 'label' \(the label\)"),
        ("a.jsonl", '{"text": "a", "label": 1}\n[1]\n', r"a.jsonl:2: not a JSON object"),
        ("a.jsonl", '{"text": ["a"], "label": 1}\n', r"a.jsonl:1: the text 'text' is a list"),
        # a number or a boolean is no text to classify (it was read as "5"), NaN no class (it was "nan")
        ("a.jsonl", '{"text": 5, "label": 1}\n', r"a.jsonl:1: the text 'text' is a int, not a string"),
        ("a.jsonl", '{"text": true, "label": 1}\n', r"a.jsonl:1: the text 'text' is a bool, not a string"),
        ("a.jsonl", '{"text": "a", "label": NaN}\n', r"a.jsonl:1: the label 'label' is nan, not a class"),
        # not JSONDecodeError: Python's limit on an integer's digits, and a recursion too deep
        ("a.jsonl", f'{{"text": "a", "label": {"1" * 5000}}}\n', r"a.jsonl:1: not JSON \(Exceeds the limit"),
        ("a.jsonl", "[" * 100_000 + "\n", r"a.jsonl:1: not JSON \(nested too deeply"),
        ("a.csv", 'text,label\n"open,1\n', r"a.csv:\d+: "),
        # before: the rows up to the next quote were one text, labelled as the last of them
        (
            "a.csv",
            'text,label\n"stray,pos\nlost,neg\n"next",pos\n',
            r"a.csv:2-4: not valid CSV \(.*a quote "
            r"opened on line 2 runs on to line 4\); a field holding quotes is quoted whole",
        ),  # fmt: skip
        ("a.csv", 'text,label\n"Great" she said,pos\n', r"a.csv:2: not valid CSV"),  # before: Great she said
        (
            "a.tsv",
            "text\ttext\tlabel\na\tb\tpos\n",
            r"a.tsv: the header names 'text' 2 times \(columns 0, 1\)",
        ),
        ("a.txt", "good\t1\n", r"not a .tsv, .csv or .jsonl file"),
        (
            "a.tsv",
            "sentence\tsentiment\ngood\t1\n",
            r"a.tsv: line 1 names a text column \(sentence\) but no label column \(label\); set label_column",
        ),
    ],
)
def test_bad_tables_name_file_line_and_field(tmp_path, name, text, match):
    with pytest.raises(DataError, match=match):
        load_labelled(write(tmp_path / name, text))


def test_named_column_missing_from_header(tmp_path):
    path = write(tmp_path / "a.tsv", "sentence\tlabel\ngood\t1\n")
    with pytest.raises(DataError, match=r"no label column named 'stars'"):
        load_labelled(path, label_column="stars")


def test_label_map_orders_and_rejects(tmp_path):
    c = load_labelled(write(tmp_path / "a.tsv", "text\tlabel\na\t10\nb\t9\nc\t-1\n"))
    assert LabelMap.from_corpus(c).labels == ["-1", "9", "10"]  # integers in numeric order
    odd = load_labelled(write(tmp_path / "odd.tsv", "text\tlabel\na\t--1\nb\t²\nc\t3\n"))
    assert LabelMap.from_corpus(odd).labels == ["--1", "3", "²"]  # not all integers: by name
    one = load_labelled(write(tmp_path / "b.tsv", "text\tlabel\na\tpos\nb\tpos\n"))
    with pytest.raises(DataError, match=r"b.tsv: every example has the label 'pos'.*two classes"):
        LabelMap.from_corpus(one)
    unseen = load_labelled(write(tmp_path / "c.tsv", "text\tlabel\na\t9\nb\t11\n"))
    with pytest.raises(DataError, match=r"c.tsv:3: label '11' is not one the model was trained on"):
        LabelMap.from_corpus(c).ids(unseen)
    # an integer label finds the same value written as a float (a model's labels from a JSONL file's
    # float column, as read before 1.0 became 1), and the other way round; a name is not a number
    floats = load_labelled(write(tmp_path / "f.tsv", "text\tlabel\na\t1.0\nb\t0\nc\t-1\nd\t01\n"))
    assert LabelMap(["-1.0", "0.0", "1.0", "x"]).ids(floats) == [2, 1, 0, 2]
    with pytest.raises(DataError, match=r"label '1.5' is not one"):
        LabelMap(["1", "2"]).ids(load_labelled(write(tmp_path / "g.tsv", "text\tlabel\na\t1.5\n")))
    with pytest.raises(DataError, match=r"label '1' is not one"):  # two labels of that value: no guess
        LabelMap(["1.0", "01"]).ids(load_labelled(write(tmp_path / "h.tsv", "text\tlabel\na\t1\n")))
    # "1" and "1.0" in one training file: one class or two? refused, not guessed (two classes, before)
    mixed = load_labelled(write(tmp_path / "m.csv", "text,label\na,1\nb,0\nc,1.0\n"))
    with pytest.raises(DataError, match=r"m.csv: the labels '1' and '1.0' \(line 4\) are one number"):
        LabelMap.from_corpus(mixed)


def test_folder_splits_and_tenth_held_out(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    write(folder / "train.tsv", "text\tlabel\n" + "".join(f"t{i}\t{i % 2}\n" for i in range(20)))
    write(folder / "dev.tsv", "text\tlabel\nv\t0\n")
    assert load_examples(folder, "valid").texts == ["v"]
    assert len(load_examples(folder, "train")) == 20
    assert load_examples(folder / "train.tsv", "valid").texts == ["t18", "t19"]
    assert len(load_examples(folder / "train.tsv", "train")) == 18
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty: no valid file \(expected valid.tsv"):
        load_examples(tmp_path / "empty", "valid")


def test_sentences_of_bundled_and_tables(tmp_path):
    train, name = load_sentences("multi30k", "train")
    assert len(train) == 2 * 29000 and name == "multi30k.train"
    table = write(tmp_path / "a.tsv", "label\tsentence\n" + "".join(f"{i % 2}\ts{i}\n" for i in range(10)))
    assert load_sentences(table, "all")[0] == [f"s{i}" for i in range(10)]
    text = write(tmp_path / "a.txt", "one\n\ntwo\n")
    assert load_sentences(text, "all")[0] == ["one", "two"]


def test_a_separate_source_is_read_whole_if_a_file_and_by_split_if_a_folder(tmp_path):
    from aiayn.data.sentences import split_for

    folder = tmp_path / "d"
    folder.mkdir()
    write(folder / "train.tsv", "text\tlabel\na\t0\n")
    assert split_for(folder / "train.tsv", "valid") == "all" and split_for(folder, "valid") == "valid"
    assert split_for("multi30k", "valid") == "valid"
    assert load_sentences("multi30k", "valid")[1] == "multi30k.valid"
    with pytest.raises(DataError, match="is a folder"):
        load_examples(folder, "all")


def test_an_unlabelled_table_with_a_text_header_reads_its_text_column(tmp_path):
    """Pre-training reads a table's texts only: a header that names a text column (and no label
    column) is a header, not a first text."""
    csv = write(tmp_path / "u.csv", "id,text\n1,hello world\n2,a second one\n")
    assert load_sentences(csv, "all")[0] == ["hello world", "a second one"]
    tsv = write(tmp_path / "u.tsv", "sentence\nhello world\n")
    assert load_sentences(tsv, "all")[0] == ["hello world"]


def test_labels_of_one_value_are_ordered_the_same_whatever_the_hash_seed(tmp_path):
    """ "1" and "01" are two classes of one integer value: their class ids must not follow the order
    of a set (which the process's hash seed decides), or two ranks, or a resumed run, disagree."""
    import os
    import subprocess
    import sys

    table = write(tmp_path / "a.tsv", "text\tlabel\na\t1\nb\t01\nc\t2\nd\t0\n")
    code = ("from aiayn.data.labelled import LabelMap, load_labelled; import sys; "
            f"print(LabelMap.from_corpus(load_labelled({str(table)!r})).labels)")  # fmt: skip
    orders = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout  # fmt: skip
        for seed in range(8)
    }
    assert orders == {"['0', '01', '1', '2']\n"}


def test_lines_are_cut_at_newlines_only_as_files_are_read(tmp_path):
    """U+0085 (a cp1252 "…" decoded as Latin-1), U+2028 and form feeds are text inside a line, as
    ``iter_lines`` reads them: not the ends of documents."""
    text = write(tmp_path / "a.txt", "Wait\x85 what is this\r\nsecond\u2028line\x0chere\n")
    assert load_sentences(text, "all")[0] == ["Wait\x85 what is this", "second\u2028line\x0chere"]


@pytest.mark.parametrize(
    ("name", "text", "columns"),
    [("a.tsv", "label\tsentence\n1\tgood\n0\tbad\n", ("sentence", "sentence")),
     ("b.tsv", "1\tgood\n0\tbad\n", ("1", "1")),
     ("c.jsonl", '{"text": "good", "label": 1}\n', ("text", "text"))],
)  # fmt: skip
def test_the_text_and_the_label_must_be_two_columns(tmp_path, name, text, columns):
    with pytest.raises(DataError, match="the text and the label are the same"):
        load_labelled(write(tmp_path / name, text), text_column=columns[0], label_column=columns[1])


def test_a_csv_field_may_hold_a_document_past_pythons_default_limit(tmp_path):
    long = "word " * 30_000  # 150,000 characters; before: "field larger than field limit (131072)"
    assert load_labelled(write(tmp_path / "a.csv", f"text,label\n{long},pos\nshort,neg\n")).texts == [
        long,
        "short",
    ]


def test_a_lone_carriage_return_in_a_csv_field_is_named_as_one(tmp_path):
    """A bare \\r in an unquoted CSV field was refused with Python's advice to open the file with
    newline=''; quoted, it is kept, as TSV and JSONL keep it."""
    path = tmp_path / "a.csv"
    path.write_bytes(b"text,label\nit was\rgreat,pos\n")
    with pytest.raises(
        DataError, match=r"a.csv:2: a carriage return \(\\r\) inside a field that is not quoted"
    ):
        load_labelled(path)
    path.write_bytes(b'text,label\n"it was\rgreat",pos\n')
    assert load_labelled(path).texts == ["it was\rgreat"]


def test_jsonl_refuses_a_label_key_that_is_the_texts_usual_one(tmp_path):
    """``label_column=text`` with the text's key left to its usual name read one key as both (every
    text its own class); TSV refused it, JSONL now does too."""
    path = write(tmp_path / "d.jsonl", '{"text": "good", "label": 1}\n')
    with pytest.raises(DataError, match=r"the text and the label are the same key \('text'\)"):
        load_labelled(path, "", "text")
