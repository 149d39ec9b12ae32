"""Fixtures of the decoding tests (see fixtures.py)."""

from tests.decoding.fixtures import model_dirs as model_dirs
