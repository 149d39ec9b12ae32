import gzip
import os

import pytest

from aiayn.data import DataError, check_file, data_dir
from aiayn.data.files import BOM, iter_lines, iter_text, split_lines


def test_data_dir_is_the_repository_data_folder_unless_overridden(tmp_path, monkeypatch):
    assert (data_dir() / "multi30k" / "SOURCE.md").is_file()
    monkeypatch.setenv("AIAYN_DATA_DIR", str(tmp_path))
    assert data_dir() == tmp_path
    monkeypatch.setenv("AIAYN_DATA_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="AIAYN_DATA_DIR points to .*nowhere"):
        data_dir()


@pytest.mark.parametrize("name", ["a.txt", "a.txt.gz"])
def test_check_file_counts_and_hashes_the_decompressed_text(tmp_path, write_lines, name):
    info = check_file(write_lines(tmp_path / name, ["héllo", "wörld 😀"]))
    assert (info.n_lines, info.n_chars) == (2, 14)
    assert info.sha256 == check_file(write_lines(tmp_path / "b.txt", ["héllo", "wörld 😀"])).sha256


def test_unterminated_last_line_counts(tmp_path):
    (tmp_path / "a").write_bytes(b"one\ntwo")
    assert check_file(tmp_path / "a").n_lines == 2


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"nope\.txt: no such file"):
        check_file(tmp_path / "nope.txt")


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        check_file(tmp_path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_pipe_is_refused_without_opening_it(tmp_path):
    """Data files are read more than once (counted and hashed, then read), which a pipe (``<(cat f)``)
    cannot give; opening one with no writer would also block. Refused by its kind, unopened."""
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(DataError, match=r"pipe is not a regular file \(a pipe\?\); save it to a file first"):
        check_file(tmp_path / "pipe")


@pytest.mark.parametrize("data", [b"", gzip.compress(b"")], ids=["plain", "gzip"])
def test_empty_file(tmp_path, data):
    (tmp_path / "e.txt").write_bytes(data)
    with pytest.raises(DataError, match=r"e\.txt is empty"):
        check_file(tmp_path / "e.txt")


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, gz):
    data = b"fine\nstill fine\nbad \xe9 latin-1\nfine\n"
    path = tmp_path / ("x.de.gz" if gz else "x.de")
    path.write_bytes(gzip.compress(data) if gz else data)
    with pytest.raises(DataError, match=r"x\.de(\.gz)?: line 3 is not valid UTF-8"):
        check_file(path)


def test_utf8_error_in_a_later_block_still_finds_the_line(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * 99 + b"\n" + b"ok\n" * 500_000 + b"\xff\n")
    with pytest.raises(DataError, match="line 500002 is not valid UTF-8"):
        check_file(path)


def test_truncated_gzip(tmp_path):
    (tmp_path / "t.gz").write_bytes(gzip.compress(b"hello\n" * 1000)[:50])
    with pytest.raises(DataError, match=r"t\.gz: cannot read it"):
        check_file(tmp_path / "t.gz")


def test_lines_split_on_newline_only(tmp_path):
    # \u2028, \x85, \x0c and a lone \r are line breaks to str.splitlines, not to a corpus
    (tmp_path / "a").write_bytes("a\u2028b\x85c\x0cd\re\r\nf\n\ng".encode())
    assert list(iter_lines(tmp_path / "a")) == ["a\u2028b\x85c\x0cd\re", "f", "", "g"]
    assert check_file(tmp_path / "a").n_lines == 4
    # a CRLF file without a final newline: its last line loses its "\r" as the others do (it kept it,
    # and its sentence gained a <0x0D> piece), as split_lines reads the same text
    (tmp_path / "b").write_bytes(b"x\r\ny\r")
    assert list(iter_lines(tmp_path / "b")) == split_lines("x\r\ny\r") == ["x", "y"]


@pytest.mark.parametrize("start,stop", [(0, 40), (3, 17), (10, 11), (0, 0), (25, 40)])
def test_iter_text_returns_exactly_the_character_range(tmp_path, start, stop):
    text = "ab😀c\nhé\n\nlong line without break é😀 x\nend"
    (tmp_path / "t").write_text(text, encoding="utf-8")
    pieces = list(iter_text(tmp_path / "t", start, stop, size=5))  # tiny blocks split characters
    assert "".join(pieces) == text[start:stop]
    assert all(p.endswith("\n") for p in pieces[:-1] if "\n" in p)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_a_byte_order_mark_is_not_text(tmp_path, gz):
    """Excel's "CSV UTF-8" and Notepad start the file with U+FEFF: not part of the first line."""
    data = BOM + "héllo\nwörld\n".encode()
    (tmp_path / "a").write_bytes(gzip.compress(data) if gz else data)
    assert list(iter_lines(tmp_path / "a")) == ["héllo", "wörld"]
    assert check_file(tmp_path / "a").n_chars == 12  # the mark is no character of the text
    assert "".join(iter_text(tmp_path / "a", 0, 12, size=4)) == "héllo\nwörld\n"
    assert "".join(iter_text(tmp_path / "a", 2, 12)) == "llo\nwörld\n"  # offsets count the text only
