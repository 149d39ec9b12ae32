"""The errors a user can fix, as types of their own.

Anything the user got wrong — a bad config field or option, unusable data, a model directory that
cannot be used, an output that would overwrite something, a device that is not there — is raised
as an ``AiaynError`` whose message names the file or field and says what to do. The command line
prints exactly these as one line and exits non-zero; any other exception is a bug and keeps its
traceback. Each type is also a ``ValueError``, so library callers may catch the familiar type.
"""

from __future__ import annotations


class AiaynError(ValueError):
    """Something the user can fix; the message names the file or field and the fix."""


class ConfigError(AiaynError):
    """A config field, recipe key or command-line option has a bad value."""


class DataError(AiaynError):
    """A corpus, tokenizer or input file cannot be read or used."""


class ModelDirError(AiaynError):
    """A model, checkpoint or run directory is missing, incomplete, corrupt or of the wrong kind."""


class OutputError(AiaynError):
    """Writing an output would destroy an input or an existing model or run."""


class DeviceError(AiaynError):
    """The requested device does not exist on this machine or this PyTorch build."""
