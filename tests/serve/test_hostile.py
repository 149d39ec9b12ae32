"""``aiayn serve`` as a real uvicorn process against hostile and careless clients (issue 57): one
client must never hurt another. The server runs with small limits (``GUARDED``) so that each case
takes seconds, and with a low limit of open files, so that a flood of connections would exhaust it."""

import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("uvicorn")

from aiayn.models.io import save_model  # noqa: E402
from tests.decoding.fixtures import tiny_transformer  # noqa: E402
from tests.serve.conftest import de_en_meta, idle_within, post, start_serve, stop  # noqa: E402

OPEN_FILES = 400  # the server's limit of open files (RLIMIT_NOFILE): a flood of 500 connections passes it
GUARDED = ["--timeout", "1.5", "--max-connections", "40", "--header-timeout", "1", "--body-timeout", "1",
           "--send-timeout", "1", "--keep-alive", "1", "--max-attention-values", "200000",
           "--batch-window-ms", "50"]  # fmt: skip


def _few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory) -> Path:
    """A de→en model with a SentencePiece tokenizer, which (unlike the character one) refuses a text
    that is not valid Unicode."""
    from aiayn.data import SentencePieceTokenizer
    from tests.cli.test_encoder_cli import TEXTS

    path = tmp_path_factory.mktemp("spm") / "de-en"
    tok = SentencePieceTokenizer.train(TEXTS, 300, mask=True)
    save_model(tiny_transformer(tok.vocab_size, eos_bias=2.0), path)
    tok.save(path)
    de_en_meta(path)
    return path


@pytest.fixture(scope="module")
def guarded(spm_model, tmp_path_factory):
    log = tmp_path_factory.mktemp("guarded") / "serve.log"
    url, proc = start_serve(["--model", str(spm_model), *GUARDED], log, preexec_fn=_few_open_files)
    yield url, proc, log
    stop(proc)


def _health(url: str, timeout: float = 2.0) -> int:
    with urllib.request.urlopen(url + "health", timeout=timeout) as r:
        return r.status


def _open_files(proc: subprocess.Popen) -> int:
    return len(os.listdir(f"/proc/{proc.pid}/fd"))


def _raw(url: str) -> socket.socket:
    host, port = url.split("//")[1].rstrip("/").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def test_a_text_that_is_not_unicode_fails_alone_beside_valid_ones(guarded):
    """Before: the lone surrogate reached the batch's tokenizer and all nine requests were 500."""
    url, _, log = guarded
    bodies = [{"q": f"Ein Mann {i}", "source": "de", "target": "en"} for i in range(8)]
    bodies.insert(4, {"q": "\ud800", "source": "de", "target": "en"})
    with ThreadPoolExecutor(9) as pool:
        answers = list(pool.map(lambda b: post(url + "translate", b), bodies))
    statuses = [status for status, _ in answers]
    assert statuses == [200] * 4 + [400] + [200] * 4, answers
    assert "not valid Unicode" in answers[4][1]["error"]
    listed = post(url + "v1/translate", {"q": ["Ein Mann", "\ud800"]})
    assert listed[0] == 400 and "q[1]" in listed[1]["error"]
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    ("option", "value", "limit"),
    [
        ("max_len", 1_000_000, "--max-len"),
        ("min_len", 5000, "--max-len"),
        ("beam", 17, "--max-beam"),
        ("nbest", 500, "--max-beam"),
    ],  # fmt: skip
)
def test_every_decoding_option_that_sets_the_work_is_bounded(guarded, option, value, limit):
    """Before: max_len 1,000,000 kept the only worker decoding long after its client had gone."""
    url, _, _ = guarded
    body = {"q": "Ein Mann", option: value, **({"sample": True} if option == "nbest" else {})}
    status, answer = post(url + "v1/translate", body)
    assert status == 400 and limit in answer["error"] and f"{option}={value}" in answer["error"]


def test_a_search_past_the_timeout_stops_and_the_worker_serves_the_next_request(guarded):
    """A request that would decode for minutes (4 texts, beam 16, 1000 tokens each) is answered 503
    at the timeout, and its search stops then: the next request is served at once. Before, the
    worker kept decoding and every later request waited past its own timeout."""
    url, _, _ = guarded
    long = {"q": ["Ein Mann fährt"] * 4, "beam": 16, "max_len": 1000, "min_len": 1000}
    t0 = time.perf_counter()
    status, _ = post(url + "v1/translate", long)
    assert status == 503 and time.perf_counter() - t0 < 5
    assert idle_within(lambda: urllib.request.urlopen(url + "metrics").read().decode(), 5)  # it stopped
    t0 = time.perf_counter()
    status, _ = post(url + "v1/translate", {"q": "Ein Mann", "beam": 2})
    assert status == 200 and time.perf_counter() - t0 < 1.5
    assert _health(url) == 200


