"""``aiayn serve``'s own arguments: ``--model [NAME=]DIR[:DIR…]`` and the ``--api-keys`` file."""

import os
from pathlib import Path

import pytest

from aiayn.cli.serve import parse_models
from aiayn.errors import ConfigError
from aiayn.serve.settings import read_api_keys


def test_a_directory_that_exists_is_one_model_whatever_its_name_holds(tmp_path):
    odd = [tmp_path / "lr=3e-4", tmp_path / f"de-en-12{os.pathsep}30"]
    for d in odd:
        d.mkdir()
    assert parse_models([str(d) for d in odd]) == [("lr=3e-4", [odd[0]]), (odd[1].name, [odd[1]])]
    assert parse_models([f"late={odd[1]}"]) == [("late", [odd[1]])]  # NAME=DIR, DIR holding the separator


def test_names_and_ensembles_are_read_as_before(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert parse_models([str(a), f"pair={a}{os.pathsep}{b}"]) == [("a", [a]), ("pair", [a, b])]
    assert parse_models(["x=missing"]) == [("x", [Path("missing")])]  # loading says it is missing
    with pytest.raises(ConfigError, match="already used"):
        parse_models([str(a), f"a={b}"])


def test_api_key_comments_are_skipped_however_indented(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# team keys\n  k1  \n   # old key, revoked\n\n\tk2\n", encoding="utf-8")
    assert read_api_keys(keys) == {"k1", "k2"}
    keys.write_text("   # only a comment\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="holds no API key"):
        read_api_keys(keys)


def test_too_many_connections_for_the_open_files_name_the_given_number_and_the_most_allowed(monkeypatch):
    """The message named --max-connections plus the accept backlog as if the user had given that."""
    import resource

    from aiayn.cli.serve import reserve_descriptors

    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 20000))
    with pytest.raises(
        ConfigError, match=r"^--max-connections 1000000 needs 1000384 open files .* give at most 19616$"
    ):
        reserve_descriptors(1_000_000, 256)
