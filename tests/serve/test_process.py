"""``aiayn serve`` as a real uvicorn process on 127.0.0.1, used by the real LibreTranslate client
(libretranslatepy) and by concurrent plain HTTP clients."""

import json
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

libretranslatepy = pytest.importorskip("libretranslatepy")
pytest.importorskip("uvicorn")

from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from tests.serve.conftest import de_en_meta, idle_within, post, start_serve, stop  # noqa: E402


def test_the_libretranslate_client_translates_as_the_cli(server, served):
    url, _, _ = server
    lt = libretranslatepy.LibreTranslateAPI(url)
    expected = Translator.from_dir(served["de-en"]).translate(["Ein Mann fährt."], SearchConfig(beam=4))[0]
    assert lt.translate("Ein Mann fährt.", "de", "en") == expected
    sentences = Translator.from_dir(served["de-en"]).translate(
        ["Zwei Hunde.", "Eine Frau liest."], SearchConfig(beam=4)
    )
    paragraph = lt.translate(
        "Ein Mann fährt. Zwei Hunde.\nEine Frau liest.", "de", "en"
    )  # as LibreTranslate reads it
    assert paragraph == f"{expected.strip()} {sentences[0].strip()}\n{sentences[1].strip()}"
    assert lt.languages() == [{"code": "de", "name": "German", "targets": ["en"]},
                              {"code": "en", "name": "English", "targets": []}]  # fmt: skip
    assert lt.detect("Ein Mann fährt.") == [{"confidence": 100.0, "language": "de"}]
    # multipart/form-data, as LibreTranslate's page (FormData) and curl -F send it
    fields = {"q": "Ein Mann fährt.", "source": "de", "target": "en"}
    answer = httpx.post(url + "translate", files={k: (None, v) for k, v in fields.items()}, timeout=30)
    assert answer.json() == {"translatedText": expected}


def test_an_ensemble_answers_as_the_library_decodes_it(server, pair):
    url, _, _ = server
    texts, search = ["Ein Mann fährt.", "Zwei Hunde"], SearchConfig(beam=2)
    status, body = post(url + "v1/translate", {"q": texts, "beam": 2, "model": "pair"})
    expected = Translator.from_dirs(pair).translate(texts, search)
    assert status == 200 and [r["translation"] for r in body["results"]] == expected
    assert all(expected != Translator.from_dir(d).translate(texts, search) for d in pair)  # both count


def test_concurrent_clients_are_batched_and_bad_requests_leave_it_serving(server, served):
    url, _, _ = server
    sentences = [f"Ein Mann {i}" + " fährt" * (i % 5) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(lambda q: post(url + "v1/translate", {"q": q, "beam": 2, "model": "de-en"}), sentences)
        )
    assert all(status == 200 for status, _ in answers)
    # requests joined and left one running search between steps; each decodes as it does alone
    alone = Translator.from_dir(served["de-en"])
    expected = [alone.translate([q], SearchConfig(beam=2))[0] for q in sentences]
    assert [body["results"][0]["translation"] for _, body in answers] == expected
    metrics = urllib.request.urlopen(url + "metrics").read().decode()
    waited = next(line for line in metrics.splitlines() if line.startswith("aiayn_wait_seconds_count"))
    assert float(waited.split()[-1]) >= 16 and "aiayn_texts_in_flight" in metrics
    lines = dict(
        line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("aiayn_batch_texts_")
    )
    assert float(lines['aiayn_batch_texts_bucket{le="1.0"}']) < float(
        lines["aiayn_batch_texts_count"]
    )  # some batch > 1
    assert post(url + "translate", {"q": "a", "source": "de", "target": "fr"})[0] == 400
    assert post(url + "v1/translate", {"q": "a", "beam": -3, "model": "de-en"})[0] == 400
    assert post(url + "translate", {"q": "Ein Mann", "source": "de", "target": "en"})[0] == 200


def test_it_binds_to_loopback_and_logs_one_line_per_request(server):
    url, _, log = server
    assert url.startswith("http://127.0.0.1:")
    post(url + "translate", {"q": "Ein", "source": "de", "target": "en"})
    time.sleep(0.3)
    out = log.read_text()
    assert (
        "on http://127.0.0.1:" in out
        and "POST /translate 200" in out
        and "Ein" not in out.split("POST", 1)[1]
    )


def test_on_loopback_it_answers_its_own_names_only(server):
    """A web page that rebinds its own name to 127.0.0.1 sends that name as Host: refused (400)."""
    url, _, _ = server
    port = url.rsplit(":", 1)[1].rstrip("/")
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "LOCALHOST"):
        assert httpx.get(url + "health", headers={"host": host}).status_code == 200, host
    r = httpx.get(url + "health", headers={"host": f"rebind.evil.example:{port}"})
    assert r.status_code == 400 and "--allowed-hosts" in r.json()["error"]
    r = httpx.get(url + "health/", headers={"host": "rebind.evil.example"})  # no redirect to that host
    assert r.status_code == 400 and "location" not in r.headers