def test_attention_is_bounded_and_the_answer_says_so(guarded):
    """Before: attention on 4 texts grew the server by hundreds of MB and answered 155 MB."""
    url, _, _ = guarded
    status, answer = post(url + "v1/translate", {"q": ["Ein Mann fährt Fahrrad."] * 4, "attention": True,
                                                 "max_len": 100, "min_len": 100})  # fmt: skip
    assert status == 413 and "--max-attention-values" in answer["error"] and "200,000" in answer["error"]
    status, answer = post(url + "v1/translate", {"q": "Ein Mann", "attention": True, "max_len": 5})
    assert status == 200 and answer["results"][0]["attention"]["encoder"]


def test_a_flood_of_half_sent_headers_neither_exhausts_files_nor_blocks_health(guarded):
    """500 connections that send half a request's headers and wait: the server keeps at most
    --max-connections of them (closing the oldest idle one for each new one), /health answers
    meanwhile, and each is closed --header-timeout after it opened. Before, the 500 took every
    file the process may open and /health timed out."""
    url, proc, _ = guarded
    before = _open_files(proc)
    flood = []
    for _ in range(500):
        s = _raw(url)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # no blank line: the headers never end
        flood.append(s)
    try:
        t0 = time.perf_counter()
        assert _health(url, timeout=5) == 200 and time.perf_counter() - t0 < 2.0
        assert _open_files(proc) <= before + 40 + 40  # the cap, and at most one accept burst closing
        time.sleep(1.5)  # past --header-timeout: every half-sent request is closed
        for s in flood[-10:]:
            s.settimeout(1)
            try:  # closed: an orderly end, or a reset (the server aborts a socket with unread bytes)
                data = s.recv(100)
            except ConnectionResetError:
                data = b""
            assert data == b""
    finally:
        for s in flood:
            s.close()


def test_a_client_that_reads_none_of_its_answers_is_cut_off_at_the_send_timeout(guarded):
    """Twelve pipelined requests whose answers (attention weights) come to about 12 MB, from a client
    that reads nothing: once the kernel's buffers (up to 4 MB here) and asyncio's are full, the
    server's writes stall, and --send-timeout (1 s here) later the connection is aborted, so the
    client gets only some of the answers. Before, it held its connection (and a place under
    --max-connections) for as long as it liked, and got every answer in the end. The request whose
    answer was cut off is logged and counted so, not by the 200 its answer began with."""
    url, _, log = guarded
    host, port = url.split("//")[1].rstrip("/").split(":")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    s.connect((host, int(port)))
    body = json.dumps({"q": ["Ein Mann", "Zwei Hunde"], "attention": True, "max_len": 100, "min_len": 100})
    request = (f"POST /v1/translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n{body}").encode()  # fmt: skip
    s.sendall(request * 12)
    time.sleep(5.0)  # the answers are made until the writes stall: read nothing meanwhile
    s.settimeout(10)
    data = b""
    try:
        while chunk := s.recv(1 << 20):
            data += chunk
    except ConnectionResetError:
        pass
    finally:
        s.close()
    answered = data.count(b"HTTP/1.1 200 OK")
    assert 1 <= answered < 12 and len(data) > 1_000_000, (answered, len(data))
    assert _health(url) == 200
    assert log.read_text().count("POST /v1/translate cut off") == 1
    metrics = urllib.request.urlopen(url + "metrics", timeout=5).read().decode()
    assert 'aiayn_requests_total{route="/v1/translate",status="cut off"} 1.0' in metrics


def test_room_under_the_cap_comes_from_closing_connections_first_then_idle_ones_never_busy_ones():
    """A connection closing but stalled flushing to a client that reads nothing is the first to go
    (it takes no more requests), then the oldest idle one; each is aborted once; one closing while
    its client reads (an answer with Connection: close) and busy ones are never cut off: with only
    those left, the new one is refused."""
    from types import SimpleNamespace

    from aiayn.serve.connections import ConnectionGuard

    class Transport:
        def __init__(self, closing):
            self.closing, self.aborts = closing, 0

        def is_closing(self):
            return self.closing

        def abort(self):
            self.aborts += 1
            self.closing = True  # connection_lost comes in the next turn of the loop

    class Connection:  # what the guard reads of uvicorn's protocol
        def __init__(self, opened, closing=False, busy=False, stalled=False):
            self.opened, self.aborted, self.transport = opened, False, Transport(closing)
            self.cycle = SimpleNamespace(response_complete=not busy)
            self.stalled = object() if stalled else None  # the send timer, while writes are paused

    busy, idle, stuck = Connection(0, busy=True), Connection(1), Connection(3, closing=True, stalled=True)
    reading = Connection(2, closing=True)  # its client is reading the rest of its answer
    guard = ConnectionGuard(4, 1.0, 1.0, 1.0)
    guard.connections, guard.open = {busy, idle, stuck, reading}, 4
    assert guard.accepted(None) and stuck.transport.aborts == 1 and idle.transport.aborts == 0
    assert guard.accepted(None) and idle.transport.aborts == 1 and stuck.transport.aborts == 1
    assert not guard.accepted(None) and busy.transport.aborts == 0 and reading.transport.aborts == 0


