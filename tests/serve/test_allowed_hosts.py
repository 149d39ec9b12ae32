"""Which Host headers ``aiayn serve`` answers: its own names on loopback (against DNS rebinding)."""

import pytest

from aiayn.cli.serve import allowed_hosts
from aiayn.errors import ConfigError


@pytest.mark.parametrize(
    ("given", "host", "expected"),
    [
        (None, "127.0.0.1", {"localhost", "127.0.0.1", "::1"}),
        (None, "::1", {"localhost", "127.0.0.1", "::1"}),
        (None, "127.0.0.2", {"localhost", "127.0.0.1", "::1", "127.0.0.2"}),
        (None, "localhost", {"localhost", "127.0.0.1", "::1"}),
        (None, "0.0.0.0", set()),  # any: a server for the network answers the names it is reached by
        (None, "192.168.1.5", set()),
        (None, "127.1", {"localhost", "127.0.0.1", "::1", "127.1"}),  # binds 127.0.0.1
        ("Example.org, [::1]", "127.0.0.1", {"example.org", "localhost", "127.0.0.1", "::1"}),  # added
        ("example.org", "0.0.0.0", {"example.org"}),
        ("*", "127.0.0.1", set()),
    ],
)
def test_allowed_hosts(given, host, expected):
    assert allowed_hosts(given, host) == expected


def test_an_empty_list_is_refused():
    with pytest.raises(ConfigError, match="--allowed-hosts is empty"):
        allowed_hosts(" , ", "127.0.0.1")
