"""Stopping a search from outside, between two decoding steps.

A caller that may give up on a search (a server whose client has gone, or that has waited too
long) wraps it in ``stop_when(should_stop)``; every search strategy calls ``check_stop()`` once per
step, which raises ``SearchStopped`` as soon as ``should_stop()`` is true. The check is scoped to
the calling thread (a ``ContextVar``), costs one lookup per step when no one asked for it, and
changes nothing in what a search that runs to its end returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_should_stop: ContextVar[Callable[[], bool] | None] = ContextVar("aiayn_should_stop", default=None)


class SearchStopped(Exception):
    """The search was stopped between two steps because its caller asked (``stop_when``)."""


@contextlib.contextmanager
def stop_when(should_stop: Callable[[], bool]) -> Iterator[None]:
    """Searches run inside this block stop (``SearchStopped``) at the first step where
    ``should_stop()`` is true."""
    token = _should_stop.set(should_stop)
    try:
        yield
    finally:
        _should_stop.reset(token)


def check_stop() -> None:
    """Raise ``SearchStopped`` if the caller of the search running in this thread gave up."""
    should_stop = _should_stop.get()
    if should_stop is not None and should_stop():
        raise SearchStopped("the search was stopped: its caller gave up")