@pytest.mark.parametrize(("path", "status"), [("translate", b"408"), ("nope", b"404")])
def test_a_body_sent_a_byte_at_a_time_is_cut_off_within_the_body_timeout(guarded, path, status):
    """A route that reads the body answers 408 at --body-timeout; one that does not (a 404) answers
    at once, and the connection still closes when the body is late. Before, both stayed open."""
    url, _, _ = guarded
    s = _raw(url)
    s.sendall(f"POST /{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
              + b"Content-Length: 100\r\n\r\n")  # fmt: skip
    t0, answer, closed = time.perf_counter(), b"", False
    s.settimeout(0.25)
    try:
        while time.perf_counter() - t0 < 5 and not closed:
            try:
                s.sendall(b" ")
                chunk = s.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                chunk = b""
            closed = not chunk
            answer += chunk
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 " + status) and closed
    assert time.perf_counter() - t0 < 3.5
    if status == b"408":
        assert b"--body-timeout" in answer


def test_hostile_bodies_are_4xx_json_and_leave_no_traceback(guarded):
    url, _, log = guarded
    deep = '{"q": ' + "[" * 100_000 + "]" * 100_000 + ', "source": "de", "target": "en"}'
    digits = '{"q": "a", "beam": ' + "7" * 5000 + "}"
    for path, raw in (("translate", deep), ("v1/translate", digits)):
        req = urllib.request.Request(url + path, raw.encode(), {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 400 and "error" in json.loads(e.value.read())
    status, answer = post(url + "translate", {"q": "a", "source": "de", "target": "en", "api_key": ["x"]})
    assert status == 400 and "api_key" in answer["error"]
    time.sleep(0.2)
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GARBAGE\r\n\r\n",
        b"GET /health HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc",
        b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nZZZ\r\n",
    ],
    ids=["garbage", "no-host", "two-lengths", "bad-chunk"],
)
def test_a_request_http_cannot_parse_is_answered_400_as_json(guarded, request_bytes):
    url, _, _ = guarded
    with _raw(url) as s:
        s.sendall(request_bytes)
        answer = b""
        while chunk := s.recv(65536):  # the server closes the connection after its answer
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head.lower(), answer
    assert json.loads(body) == {"error": "Invalid HTTP request received."}
    assert _health(url) == 200


def test_a_client_that_leaves_mid_body_is_a_499_not_a_server_failure(guarded):
    """A client that closes its connection before its body is in made a choice, as one that leaves
    while queued: logged 499, no traceback, no 500 counted."""
    url, _, log = guarded
    s = _raw(url)
    s.sendall(b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b'Content-Length: 100\r\n\r\n{"q":')  # fmt: skip
    time.sleep(0.2)
    s.close()
    time.sleep(0.5)
    text = log.read_text()
    assert "POST /translate 499" in text and "ClientDisconnect" not in text and "Traceback" not in text
    with urllib.request.urlopen(url + "metrics", timeout=5) as r:
        assert 'route="/translate",status="500"' not in r.read().decode()


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "nope", 404), ("DELETE", "health", 405),
                                                        ("POST", "languages", 405)])  # fmt: skip
def test_unknown_paths_and_methods_answer_the_documented_error_shape(guarded, method, path, status):
    url, _, _ = guarded
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(urllib.request.Request(url + path, method=method), timeout=5)
    body = json.loads(e.value.read())
    assert e.value.code == status and set(body) == {"error"}


def test_head_answers_as_get_without_a_body(guarded):
    url, _, _ = guarded
    with urllib.request.urlopen(urllib.request.Request(url + "health", method="HEAD"), timeout=5) as r:
        assert r.status == 200 and r.read() == b""


def test_a_port_in_use_fails_with_one_line_naming_it_and_prints_no_url(spm_model):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = [sys.executable, "-m", "aiayn", "serve", "--model", str(spm_model), "--port", str(port)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "http://" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "--port" in lines[0], done.stderr
