"""PyTorch's CPU threads in ``aiayn serve``: the models load on a passing thread with ``--threads``,
the main thread runs no parallel operation, and each worker thread sets its own threads (why:
``aiayn.device.in_passing_thread``; the speed it costs otherwise is measured in docs/serve.md)."""

import argparse
import socket
import threading
from types import SimpleNamespace

import pytest
import torch

from aiayn.cli import serve as serve_cli
from aiayn.device import in_passing_thread


def test_in_passing_thread_returns_raises_and_sets_threads_only_there():
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    seen = in_passing_thread(lambda: (threading.current_thread(), torch.get_num_threads()), other)
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
    assert seen[1] == other and torch.get_num_threads() == before
    with pytest.raises(KeyError, match="lost"):
        in_passing_thread(lambda: {}["lost"])


def test_serve_loads_the_models_off_the_main_thread_and_hands_the_threads_to_the_workers(monkeypatch):
    loads, apps, closed = [], [], []

    def load_service(name, dirs, device, quantize, gemm):
        loads.append((name, threading.current_thread(), torch.get_num_threads()))
        return SimpleNamespace(name=name, kind="translation")

    monkeypatch.setattr("aiayn.serve.services.load_service", load_service)
    batcher = SimpleNamespace(close=lambda finish: closed.append(finish))
    app = SimpleNamespace(state=SimpleNamespace(server=SimpleNamespace(batcher=batcher)))
    monkeypatch.setattr("aiayn.serve.app.create_app", lambda services, settings, threads: apps.append(
        (services, threads)) or app)  # fmt: skip
    configs = []
    monkeypatch.setattr("uvicorn.Server.run", lambda self, sockets: configs.append(self.config))
    parser = argparse.ArgumentParser()
    serve_cli.add_parser(parser.add_subparsers())
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["serve", "--model", "a=x", "--model", "b=y", "--port", str(port), "--threads", "1"]
    args = parser.parse_args(argv)
    before = torch.get_num_threads()
    assert serve_cli.run(args) == 0
    assert [n for n, _, _ in loads] == ["a", "b"]
    assert [([s.name for s in ss], n) for ss, n in apps] == [(["a", "b"], 1)]
    assert all(t is not threading.main_thread() and n == 1 for _, t, n in loads)
    assert torch.get_num_threads() == before  # the main thread's are untouched
    assert closed == [False]  # once uvicorn is done, whatever its workers still hold stops
    # asyncio's loop and no WebSocket protocol, whatever extras are installed: uvloop accepts outside
    # the connection guard, and an upgraded connection would never be counted out of it
    assert (configs[0].loop, configs[0].ws) == ("asyncio", "none")


def test_the_printed_address_is_a_url_for_ipv6_too():
    assert serve_cli.url("::1", 5000) == "http://[::1]:5000/"
    assert serve_cli.url("127.0.0.1", 5000) == "http://127.0.0.1:5000/"