def test_on_loopback_a_page_of_another_site_is_refused_its_own_pages_and_other_clients_answered(server):
    """A form or no-cors fetch from another site's page needs no CORS permission to be sent (it would
    spend the server's CPU, its answer unread): refused 403 by its Origin or Sec-Fetch-Site."""
    url, _, _ = server
    port = url.rsplit(":", 1)[1].rstrip("/")
    body = {"q": "Ein", "source": "de", "target": "en"}
    for headers in ({"origin": "https://evil.example"}, {"sec-fetch-site": "cross-site"},
                    {"origin": "null", "sec-fetch-site": "cross-site"},
                    {"origin": "http://[zz"}, {"origin": "http://[::1"}):  # fmt: skip  # were a 500 in text
        r = httpx.post(url + "translate", data=body, headers=headers)
        assert r.status_code == 403 and "--allowed-hosts" in r.json()["error"], headers
    for headers in (
        {},
        {"origin": f"http://127.0.0.1:{port}", "sec-fetch-site": "same-origin"},
        {"origin": "http://localhost:3000", "sec-fetch-site": "cross-site"},  # its own name
        {"origin": "https://translate.example", "sec-fetch-site": "same-origin"},
    ):  # a proxy
        assert httpx.post(url + "translate", json=body, headers=headers).status_code == 200, headers
    page = httpx.get(url, headers={"sec-fetch-site": "cross-site", "sec-fetch-mode": "navigate"})
    assert page.status_code == 200  # a link from elsewhere opens the page: reading costs nothing


def test_cors_origins_from_the_command_line_reach_a_browsers_preflight(served, tmp_path):
    de_en_meta(served["de-en"])
    url, proc = start_serve(["--model", str(served["de-en"]), "--cors-origins", "https://app.example"],
                            tmp_path / "serve.log")  # fmt: skip
    try:
        asked = {"origin": "https://app.example", "access-control-request-method": "POST",
                 "access-control-request-headers": "content-type,x-api-key"}  # fmt: skip
        r = httpx.options(url + "translate", headers=asked)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        body = {"q": "Ein", "source": "de", "target": "en"}
        r = httpx.post(url + "translate", json=body, headers={"origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        assert (
            httpx.post(url + "translate", json=body, headers={"origin": "https://evil.example"}).status_code
            == 403
        )
    finally:
        stop(proc)


def test_a_client_that_hangs_up_frees_the_search_at_once(server):
    """A client closes its connection during a long search: the server notices at once (the ASGI
    disconnect message, not a poll), answers the request 499 in its metrics and log, and the search
    stops at its next step, so the next request is answered without waiting for it."""
    url, _, log = server
    host, port = url.split("//")[1].rstrip("/").split(":")
    body = json.dumps({"q": ["Ein Mann fährt mit dem Fahrrad."] * 32, "beam": 16, "min_len": 1000,
                       "max_len": 1000, "model": "de-en"}).encode()  # fmt: skip
    head = f"POST /v1/translate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(0.3)  # the search is running: 1,000 steps of 512 rows take far longer than this
    assert idle_within(lambda: urllib.request.urlopen(url + "metrics").read().decode(), 5)  # it stopped
    t0 = time.perf_counter()
    assert post(url + "v1/translate", {"q": "Ein Mann", "model": "de-en"})[0] == 200
    assert time.perf_counter() - t0 < 5
    metrics = urllib.request.urlopen(url + "metrics").read().decode()
    assert 'aiayn_requests_total{route="/v1/translate",status="499"} 1.0' in metrics
    assert "POST /v1/translate 499" in log.read_text()


def test_a_stream_whose_client_leaves_is_a_499_and_stops(server):
    """A streaming /v1/generate whose client closes its connection at once, or after the first event:
    the job is dropped or stopped (the ASGI disconnect message, as for a plain request) and the request
    logged and counted 499, not 200 (its status line had been sent; its answer was not read)."""
    url, _, log = server
    host, port = url.split("//")[1].rstrip("/").split(":")
    before = urllib.request.urlopen(url + "metrics").read().decode()
    key = 'aiayn_requests_total{route="/v1/generate",status="499"} '
    count = float(before.split(key)[1].split()[0]) if key in before else 0.0
    body = json.dumps({"prompt": "Ein", "max_new_tokens": 256, "stream": True, "min_len": 256,
                       "model": "lm"}).encode()  # fmt: skip
    head = f"POST /v1/generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    for read_first in (False, True):
        with socket.create_connection((host, int(port))) as s:
            s.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
            got = b""
            while read_first and b"data: " not in got:  # the stream began: an event came
                got += s.recv(65536)
    metrics = lambda: urllib.request.urlopen(url + "metrics").read().decode()  # noqa: E731
    deadline = time.time() + 10
    while f"{key}{count + 2:.1f}" not in metrics():
        assert time.time() < deadline, metrics()
        time.sleep(0.05)
    assert idle_within(metrics, 5)
    assert log.read_text().count("POST /v1/generate 499") >= 2


def default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_forced_exit_answers_the_request_it_cuts_short_503_as_json(served, tmp_path):
    """SIGINT stops taking connections and lets the running search finish; a second one exits at once
    (status 130): the request it cut short is answered 503 as JSON, as every other error, and logged,
    not uvicorn's plain-text 500 with a traceback."""
    de_en_meta(served["de-en"])
    log = tmp_path / "serve.log"
    # Ctrl-C's default action in the server even where this test runs with SIGINT ignored (a job in the
    # background of a shell, as CI may run it): Python then installs no KeyboardInterrupt handler
    url, proc = start_serve(["--model", str(served["de-en"])], log, preexec_fn=default_sigint)
    answer = {}

    def long_search():  # 1,000 steps of 512 rows: far longer than the test waits
        body = {"q": ["Ein Mann fährt mit dem Fahrrad."] * 32, "beam": 16, "min_len": 1000, "max_len": 1000}
        answer["got"] = post(url + "v1/translate", body)

    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(long_search)
        deadline = time.time() + 20
        while not json.loads(urllib.request.urlopen(url + "health").read())["busy_s"]:
            assert time.time() < deadline, "the search never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        running.result(timeout=30)
    assert proc.wait(timeout=30) == 130
    assert answer["got"] == (503, {"error": "the server is shutting down; retry later"})
    text = log.read_text()
    assert "POST /v1/translate 503" in text and "Exception in ASGI application" not in text
    assert "Traceback" not in text, text  # Starlette logged the cancelled lifespan as a failure
