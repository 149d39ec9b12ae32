"""The project's one way of reading small text and JSON files (``aiayn/textfiles.py``)."""

import pytest

from aiayn.errors import ModelDirError
from aiayn.textfiles import read_json


def test_json_after_a_byte_order_mark_reads_as_a_recipe_does(tmp_path):
    """A config.json re-saved by an editor that writes a BOM was "not valid JSON"; TOML recipes and
    text files were read through one already (JSON parsers may ignore it: RFC 8259 §8.1)."""
    path = tmp_path / "config.json"
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}')
    assert read_json(path, "no config") == {"a": 1}
    path.write_bytes(b"[1]")
    with pytest.raises(ModelDirError, match="does not hold a JSON object"):
        read_json(path, "no config")
