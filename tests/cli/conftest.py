"""Fixtures of the CLI tests: tiny model directories (see tests/decoding/fixtures.py)."""

from tests.decoding.fixtures import model_dirs as model_dirs
