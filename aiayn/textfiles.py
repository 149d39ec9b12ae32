"""Reading the small text and JSON files a user points at (model configs, trainer state, recipes,
tokenizer descriptions), with one error that names the file and says what to do.

Every reader of such a file goes through here, so "missing", "not UTF-8", "not JSON" and "not a JSON
object" read the same everywhere and never escape as a decoder's bare message.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from aiayn.errors import AiaynError, ModelDirError


def absent(path: Path) -> str:
    """What is wrong with a file that ``is_file()`` refused: "is missing", or "is a directory, not a
    file" (a directory under the file's name was reported as missing, which sends the user looking)."""
    return "is a directory, not a file" if path.is_dir() else "is missing"


def _read(path: Path, missing: str, error: type[AiaynError]) -> bytes:
    if not path.is_file():
        raise error(f"{path} {absent(path)}: {missing}")
    return path.read_bytes()


def read_text(
    path: str | os.PathLike, missing: str, error: type[AiaynError] = ModelDirError, fix: str = "restore it"
) -> str:
    """The UTF-8 text of ``path``, without the byte order mark some editors save; ``missing`` says
    what its absence means, ``fix`` what to do."""
    data = _read(Path(path), missing, error)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise error(f"{path} is not valid UTF-8 ({e}); {fix}") from None


def why_not_json(e: ValueError | RecursionError) -> str:
    """Why ``json.loads`` refused a text, in a few words: its ``ValueError`` (not JSON, or an integer
    past Python's digit limit), or a ``RecursionError`` (nested too deeply)."""
    return "nested too deeply" if isinstance(e, RecursionError) else str(e)


def read_json(
    path: str | os.PathLike, missing: str, error: type[AiaynError] = ModelDirError, fix: str = "restore it"
) -> dict:
    """The JSON object in ``path``: the errors of ``read_text``, and for text that is not one."""
    raw = _read(Path(path), missing, error)
    try:
        data = json.loads(raw.decode("utf-8-sig"))  # a byte order mark first, as some editors save it
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, an int of > 4300 digits, nested too deep
        raise error(f"{path} is not valid JSON ({why_not_json(e)}); {fix}") from None
    if not isinstance(data, dict):
        raise error(f"{path} does not hold a JSON object; {fix}")
    return data
