"""The routes in-process (FastAPI's TestClient): LibreTranslate's API, the native API, limits,
errors, metrics. Every answer to a bad request is 4xx JSON and the next good request succeeds."""

import collections
import json
import os
import time

import anyio.to_thread
import pytest
import torch

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

from aiayn.cli.main import main  # noqa: E402
from aiayn.decoding.classifier import MaskFiller  # noqa: E402
from aiayn.decoding.generator import Generator  # noqa: E402
from aiayn.decoding.options import SearchConfig  # noqa: E402
from aiayn.decoding.translator import Translator  # noqa: E402
from aiayn.errors import ConfigError  # noqa: E402
from aiayn.serve.app import create_app  # noqa: E402
from aiayn.serve.batcher import Batcher  # noqa: E402
from aiayn.serve.connections import LEFT  # noqa: E402
from aiayn.serve.html_text import HtmlText  # noqa: E402
from aiayn.serve.services import load_service  # noqa: E402
from aiayn.serve.settings import Settings  # noqa: E402
from tests.cli.test_encoder_cli import TEXTS, encoder_dir  # noqa: E402
from tests.decoding.fixtures import translation_dir  # noqa: E402
from tests.helpers import assert_close  # noqa: E402
from tests.serve.conftest import de_en_meta, idle_within  # noqa: E402
from tests.serve.test_html_text import unreadable  # noqa: E402


@pytest.fixture(scope="module")
def client(served):
    de_en_meta(served["de-en"])
    services = [load_service(name, path) for name, path in served.items()]
    settings = Settings(char_limit=100, batch_limit=4, max_body_bytes=4096, max_beam=8,
                        api_keys=frozenset({"secret"}))  # fmt: skip
    with TestClient(create_app(services, settings)) as c:
        yield c


KEY = {"api_key": "secret"}


def test_languages_and_translate_as_libretranslate(client, served):
    assert client.get("/languages").json() == [
        {"code": "de", "name": "German", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": []},  # a target only: clients list it as one
    ]
    r = client.post("/translate", json={"q": "Ein Mann", "source": "de", "target": "en", **KEY})
    assert r.status_code == 200
    expected = Translator.from_dir(served["de-en"]).translate(["Ein Mann"], SearchConfig(beam=4))[0]
    assert r.json() == {"translatedText": expected}  # what aiayn translate gives, beam 4
    r = client.post(
        "/translate", data={"q": "Ein Mann", "source": "auto", "target": "en", **KEY}
    )  # form-encoded
    assert r.json()["translatedText"] == expected and r.json()["detectedLanguage"]["language"] == "de"
    fields = {"q": "Ein Mann", "source": "de", "target": "en", **KEY}  # multipart, as FormData and curl -F
    r = client.post("/translate", files={k: (None, v) for k, v in fields.items()})
    assert r.status_code == 200 and r.json() == {"translatedText": expected}, r.text
    fields = [("q", "Ein Mann"), ("q", "Zwei"), ("target", "en"), ("api_key", "secret")]  # q twice: a list
    r = client.post("/translate", files=[(k, (None, v)) for k, v in fields])
    assert r.status_code == 200 and len(r.json()["translatedText"]) == 2, r.text
    r = client.post("/detect", data={"q": "Ein Mann", **KEY})
    assert r.json() == [{"confidence": 100.0, "language": "de"}]
    r = client.post("/translate", json={"q": ["Ein Mann", "Zwei"], "source": "de", "target": "en",
                                        "alternatives": 2, **KEY})  # fmt: skip
    body = r.json()
    assert len(body["translatedText"]) == 2 and all(len(a) == 2 for a in body["alternatives"])


def test_libretranslate_html_translates_the_texts_between_the_tags(client, served, monkeypatch):
    translator = Translator.from_dir(served["de-en"])
    one, two = translator.translate(["Ein Mann", "Zwei Hunde"], SearchConfig(beam=4))
    page = '<p class="a">Ein Mann</p>\n<p translate="no">Ein Mann</p><b>Zwei  Hunde</b>!'
    r = client.post("/translate", json={"q": [page, "<br>"], "source": "de", "target": "en",
                                        "format": "html", "alternatives": 2, **KEY})  # fmt: skip
    assert r.status_code == 200, r.text
    html = f'<p class="a">{one}</p>\n<p translate="no">Ein Mann</p><b>{two}</b>!'.replace("&", "&amp;")
    assert r.json() == {"translatedText": [html, "<br>"], "alternatives": [[], []]}  # none for HTML
    r = client.post("/translate", json={"q": ["<p>Ein Mann</p>", "<b>Zwei</b>"], "target": "en",
                                        "format": "html", **KEY})  # fmt: skip  # source auto, a list
    assert r.status_code == 200 and len(r.json()["detectedLanguage"]) == 2, r.text
    with monkeypatch.context() as m:  # a parser's complaint (Python's own; versions differ in what raises)
        m.setattr(HtmlText, "feed", unreadable)
        r = client.post("/translate", json={"q": "a <p> b", "target": "en", "format": "html", **KEY})
    assert r.status_code == 400 and "the markup cannot be read" in r.json()["error"], r.text
    # the texts between tags are bounded by --sentence-limit (test_html_texts_count_as_sentences), not by
    # --batch-limit (4 here): LibreTranslate translates a list of 33 items
    r = client.post("/translate", json={"q": "<p>a</p>" * 5, "target": "en", "format": "html", **KEY})
    assert r.status_code == 200 and r.json()["translatedText"].count("<p>") == 5, r.text
    for unset in (None, ""):  # a client that sends its unset fields: LibreTranslate reads text
        r = client.post("/translate", json={"q": "<b>Ein</b>", "target": "en", "format": unset, **KEY})
        assert r.status_code == 200 and "<b>" not in r.json()["translatedText"], r.text
    form = {"q": "<b>Ein</b>", "target": "en", "format": "", **KEY}
    assert client.post("/translate", data=form).status_code == 200


def test_html_texts_count_as_sentences_and_characters_count_per_request(served):
    """A page's texts between tags are bounded as sentences (--sentence-limit), and on /translate
    --char-limit holds for the request's texts together, as LibreTranslate counts it (it held for each
    text alone); on /v1 for each text."""
    de_en_meta(served["de-en"])
    settings = Settings(sentence_limit=6, char_limit=40)
    with TestClient(create_app([load_service("de-en", served["de-en"])], settings)) as c:
        html, de_en = {"source": "de", "target": "en", "format": "html"}, {"source": "de", "target": "en"}
        ok = c.post("/translate", json={"q": "<i>a</i>" * 5, **html})
        assert ok.status_code == 200, ok.text
        r = c.post("/translate", json={"q": "a<br>" * 7, **html})
        assert r.status_code == 400 and "(7 sentences) exceeds sentence limit (6)" in r.json()["error"]
        r = c.post("/translate", json={"q": ["x" * 30, "y" * 11], **de_en})
        assert r.status_code == 400 and "(41 characters) exceeds character limit (40)" in r.json()["error"]
        assert c.post("/translate", json={"q": ["x" * 30, "y" * 10], **de_en}).is_success
        # aiayn's own routes take a batch of texts of that length each (documents to classify, say)
        assert c.post("/v1/translate", json={"q": ["x" * 30, "y" * 30]}).is_success
        r = c.post("/v1/translate", json={"q": ["x" * 41]})
        assert r.status_code == 400 and "(41 characters) exceeds character limit (40)" in r.json()["error"]


def test_without_a_model_name_the_one_encoder_that_can_is_chosen(client):
    """Two encoders are loaded, a classifier and a masked LM: each route has one that can answer it."""
    r = client.post("/v1/classify", json={"q": "a great film", **KEY})
    assert r.status_code == 200 and r.json()["model"] == "sentiment", r.text
    r = client.post("/v1/fill-mask", json={"q": "a great <mask> .", **KEY})
    assert r.status_code == 200 and r.json()["model"] == "mlm", r.text


def test_a_multipart_media_type_is_read_whatever_its_case(client):
    """Media types are case-insensitive (RFC 9110): ``Multipart/Form-Data`` is a multipart form."""
    parts = [("q", "Ein Mann"), ("source", "de"), ("target", "en"), ("api_key", "secret")]
    body = "".join(f'--XyZ\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n' for k, v in parts)
    r = client.post("/translate", content=(body + "--XyZ--\r\n").encode(),
                    headers={"content-type": "Multipart/Form-Data; boundary=XyZ"})  # fmt: skip
    assert r.status_code == 200 and "translatedText" in r.json(), r.text


def test_source_auto_is_refused_where_two_loaded_sources_translate_into_the_target(served, tmp_path):
    """aiayn detects no language: with de→en and fr→en loaded, ``auto`` names neither (LibreTranslate
    would detect); with one source per target it is that source."""
    import shutil

    de_en_meta(served["de-en"])
    fr = shutil.copytree(served["de-en"], tmp_path / "fr-en")
    meta = json.loads((fr / "config.json").read_text())
    (fr / "config.json").write_text(json.dumps({**meta, "src_lang": "fr"}))
    services = [load_service("de-en", served["de-en"]), load_service("fr-en", fr)]
    with TestClient(create_app(services, Settings())) as c:
        assert [lang["code"] for lang in c.get("/languages").json()] == ["de", "en", "fr"]
        r = c.post("/translate", json={"q": "Ein Mann", "source": "auto", "target": "en"})
        assert r.status_code == 400 and "de, fr all translate into en" in r.json()["error"], r.text
        assert c.post("/translate", json={"q": "Ein Mann", "source": "fr", "target": "en"}).status_code == 200
        r = c.post("/detect", json={"q": "Ein Mann"})
        assert r.status_code == 400 and "read de, fr" in r.json()["error"], r.text


def test_native_translate_with_options_and_attention(client):
    r = client.post(
        "/v1/translate", json={"q": ["Ein Mann"], "beam": 3, "nbest": 2, "attention": True, **KEY}
    )
    result = r.json()["results"][0]
    assert (
        len(result["hypotheses"]) == 2
        and result["hypotheses"][0]["score"] >= result["hypotheses"][1]["score"]
    )
    att = result["attention"]
    src, tgt = len(att["src_tokens"]), len(att["tgt_tokens"])
    assert len(att["encoder"]) == 2 and len(att["encoder"][0]) == 4  # layers, heads
    assert len(att["cross"][0][0]) == tgt and len(att["cross"][0][0][0]) == src
    assert all(abs(sum(row) - 1) < 1e-3 for row in att["decoder_self"][1][2])


def test_minimum_bayes_risk_is_the_librarys(client, served):
    """The server reorders each beam as Translator.search does (itself tested against sacreBLEU), and
    for these texts that order is not the beam's own: a server that ignored ``mbr`` would fail."""
    q = ["Ein Mann", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
    r = client.post("/v1/translate", json={"q": q, "beam": 6, "nbest": 6, "mbr": "chrf", **KEY})
    assert r.status_code == 200
    got = [[(h["text"], h["score"]) for h in res["hypotheses"]] for res in r.json()["results"]]
    t = Translator.from_dir(served["de-en"])
    src, _ = t.encode(q)

    def nbest(config: SearchConfig) -> list[list[tuple[str, float]]]:
        return [[(t.detokenize(h), round(h.score, 4)) for h in hyps] for hyps in t.search(src, config)]

    expected = nbest(SearchConfig(beam=6, nbest=6, mbr="chrf"))
    assert got == expected and expected != nbest(SearchConfig(beam=6, nbest=6))


def _metric(client, name: str) -> float:
    line = next(x for x in client.get("/metrics").text.splitlines() if x.startswith(name + " "))
    return float(line.split()[1])


def test_generations_count_their_tokens_and_decoding_its_seconds(client, served):
    """/metrics counts /v1/generate's tokens (the generator's own count for the prompt, streamed or
    not) and the seconds the workers decoded; throughput is PromQL's rate() of the counters."""
    from aiayn.decoding.generator import Generator

    expected = len(Generator.from_dir(served["lm"]).complete("Ein", 6, SearchConfig(beam=1))[0].tokens)
    tokens = _metric(client, "aiayn_output_tokens_total")
    seconds = _metric(client, "aiayn_decode_seconds_total")
    body = {"prompt": "Ein", "max_new_tokens": 6, "greedy": True, **KEY}
    assert client.post("/v1/generate", json=body).status_code == 200
    with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as s:
        assert s.status_code == 200 and s.read()
    assert expected and _metric(client, "aiayn_output_tokens_total") - tokens == 2 * expected
    assert _metric(client, "aiayn_decode_seconds_total") > seconds


@pytest.mark.parametrize("scheduling", ["step", "batch"])
def test_translations_count_the_tokens_of_their_answers_however_scheduled(served, scheduling):
    """By step, every step counted a token per text in flight: the end of sentence and a beam's steps
    past its best hypothesis too, unlike whole batches."""
    q = ["Ein Mann", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
    settings = Settings(scheduling=scheduling)
    with TestClient(create_app([load_service("de-en", served["de-en"])], settings)) as c:
        before = _metric(c, "aiayn_output_tokens_total")
        r = c.post("/v1/translate", json={"q": q, "beam": 8, "min_len": 3})  # this model ends at once
        made = sum(len(result["hypotheses"][0]["tokens"]) for result in r.json()["results"])
        assert made and _metric(c, "aiayn_output_tokens_total") - before == made


def test_generate_classify_fill_mask(client):
    r = client.post("/v1/generate", json={"prompt": "Ein", "max_new_tokens": 5, "seed": 1, **KEY})
    assert r.status_code == 200 and r.json()["text"]
    again = client.post("/v1/generate", json={"prompt": "Ein", "max_new_tokens": 5, "seed": 1, **KEY})
    assert again.json()["text"] == r.json()["text"]  # seeded
    filtered = {"prompt": "Ein", "max_new_tokens": 5, "seed": 1, "top_k": 5, "top_p": 0.9, **KEY}
    assert client.post("/v1/generate", json=filtered).status_code == 200  # one row's logits, filtered
    with client.stream("POST", "/v1/generate", json={"prompt": "Ein", "max_new_tokens": 4, "stream": True,
                                                    "greedy": True, **KEY}) as s:  # fmt: skip
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1]["done"] and "".join(e["text"] for e in events[:-1]) == events[-1]["text"]
    r = client.post(
        "/v1/classify", json={"q": ["a great movie", "dull"], "top_k": 2, "model": "sentiment", **KEY}
    )
    results = r.json()["results"]
    assert len(results) == 2 and {x["label"] for x in results[0]} == {"negative", "positive"}
    r = client.post("/v1/fill-mask", json={"q": "a great <mask> .", "top_k": 3, "model": "mlm", **KEY})
    assert len(r.json()["masks"][0]) == 3


def test_generate_ends_at_eos_only_when_asked_as_the_cli(client, served, capsys):
    """aiayn generate writes max_new_tokens unless --stop-at-eos; /v1/generate likewise unless
    stop_at_eos (or min_len) is given: the same seed gives the CLI's text either way."""
    differ = 0
    for seed in range(1, 7):
        body = {"prompt": "Ein", "max_new_tokens": 60, "temperature": 3.0, "seed": seed, "model": "lm", **KEY}
        answers = []
        for stop in (False, True):
            flags = ["--stop-at-eos"] if stop else []
            argv = ["generate", "--model", str(served["lm"]), "--prompt", "Ein", "--max-new-tokens", "60",
                    "--temperature", "3.0", "--seed", str(seed), *flags]  # fmt: skip
            assert main(argv) == 0
            cli = capsys.readouterr().out.removesuffix("\n")
            api = client.post("/v1/generate", json={**body, "stop_at_eos": stop}).json()["text"]
            assert "Ein" + api == cli, (seed, stop)
            answers.append(api)
        differ += answers[0] != answers[1]
    assert differ, "no seed sampled eos: the test would not see a difference"


def test_a_request_s_text_is_tokenized_once(client, monkeypatch):
    """/v1/generate and /v1/fill-mask tokenize their text when the request arrives (a text the
    tokenizer refuses fails its own request there); the worker reads those ids, not the text again."""
    calls = collections.Counter()

    def counting(name, real):
        def counted(self, *args):
            calls[name] += 1
            return real(self, *args)

        return counted

    for cls, name in ((Generator, "encode"), (MaskFiller, "query_ids")):
        monkeypatch.setattr(cls, name, counting(name, getattr(cls, name)))
    body = {"prompt": "Ein Mann", "max_new_tokens": 4, "greedy": True, **KEY}
    text = client.post("/v1/generate", json=body).json()["text"]
    with client.stream("POST", "/v1/generate", json={**body, "stream": True}) as s:
        events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1]["text"] == text  # the same continuation from the same ids
    r = client.post("/v1/fill-mask", json={"q": "a <mask> film .", "model": "mlm", **KEY})
    assert r.status_code == 200 and r.json()["masks"][0]
    assert calls == {"encode": 2, "query_ids": 1}


def test_a_translation_request_never_waits_for_the_thread_pool(client, monkeypatch):
    """FastAPI runs a plain ``def`` dependency or route on AnyIO's worker threads: one thread hop
    per request, and one more thread for the GIL beside the decoding worker's. Every dependency and
    route a translation goes through is ``async``, so none runs there."""
    hops = []
    real = anyio.to_thread.run_sync

    async def counted(func, *args, **kwargs):
        hops.append(getattr(func, "__name__", repr(func)))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    assert (
        client.post("/translate", json={"q": "Ein Mann", "source": "de", "target": "en", **KEY}).status_code
        == 200
    )
    assert client.post("/v1/translate", json={"q": "Ein Mann", **KEY}).status_code == 200
    assert hops == []


@pytest.mark.parametrize(
    "path, kwargs, status, fragment",
    [
        (
            "/translate",
            {"content": b"{", "headers": {"content-type": "application/json"}},
            400,
            "malformed JSON",
        ),
        ("/translate", {"content": b"q=a", "headers": {"content-type": "text/plain"}}, 415, "text/plain"),
        (
            "/translate",
            {"json": {"q": "x" * 101, "source": "de", "target": "en", **KEY}},
            400,
            "character limit",
        ),
        ("/translate", {"json": {"q": ["a"] * 5, "source": "de", "target": "en", **KEY}}, 400, "text limit"),
        ("/translate", {"json": {"q": "a", "source": "de", "target": "xx", **KEY}}, 400, "not available"),
        ("/translate", {"json": {"q": "", "source": "de", "target": "en", **KEY}}, 400, "missing q"),
        ("/translate", {"json": {"q": [], "source": "de", "target": "en", **KEY}}, 400, "missing q"),
        # a lone surrogate (valid JSON, not UTF-8): refused by the parser, never quoted into a message
        (
            "/translate",
            {
                "content": b'{"q": "a", "source": "de", "target": "\\ud800", "api_key": "secret"}',
                "headers": {"content-type": "application/json"},
            },
            400,
            "valid string",
        ),
        ("/v1/generate", {"json": {"prompt": "a", "temperature": 1e-45, **KEY}}, 400, "temperature=1e-45"),
        (
            "/translate",
            {"json": {"q": "a", "source": "de", "target": "en", "api_key": "wrong"}},
            403,
            "API key",
        ),
        ("/translate", {"json": {"q": "a", "source": "de", "target": "en"}}, 403, "API key"),
        (
            "/translate",
            {"content": b'{"q": "\xff", "target": "en"}', "headers": {"content-type": "application/json"}},
            400,
            "not UTF-8",
        ),
        (
            "/translate",
            {"content": b"x" * 5000, "headers": {"content-type": "application/json"}},
            413,
            "4096",
        ),
        (
            "/translate",
            {"files": {"q": ("a.txt", b"Ein Mann"), "target": (None, "en"), "api_key": (None, "secret")}},
            400,
            "file parts are not read (field 'q')",
        ),
        (
            "/translate",
            {"content": b"q=a", "headers": {"content-type": "multipart/form-data"}},
            400,
            "malformed multipart body",
        ),
        (
            "/translate",
            {"files": {"q": (None, b"\xff"), "target": (None, "en"), "api_key": (None, "secret")}},
            400,
            "form field is not UTF-8",
        ),
        ("/translate", {"data": {"q": "%FC", "target": "en", **KEY}}, 200, ""),
        (
            "/translate",
            {
                "content": b"q=%FC&target=en&api_key=secret",
                "headers": {"content-type": "application/x-www-form-urlencoded"},
            },
            400,
            "not UTF-8 once decoded",
        ),
        ("/detect", {"data": {"q": "", **KEY}}, 400, "missing q"),
        ("/v1/translate", {"json": {"q": "a", "beam": -1, **KEY}}, 400, "beam=-1"),
        ("/v1/translate", {"json": {"q": "a", "beam": 9, **KEY}}, 400, "limit of 8"),
        ("/v1/translate", {"json": {"q": "a", "beam": 4, "mbr": "rouge", **KEY}}, 400, "mbr='rouge'"),
        ("/v1/translate", {"json": {"q": 3, **KEY}}, 400, "q must be a string"),
        ("/v1/generate", {"json": {"prompt": "a", "max_new_tokens": 0, **KEY}}, 400, "max_new_tokens"),
        ("/v1/classify", {"json": {"q": "  ", "model": "sentiment", **KEY}}, 400, "q is blank: there is"),
        ("/v1/classify", {"json": {"q": ["good", ""], "model": "sentiment", **KEY}}, 400, "q[1] is blank"),
        ("/v1/generate", {"json": {"prompt": "a", "greedy": True, "sample": True, **KEY}}, 400, "contradict"),
        (
            "/v1/generate",
            {"json": {"prompt": "a", "beam": 4, "nbest": 2, **KEY}},
            400,
            "beam, nbest: not read",
        ),
        ("/v1/generate", {"json": {"prompt": "a \u2713", **KEY}}, 400, "vocabulary lacks ('\u2713')"),
        (
            "/v1/generate",
            {"json": {"prompt": "a", "greedy": True, "top_k": 5, **KEY}},
            400,
            "top_k=5 applies to sampling",
        ),
        (
            "/v1/translate",
            {"json": {"q": "a", "temperature": 0.5, **KEY}},
            400,
            "temperature=0.5 applies to sampling",
        ),
        ("/v1/classify", {"json": {"q": "a", "model": "nope", **KEY}}, 400, "no encoder model named 'nope'"),
        (  # it was queued and refused by the worker, without "Invalid request"
            "/v1/fill-mask",
            {"json": {"q": "no mask here", "model": "mlm", **KEY}},
            400,
            "Invalid request: the query 'no mask here' has no <mask>",
        ),
        ("/v1/classify", {"json": {"q": "a", "model": "mlm", **KEY}}, 400, "'mlm' has no classification"),
        (
            "/v1/fill-mask",
            {"json": {"q": "<mask> " * 11, "top_k": 10, "model": "mlm", **KEY}},
            400,
            "11 <mask>s × top_k=10 is over the 100 fillers an answer holds",
        ),
        (
            "/v1/translate",
            {"json": {"q": "a", "sample": True, "temperature": 1e39, **KEY}},
            400,
            "temperature",
        ),
        ("/v1/generate", {"json": {"prompt": "a", "temperature": 1e39, **KEY}}, 400, "temperature=1e+39"),
        (
            "/v1/translate",
            {"json": {"q": "a", "beams": 3, **KEY}},
            400,
            "beams=3 is not a field of this request",
        ),
        ("/v1/classify", {"json": {"q": "a", "topk": 3, **KEY}}, 400, "topk=3 is not a field"),
        ("/v1/translate", {"json": {"q": "a", "max_len_b": 5000, **KEY}}, 400, "max_len_b=5000 is over"),
        ("/v1/translate", {"json": {"q": "a", "lenpen": 1e6, **KEY}}, 400, "lenpen=1000000.0 must be within"),
        (
            "/v1/translate",
            {"json": {"q": "a", "r2l_beam": 2, **KEY}},
            400,
            "r2l_beam: 'de-en' is not a bidirectional model",
        ),
        ("/v1/translate", {"json": {"q": "a", "lenpen_kind": "simple", "max_len_b": 3, **KEY}}, 200, ""),
        ("/v1/generate", {"json": {"prompt": "a", "max_len_b": 3, **KEY}}, 400, "max_len_b: not read"),
        ("/v1/generate", {"json": {"prompt": "a", "top_p": 1e-46, "max_new_tokens": 3, **KEY}}, 200, ""),
    ],
)
def test_bad_requests_are_4xx_json_and_the_server_keeps_serving(client, path, kwargs, status, fragment):
    r = client.post(path, **kwargs)
    assert r.status_code == status and (status == 200 or fragment in r.json()["error"]), r.text
    ok = client.post("/translate", json={"q": "Ein Mann", "source": "de", "target": "en", **KEY})
    assert ok.status_code == 200


def test_health_metrics_and_docs(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and {m["kind"] for m in health["models"]} == {
        "translation",
        "lm",
        "encoder",
    }
    text = client.get("/metrics").text
    for name in ("aiayn_requests_total", "aiayn_request_seconds_bucket", "aiayn_batch_texts_bucket",
                 "aiayn_queue_depth", "aiayn_decode_seconds_total", "aiayn_texts_in_flight",
                 "aiayn_wait_seconds_bucket"):  # fmt: skip
        assert name in text
    assert client.get("/docs").status_code == 200 and "/v1/translate" in client.get("/openapi.json").text


def test_serve_refuses_bad_options_in_one_line(served, capsys, tmp_path):
    (tmp_path / "keys").write_text("\n", encoding="utf-8")
    cases = [
        (["serve", "--model", str(served["lm"]), "--api-keys", str(tmp_path / "keys")], "holds no API key"),
        (["serve", "--model", str(served["lm"]), "--port", "0"], "not a TCP port"),
        (["serve", "--model", f"a={served['lm']}", "--model", f"a={served['mlm']}"], "already used"),
        (["serve", "--model", str(tmp_path)], "not an aiayn model directory"),
        (["serve", "--model", str(served["lm"]), "--queue-size", "0"], "--queue-size=0"),
        (["serve", "--model", f"x={served['de-en']}{os.pathsep}"], "an empty directory name"),
        (["serve", "--model", f"x={served['de-en']}{os.pathsep}{served['lm']}"], "all translation models"),
        (["serve", "--model", f"x={served['sentiment']}{os.pathsep}{served['de-en']}"], "or all classifiers"),
        (["serve", "--model", f"x={served['lm']}{os.pathsep}{served['lm']}"], "not lm models"),
        (["serve", "--model", f"x={served['sentiment']}{os.pathsep}{served['mlm']}"], "classification head"),
    ]
    for argv, fragment in cases:
        assert main(argv) == 1
        assert fragment in capsys.readouterr().err


def test_a_10mb_body_and_a_request_past_its_timeout(served):
    de_en_meta(served["de-en"])
    app = create_app([load_service("de-en", served["de-en"])], Settings(timeout_s=0.05))  # the search starts
    with TestClient(app) as c:
        r = c.post(
            "/translate",
            content=b"{" + b" " * (10 << 20) + b"}",
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 413 and "2097152 bytes" in r.json()["error"]  # the default limit, 2 MiB
        long = {"q": ["Ein Mann"] * 8, "beam": 16, "min_len": 1000, "max_len": 1000}  # seconds of steps
        r = c.post("/v1/translate", json=long)
        assert r.status_code == 503 and "no answer within 0.05 s (--timeout)" in r.json()["error"]
        # the search it started (a translation starts at once) stops at its next step: nothing in
        # flight (/health alone cannot tell: by step a worker is busy only during a step)
        assert idle_within(lambda: c.get("/metrics").text, 2) and c.get("/health").json()["status"] == "ok"


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_quantized_services_answer_as_the_quantized_translator_does(served, precision):
    from aiayn.models.quantize import is_quantized, quantize

    de_en_meta(served["de-en"])
    services = [load_service(name, path, quantization=precision) for name, path in served.items()]
    if precision == "int8":
        assert all(is_quantized(s.model) for s in services)
    else:
        assert all(next(s.model.parameters()).dtype == torch.bfloat16 for s in services)
    translator = Translator.from_dir(served["de-en"])
    quantize(translator.model, precision)
    expected = translator.translate(["Ein Mann", "Zwei Hunde"], SearchConfig(beam=2))
    with TestClient(create_app(services, Settings())) as c:
        r = c.post("/v1/translate", json={"q": ["Ein Mann", "Zwei Hunde"], "beam": 2})
        assert [x["translation"] for x in r.json()["results"]] == expected
        assert c.post("/v1/classify", json={"q": ["a great film"], "model": "sentiment"}).status_code == 200


def test_packed_services_answer_as_the_plain_models_do(served):
    from aiayn.models.prepack import is_packed

    de_en_meta(served["de-en"])
    body = {"q": ["Ein Mann", "Zwei Hunde"], "beam": 2, "attention": True}
    answers = {}
    for gemm in ("blas", "onednn"):
        services = [load_service(name, path, gemm=gemm) for name, path in served.items()]
        assert all(is_packed(s.model) == (gemm == "onednn") for s in services)
        with TestClient(create_app(services, Settings())) as c:
            answers[gemm] = [
                c.post("/v1/translate", json=body).json()["results"],
                c.post("/v1/classify", json={"q": ["a great film"], "model": "sentiment"}).json(),
            ]
    (plain, plain_classes), (packed, packed_classes) = answers["blas"], answers["onednn"]
    assert [x["translation"] for x in packed] == [x["translation"] for x in plain]
    for ours, ref in zip(packed, plain):  # the attention explorer reads the packed model's maps
        assert {"encoder", "decoder_self", "cross"} <= set(ref["attention"])
        for kind, value in ref["attention"].items():
            if kind.endswith("_tokens"):
                assert ours["attention"][kind] == value
            elif value is not None:
                assert_close(
                    f"attention {kind}", torch.tensor(ours["attention"][kind]), torch.tensor(value), atol=2e-4
                )  # rounded to 4 places
    ours, ref = packed_classes["results"][0], plain_classes["results"][0]  # top_k labels of the one text
    assert [x["label"] for x in ours] == [x["label"] for x in ref]
    assert_close("classify", torch.tensor([x["probability"] for x in ours]),
                 torch.tensor([x["probability"] for x in ref]), atol=1e-4)  # fmt: skip


def test_an_ensemble_is_served_as_the_library_decodes_it(pair):
    from aiayn.models.quantize import quantize

    texts, search = ["Ein Mann", "Zwei Hunde", "Eine Frau liest"], SearchConfig(beam=2)
    expected = Translator.from_dirs(pair).translate(texts, search)
    for member in pair:  # differs from each member alone: both take part
        assert expected != Translator.from_dir(member).translate(texts, search)
    with TestClient(create_app([load_service("de-en", pair)], Settings())) as c:
        results = c.post("/v1/translate", json={"q": texts, "beam": 2, "attention": True}).json()["results"]
        assert [x["translation"] for x in results] == expected
        assert all(x["attention"] == {} for x in results)  # no single map to show: the page hides it
        r = c.post("/translate", json={"q": texts[0], "source": "de", "target": "en"})
        alone = Translator.from_dirs(pair).translate(texts[:1], SearchConfig(beam=4))[0]
        assert r.json()["translatedText"] == alone.strip()  # a sentence's translation, joined as one
    quantized = Translator.from_dirs(pair)
    quantize(quantized.model, "int8")
    with TestClient(create_app([load_service("de-en", pair, quantization="int8")], Settings())) as c:
        results = c.post("/v1/translate", json={"q": texts, "beam": 2}).json()["results"]
        assert [x["translation"] for x in results] == quantized.translate(texts, search)


def test_a_classifier_ensemble_is_served_as_the_library_reads_it(served, tmp_path):
    from aiayn.data import SentencePieceTokenizer
    from aiayn.decoding.classifier import TextClassifier, load_classifier

    other = SentencePieceTokenizer.train(TEXTS, 320, mask=True)  # members may differ in vocabulary
    pair = [served["sentiment"], encoder_dir(tmp_path / "seed2", other, 2, seed=2)]
    texts = ["a great film", "dull and slow", "the best acting"]
    expected = load_classifier(pair).probabilities(texts)
    for member in pair:  # differs from each member alone: both take part
        assert not torch.allclose(expected, TextClassifier.from_dir(member).probabilities(texts), atol=1e-4)
    with TestClient(create_app([load_service("sst2", pair)], Settings())) as c:
        health = c.get("/health").json()["models"]
        assert health == [{"name": "sst2", "kind": "encoder", "classify": True, "fill_mask": False}]
        results = c.post("/v1/classify", json={"q": texts, "top_k": 2}).json()["results"]
        for probs, ranked in zip(expected, results, strict=True):
            best = probs.sort(descending=True)
            assert [x["label"] for x in ranked] == [("negative", "positive")[i] for i in best.indices]
            assert_close("ensemble", torch.tensor([x["probability"] for x in ranked]), best.values, atol=1e-5)
        r = c.post("/v1/fill-mask", json={"q": "a great <mask> .", "model": "sst2"})
        assert r.status_code == 400, r.text
        assert "'sst2' is an ensemble of 2 classifiers, which fills no masks" in r.json()["error"]
    other_labels = encoder_dir(tmp_path / "bad-good", other, 2, labels=("bad", "good"))
    with pytest.raises(ConfigError, match=r"model 'sst2' \(.*bad-good\): ensemble member 2 has the labels"):
        load_service("sst2", [served["sentiment"], other_labels])


@pytest.mark.parametrize(
    "path, body, fragment",
    [
        ("/v1/generate", {"prompt": "Ein", "stream": "false"}, "stream='false' must be true or false"),
        ("/v1/generate", {"prompt": "Ein", "greedy": "false"}, "greedy='false' must be true or false"),
        ("/v1/translate", {"q": "Ein", "sample": "false"}, "sample='false' must be true or false"),
        ("/v1/translate", {"q": "Ein", "attention": 1}, "attention=1 must be true or false"),
        ("/v1/translate", {"q": "Ein", "beam": "3"}, "beam='3' must be an integer"),
        ("/v1/translate", {"q": "Ein", "beam": 3.0}, "beam=3.0 must be an integer"),
        ("/v1/translate", {"q": "Ein", "lenpen": "0.6"}, "lenpen='0.6' must be a number"),
        ("/v1/classify", {"q": "a", "top_k": "2", "model": "sentiment"}, "top_k='2' must be an integer"),
        ("/v1/classify", {"q": "a", "top_k": 0, "model": "sentiment"}, "top_k must be an integer in 1..100"),
        ("/translate", {"q": "Ein", "target": "en", "format": "pdf"}, "format='pdf' is not"),
    ],
)
def test_fields_are_strictly_typed(client, path, body, fragment):
    """A string is never read as a boolean or a number (``"false"`` would be true), in JSON."""
    r = client.post(path, json={**body, **KEY})
    assert r.status_code == 400 and fragment in r.json()["error"], r.text


def test_the_default_body_limit_holds_the_default_text_limits_however_they_are_escaped():
    """32 texts of 5,000 characters fit the default body: as Python's json.dumps escapes characters
    outside the BMP (12 bytes each) and as a form percent-encodes them (12 bytes each)."""
    from urllib.parse import urlencode

    s = Settings()
    texts = ["😀" * s.char_limit] * s.batch_limit
    body = {"q": texts, "source": "de", "target": "en", "api_key": "k" * 64}
    assert len(json.dumps(body)) <= s.max_body_bytes
    assert len(urlencode([("q", t) for t in texts] + [("target", "en")])) <= s.max_body_bytes


def test_a_form_sends_numbers_as_text_and_a_number_is_still_a_number(client):
    form = {"q": "Ein Mann", "source": "de", "target": "en", "alternatives": "1", **KEY}
    assert len(client.post("/translate", data=form).json()["alternatives"]) == 1
    r = client.post("/v1/translate", json={"q": "Ein Mann", "lenpen": 1, "beam": 2, **KEY})  # int for float
    assert r.status_code == 200


def test_translate_reads_a_text_sentence_by_sentence_as_libretranslate_does(tmp_path):
    """A paragraph was one input: a model trained on sentences translates its first and drops the
    rest. Each sentence is now translated as the library translates it alone, lines kept."""
    model = translation_dir(tmp_path / "m", seed=5)  # a random model whose sentences differ
    de_en_meta(model)
    text = "Ein Mann fährt. Zwei Hunde spielen!\nEine Frau liest."
    sentences = ["Ein Mann fährt.", "Zwei Hunde spielen!", "Eine Frau liest."]
    t = Translator.from_dir(model)
    hyps = [
        [t.detokenize(h).strip() for h in hs]
        for hs in t.search(t.encode(sentences)[0], SearchConfig(nbest=2))
    ]
    assert all(len(hs) == 2 and all(hs) for hs in hyps) and len({hs[0] for hs in hyps}) == 3
    with TestClient(create_app([load_service("de-en", model)], Settings(sentence_limit=3))) as c:
        body = {"q": [text, ""], "source": "de", "target": "en", "alternatives": 1}
        r = c.post("/translate", json=body)
        assert r.status_code == 200, r.text
        for i, got in enumerate((r.json()["translatedText"][0], r.json()["alternatives"][0][0])):
            assert got == f"{hyps[0][i]} {hyps[1][i]}\n{hyps[2][i]}"
        assert r.json()["translatedText"][1] == ""  # nothing to translate: no model output
        r = c.post("/translate", json={**body, "q": [text, "Noch einer."]})
        assert r.status_code == 400 and "(4 sentences) exceeds sentence limit (3)" in r.json()["error"]


def test_native_translate_sentence_by_sentence_gives_each_sentences_result_and_joins_them(tmp_path):
    """``sentences: true`` (what the page sends): each sentence's result is the one it gets alone,
    attention included; the text's translation and n-best join theirs rank by rank, as /translate's
    alternatives do, scores summed, tokens one sentence after another; the sentence limit holds."""
    model = translation_dir(tmp_path / "m", seed=5)
    de_en_meta(model)
    text, sentences = "Ein Mann fährt. Zwei Hunde spielen!\nEine Frau liest.", [
        "Ein Mann fährt.", "Zwei Hunde spielen!", "Eine Frau liest."]  # fmt: skip
    with TestClient(create_app([load_service("de-en", model)], Settings(sentence_limit=3))) as c:
        options = {"beam": 4, "nbest": 2, "attention": True}  # /translate's search for one alternative
        alone = c.post("/v1/translate", json={"q": sentences, **options}).json()["results"]
        r = c.post("/v1/translate", json={"q": [text, ""], "sentences": True, **options})
        assert r.status_code == 200, r.text
        got, blank = r.json()["results"]
        assert got["sentences"] == alone and "attention" not in got
        lt = c.post("/translate", json={"q": text, "source": "de", "target": "en", "alternatives": 1}).json()
        assert (
            got["translation"] == lt["translatedText"] == f"{alone[0]['translation'].strip()} "
            f"{alone[1]['translation'].strip()}\n{alone[2]['translation'].strip()}"
        )
        assert [h["text"] for h in got["hypotheses"]] == [lt["translatedText"], *lt["alternatives"]]
        second = [a["hypotheses"][1] for a in alone]
        assert got["hypotheses"][1]["score"] == pytest.approx(sum(h["score"] for h in second), abs=2e-4)
        assert got["hypotheses"][1]["tokens"] == [t for h in second for t in h["tokens"]]
        assert blank == {"translation": "", "hypotheses": [], "sentences": [], "truncated": False}
        r = c.post("/v1/translate", json={"q": [text, "Noch einer."], "sentences": True})
        assert r.status_code == 400 and "(4 sentences) exceeds sentence limit (3)" in r.json()["error"]


def test_a_form_of_too_many_fields_is_refused_before_they_are_parsed(client):
    """A 2-MiB form of ``q=&`` repeated ~700,000 times was parsed whole on the event loop (every other
    request waiting) before its texts were counted: now 400 once past the texts and options a request
    may hold (here batch_limit 4 + 32)."""
    body = "&".join(["q="] * 100 + ["target=en", "api_key=secret"])
    r = client.post("/translate", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400 and "the form has more than 36 fields" in r.json()["error"]
    r = client.post("/translate?" + "&".join(["x=1"] * 40), data={"q": "Ein Mann", "target": "en", **KEY})
    assert r.status_code == 400 and "the query string has more than 36 fields" in r.json()["error"]
    r = client.post("/translate", files=[("q", (None, "a"))] * 40 + [("target", (None, "en"))])
    assert r.status_code == 400 and "the form has more than 36 fields" in r.json()["error"]
    fields = [("q", (None, "Ein Mann"))] * 4 + [("target", (None, "en")), ("api_key", (None, "secret"))]
    assert client.post("/translate", files=fields).status_code == 200


def test_libretranslate_and_native_requests_of_the_same_options_are_one_kind_of_job(client, monkeypatch):
    """/v1/translate without attention carried the attention limit in its job kind, so it never shared
    a batch or a running search with /translate's requests of the very same search."""
    server, kinds = client.app.state.server, []
    submit = server.submit

    async def recorded(kind, *args):
        kinds.append(kind)
        return await submit(kind, *args)

    monkeypatch.setattr(server, "submit", recorded)
    assert (
        client.post("/translate", json={"q": "Ein Mann", "source": "de", "target": "en", **KEY}).status_code
        == 200
    )
    assert client.post("/v1/translate", json={"q": "Ein Mann", "model": "de-en", **KEY}).status_code == 200
    assert len(kinds) == 2 and kinds[0] == kinds[1]


def test_libretranslate_clients_as_libretranslate_reads_them(client):
    """A JSON body after a byte order mark (Windows PowerShell 5's), the fields in the query string
    of a POST (Flask's request.values: the query first) and a negative ``alternatives`` (read as 0)
    were each a 400 here."""
    body = json.dumps({"q": "Ein Mann", "source": "de", "target": "en", **KEY}).encode()
    r = client.post(
        "/translate", content=b"\xef\xbb\xbf" + body, headers={"content-type": "application/json"}
    )
    assert r.status_code == 200 and "translatedText" in r.json(), r.text
    r = client.post("/translate", params={"q": "Ein Mann", "source": "de", "target": "en", **KEY})
    assert r.status_code == 200 and "translatedText" in r.json(), r.text
    r = client.post("/translate", params={"target": "en"}, data={"q": "Ein Mann", "target": "xx", **KEY})
    assert r.status_code == 200, r.text  # the query's target wins
    r = client.post(
        "/translate", json={"q": "Ein Mann", "source": "de", "target": "en", "alternatives": -3, **KEY}
    )
    assert r.status_code == 200 and "alternatives" not in r.json(), r.text
    r = client.post("/v1/translate", params={"beam": "2"}, json={"q": "Ein Mann", **KEY})
    assert r.status_code == 200  # beside JSON the query is not read (a string "2" would be refused)
    r = client.post("/translate", params={"q": "a" * 4100}, data={"target": "en", **KEY})
    assert r.status_code == 413  # the body's limit (4096 bytes here) holds for the query too


def test_cors_origins_let_those_sites_pages_read_the_answers_and_no_other(served):
    """LibreTranslate answers every origin (Access-Control-Allow-Origin: *): a browser client on
    another site could not use this server at all (a preflight was 405, no answer readable)."""
    body = {"q": "Ein Mann", "source": "de", "target": "en"}
    preflight = {"access-control-request-method": "POST", "access-control-request-headers": "content-type"}
    de_en_meta(served["de-en"])
    services = [load_service("de-en", served["de-en"])]
    site, other = "https://app.example", "https://evil.example"
    loopback = Settings(allowed_hosts=frozenset({"testserver"}), cors_origins=frozenset({site}))
    with TestClient(create_app(services, loopback)) as c:
        r = c.options("/translate", headers={"origin": site, **preflight})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == site
        r = c.post("/translate", json=body, headers={"origin": site})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == site
        r = c.post("/translate", json=body, headers={"origin": other})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers  # as without CORS
    with TestClient(create_app(services, Settings(cors_origins=frozenset({"*"})))) as c:
        r = c.post("/translate", json=body, headers={"origin": other})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    with TestClient(create_app(services, Settings())) as c:  # the default: the browser's own rule
        assert c.options("/translate", headers={"origin": site, **preflight}).status_code == 405
        assert (
            "access-control-allow-origin"
            not in c.post("/translate", json=body, headers={"origin": site}).headers
        )


@pytest.mark.parametrize(
    "given", ["example.org", "https://example.org/path", "ftp://x.org", "http://[zz", ""]
)
def test_a_cors_origin_that_is_not_one_is_refused(given):
    from aiayn.cli.serve import cors_origins

    with pytest.raises(ConfigError, match="--cors-origins"):
        Settings(cors_origins=cors_origins(given))


def test_docs_describe_every_body_and_answer(client):
    """Each body is read by a dependency (to stop at the size limit), yet /docs shows its fields."""
    spec = client.get("/openapi.json").json()
    posts = {path: ops["post"] for path, ops in spec["paths"].items() if "post" in ops}
    native = {"/v1/translate", "/v1/generate", "/v1/classify", "/v1/fill-mask"}
    assert set(posts) == {"/translate", "/detect"} | native
    for path, op in posts.items():
        content = op["requestBody"]["content"]
        fields = content["application/json"]["schema"]["properties"]
        assert "api_key" in fields and all(f.get("description") for f in fields.values()), path
        answer = op["responses"]["200"]["content"]["application/json"]["schema"]
        answer = answer.get("items", answer)["$ref"]  # /detect answers a list
        assert spec["components"]["schemas"][answer.rsplit("/", 1)[1]]["properties"], path
        for status in (400, 403, 413, 429, 503):
            assert op["responses"][str(status)]["content"]["application/json"]["schema"], (path, status)
    forms = {"application/x-www-form-urlencoded", "multipart/form-data"}
    assert forms <= set(posts["/translate"]["requestBody"]["content"])
    assert {"q", "target", "alternatives"} <= set(
        posts["/translate"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )
    assert {"beam", "mbr", "attention"} <= set(
        posts["/v1/translate"]["requestBody"]["content"]["application/json"]["schema"]["properties"]
    )


def blocking_kind():
    """A job kind whose batch runs until its class's ``release`` event is set (at most 10 s), and a
    function that submits one such job to a server's batcher from a thread of its own."""
    import asyncio
    import threading
    from dataclasses import dataclass
    from typing import ClassVar

    from aiayn.serve.jobs import JobKind

    @dataclass(frozen=True)
    class Blocking(JobKind):
        release: ClassVar[threading.Event] = threading.Event()

        def run(self, service, payloads):
            self.release.wait(10)
            return payloads

    def submit(app) -> threading.Thread:
        job = threading.Thread(
            target=lambda: asyncio.run(app.state.server.batcher.submit(Blocking("de-en"), 1))
        )
        job.start()
        return job

    return Blocking, submit


def test_health_says_stuck_while_every_worker_is_on_one_batch_past_the_timeout(served):
    """Before, /health said "ok" while the only worker decoded one request for minutes."""
    Blocking, submit = blocking_kind()
    de_en_meta(served["de-en"])
    app = create_app([load_service("de-en", served["de-en"])], Settings(timeout_s=0.3))
    with TestClient(app) as c:
        assert c.get("/health").json()["status"] == "ok"
        job = submit(app)
        time.sleep(0.6)
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "stuck" and r.json()["busy_s"][0] > 0.3
        Blocking.release.set()
        job.join(5)
        r = c.get("/health")
        assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["busy_s"] == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the exit, on purpose
def test_health_says_stuck_once_no_worker_thread_is_left(served):
    """A worker thread ended by something that is not an ``Exception`` (which a round survives) leaves
    no one to answer: /health says so instead of "ok"."""
    de_en_meta(served["de-en"])
    app = create_app([load_service("de-en", served["de-en"])], Settings())
    with TestClient(app) as c:
        assert c.get("/health").json()["status"] == "ok"
        batcher = app.state.server.batcher

        def leave(*_):
            raise SystemExit  # ends the worker thread, as a stray exit would

        batcher.on_batch = leave
        assert c.post("/translate", json={"q": "Hallo", "source": "de", "target": "en"}).status_code >= 500
        for thread in batcher.threads:
            thread.join(5)
        r = c.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "stuck"


def metric(text: str, name: str) -> float:
    """The value of the sample ``name`` (with its labels, if any) in a /metrics page."""
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_a_full_queue_answers_429_with_retry_after_and_the_gauges_say_so(served, monkeypatch):
    """With the worker on one job and ``queue_size`` jobs waiting, a request is answered 429 at once
    (LibreTranslate's "Slowdown"), the queue-depth gauge reads the waiting jobs, and once the worker
    is free the same request is served and every job's wait was observed. The texts-in-flight gauge
    is counted before the answers go (it was after: a slow worker thread showed a finished text)."""
    settle = Batcher._settle_all

    def settle_slowly(self, *args):
        settle(self, *args)
        time.sleep(0.3)  # the answer is out; the worker thread is slow to go on

    monkeypatch.setattr(Batcher, "_settle_all", settle_slowly)
    Blocking, submit = blocking_kind()
    de_en_meta(served["de-en"])
    app = create_app([load_service("de-en", served["de-en"])], Settings(queue_size=1, batch_window_ms=0))
    with TestClient(app) as c:
        jobs = [submit(app)]
        time.sleep(0.3)  # the worker runs the first job
        jobs.append(submit(app))  # the second waits: the queue is full
        time.sleep(0.3)
        metrics = c.get("/metrics").text
        assert (
            metric(metrics, "aiayn_queue_depth") == 1.0 and metric(metrics, "aiayn_wait_seconds_count") == 1.0
        )
        r = c.post("/translate", json={"q": "Ein Mann", "source": "de", "target": "en"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1" and "Slowdown" in r.json()["error"]
        Blocking.release.set()
        for job in jobs:
            job.join(5)
        r = c.post("/translate", json={"q": "Ein Mann", "source": "de", "target": "en"})
        assert r.status_code == 200
        metrics = c.get("/metrics").text
        assert metric(metrics, "aiayn_queue_depth") == 0.0 and metric(metrics, "aiayn_texts_in_flight") == 0.0
        assert metric(metrics, "aiayn_wait_seconds_count") == 3.0
        assert 'aiayn_requests_total{route="/translate",status="429"} 1.0' in metrics


def test_a_streamed_generation_is_refused_429_before_its_stream_begins(served):
    """With the queue full, ``stream: true`` is answered 429 in JSON like every route (before, the
    stream began with 200 and the refusal came as an event), and once the worker is free it streams."""
    Blocking, submit = blocking_kind()
    de_en_meta(served["de-en"])
    services = [load_service(name, served[name]) for name in ("de-en", "lm")]
    app = create_app(services, Settings(queue_size=1, batch_window_ms=0))
    body = {"prompt": "Ein", "max_new_tokens": 3, "stream": True, "greedy": True, "model": "lm"}
    with TestClient(app) as c:
        jobs = [submit(app)]
        time.sleep(0.3)  # the worker runs the first job
        jobs.append(submit(app))  # the second waits: the queue is full
        time.sleep(0.3)
        r = c.post("/v1/generate", json=body)
        assert r.status_code == 429 and r.headers["retry-after"] == "1" and "Slowdown" in r.json()["error"]
        Blocking.release.set()
        for job in jobs:
            job.join(5)
        with c.stream("POST", "/v1/generate", json=body) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
        assert s.status_code == 200 and events[-1]["done"]


def test_a_stream_that_ends_early_cancels_its_job_and_stops_the_sampling():
    """The client leaves (the server closes the event generator): the queued job is cancelled, so
    the worker skips it, and ``emit`` tells a running sampler to stop."""
    import asyncio

    from aiayn.serve.routers.v1 import _Stream
    from aiayn.serve.schemas import GenerateRequest

    scope = {}

    async def scenario() -> tuple[bool, bool, list[str]]:
        loop = asyncio.get_running_loop()
        stream, job = _Stream(loop, scope), loop.create_future()
        prompt = stream.prompt(GenerateRequest(prompt="Ein"), SearchConfig(beam=1), (4,))
        events = stream.events(job)
        assert prompt.emit("a") is True  # the worker's first piece
        first = await events.__anext__()
        await events.aclose()  # what the server does when the client disconnects
        return job.cancelled(), prompt.emit("b"), [first]

    cancelled, go_on, seen = asyncio.run(scenario())
    assert cancelled and go_on is False and seen == ['data: {"text": "a"}\n\n']
    assert scope == {LEFT: True}  # logged 499: its answer was not read to the end


def test_a_model_error_after_the_stream_began_ends_it_with_an_error_event(caplog):
    import asyncio

    from aiayn.serve.routers.v1 import _Stream

    scope = {}

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        stream, job = _Stream(loop, scope), loop.create_future()
        job.set_exception(RuntimeError("the model failed"))
        return [event async for event in stream.events(job)]

    with caplog.at_level("ERROR", logger="aiayn.serve"):
        events = asyncio.run(scenario())
    assert events == ['data: {"error": "internal error: the server failed on this request"}\n\n']
    assert "the model failed" in caplog.text and scope == {}  # the stream ended: logged as begun, 200


def test_libretranslate_translates_under_a_beam_limit_below_its_own_beam(served):
    """/translate searches with beam 4 (LibreTranslate's); a server limited to 2 searches with 2."""
    de_en_meta(served["de-en"])
    with TestClient(create_app([load_service("de-en", served["de-en"])], Settings(max_beam=2))) as c:
        r = c.post("/translate", json={"q": "Ein Mann", "source": "de", "target": "en", "alternatives": 1})
        assert r.status_code == 200 and len(r.json()["alternatives"]) == 1, r.text


def test_max_len_bounds_the_default_length_too(tmp_path):
    """Before, a request that left max_len out decoded input + max_len_b tokens past --max-len."""
    service = load_service("de-en", translation_dir(tmp_path / "m", eos_bias=-20.0))  # writes on to its limit
    body = {"q": ["Ein Mann " * 6], "max_len_b": 3}
    for cap in (1024, 3):
        with TestClient(create_app([service], Settings(max_len=cap))) as c:
            for given in ({}, {"sample": True, "nbest": 2, "seed": 1}):  # a search, and sampling
                r = c.post("/v1/translate", json={**body, **given})
                lengths = [len(h["tokens"]) for h in r.json()["results"][0]["hypotheses"]]
                assert r.status_code == 200 and lengths, r.text
                assert max(lengths) <= 3 if cap == 3 else max(lengths) > 3, lengths


def test_a_batch_run_again_job_by_job_counts_the_tokens_of_every_job(served):
    """A batch that fails is run again a job at a time; each run's output tokens are counted, not
    only the last one's."""
    from aiayn.serve.server import Server

    class Kind:  # a job kind whose results are its payloads and whose output tokens are their sum
        model, run, output_tokens = "de-en", staticmethod(lambda service, payloads: payloads), sum

    server = Server([load_service("de-en", served["de-en"])], Settings())
    try:
        server._run(Kind, [3]), server._run(Kind, [4])  # the two jobs of a failed batch, alone
        server._on_batch(2, 2, 0.1, None)
        from prometheus_client import generate_latest

        assert "aiayn_output_tokens_total 7.0" in generate_latest(server.metrics.registry).decode()
    finally:
        server.batcher.close()


def test_a_path_cannot_forge_a_log_line(client, caplog):
    with caplog.at_level("INFO", logger="aiayn.serve"):
        assert client.get("/%0aFORGED%20200%20line%00").status_code == 404
    (line,) = [r.getMessage() for r in caplog.records if "FORGED" in r.getMessage()]
    assert line.startswith("GET /\\nFORGED 200 line\\x00 404 ") and line.isprintable()


def test_a_head_request_is_logged_as_head(client, caplog):
    """HEAD is answered as its GET without the body, and was logged as a GET."""
    with caplog.at_level("INFO", logger="aiayn.serve"):
        assert client.head("/health").status_code == 200
    assert any(r.getMessage().startswith("HEAD /health 200 ") for r in caplog.records)


def test_a_bug_is_answered_500_as_json_logged_and_counted(served, caplog):
    """A route that fails with an exception no handler knows (a bug, here planted in the tokenizing
    step) is answered 500 in the JSON shape of every error, logged with its traceback, counted in
    /metrics, and the next request is served."""
    service = load_service("de-en", served["de-en"])
    with TestClient(create_app([service])) as c:
        planted = service.encode
        service.encode = lambda *a, **k: 1 / 0
        with caplog.at_level("INFO", logger="aiayn.serve"):
            r = c.post("/v1/translate", json={"q": "Ein Mann"})
        assert r.status_code == 500
        assert r.json() == {"error": "internal error: the server failed on this request"}
        assert "ZeroDivisionError" in caplog.text and "POST /v1/translate 500" in caplog.text
        service.encode = planted
        assert c.post("/v1/translate", json={"q": "Ein Mann"}).status_code == 200
        metrics = c.get("/metrics").text
        assert 'aiayn_requests_total{route="/v1/translate",status="500"} 1.0' in metrics
        assert 'aiayn_requests_total{route="/v1/translate",status="200"} 1.0' in metrics


def test_a_bidirectional_model_answers_with_its_right_to_left_translation(tmp_path):
    """/v1/translate on a bidirectional model adds each text's right-to-left translation (what the
    library's ``detokenize_r2l`` gives); a plain model's answer has no such field."""
    from tests.decoding.fixtures import translation_dir

    bidir = translation_dir(tmp_path / "bidir", eos_bias=1.5, seed=1, bidirectional=True)
    plain = translation_dir(tmp_path / "plain", eos_bias=2.0)
    texts = ["Zwei Hunde spielen im Schnee", "Ein Mann"]
    t = Translator.from_dir(bidir)
    expected = [t.detokenize_r2l(h[0]) for h in t.search(t.encode(texts)[0], SearchConfig(beam=2))]
    assert all(expected)
    with TestClient(create_app([load_service("bidir", bidir), load_service("plain", plain)])) as c:
        r = c.post("/v1/translate", json={"q": texts, "beam": 2, "model": "bidir"})
        assert r.status_code == 200 and [x["r2l"] for x in r.json()["results"]] == expected
        r = c.post("/v1/translate", json={"q": texts, "beam": 2, "model": "plain"})
        assert r.status_code == 200 and all("r2l" not in x for x in r.json()["results"])


def test_a_bidirectional_models_attention_is_what_its_decoders_read(tmp_path):
    """With attention, a bidirectional model's answer adds the right-to-left decoder's maps over
    ``[bos] + its translation`` (the memory the search read) and the fourth sublayer's: the model's
    own ``attention_weights`` for that input, rounded; a limit that counts those maps too answers 413."""
    import torch

    from tests.decoding.fixtures import translation_dir

    bidir = translation_dir(tmp_path / "bidir", eos_bias=1.5, seed=1, bidirectional=True)
    t, text = Translator.from_dir(bidir), "Zwei Hunde spielen im Schnee"
    src = t.encode([text])[0][0]
    hyp = t.search([src], SearchConfig(beam=2))[0][0]
    c = t.model.config
    r2l_in = [c.bos_id, *(i for i in hyp.r2l.tokens if i != c.eos_id)]
    tgt_in = [c.bos_id, *(i for i in hyp.tokens if i != c.eos_id)]
    with torch.inference_mode():
        maps = t.model.attention_weights(torch.tensor([src + [c.eos_id]]), torch.tensor([tgt_in]),
                                         torch.tensor([r2l_in]))  # fmt: skip
    assert set(maps) == {"encoder", "decoder_self", "cross", "r2l_self", "r2l_cross", "cross_r2l"}
    body = {"q": [text], "beam": 2, "attention": True}
    with TestClient(create_app([load_service("bidir", bidir)])) as client:
        att = client.post("/v1/translate", json=body).json()["results"][0]["attention"]
    assert len(att["r2l_tokens"]) == len(r2l_in) and att["r2l_tokens"][0] == "<s>"
    n_s, n_t, n_r = len(src) + 1, len(tgt_in), len(r2l_in)
    shapes = {"encoder": (n_s, n_s), "decoder_self": (n_t, n_t), "cross": (n_t, n_s), "r2l_self": (n_r, n_r),
              "r2l_cross": (n_r, n_s), "cross_r2l": (n_t, n_r)}  # fmt: skip
    for kind, layers in maps.items():
        expected = torch.stack(layers)[:, 0]  # (L, h, queries, keys)
        assert expected.shape[-2:] == shapes[kind]
        assert torch.allclose(torch.tensor(att[kind]), expected, atol=1e-4)
    n = sum(
        len(v) * len(v[0]) * len(v[0][0]) * len(v[0][0][0])
        for k, v in att.items()
        if not k.endswith("tokens")
    )
    settings = Settings(max_attention_values=n - 1)
    with TestClient(create_app([load_service("bidir", bidir)], settings)) as client:
        r = client.post("/v1/translate", json=body)
        assert r.status_code == 413 and "max-attention-values" in r.json()["error"]
        assert client.post("/v1/translate", json={**body, "attention": False}).status_code == 200
    with TestClient(create_app([load_service("bidir", bidir)], Settings(max_attention_values=n))) as client:
        assert client.post("/v1/translate", json=body).status_code == 200


def test_attention_over_the_limit_whatever_the_translation_is_refused_before_any_search(tmp_path):
    """Whether an answer's attention fits is known from its source alone when even a one-token
    translation would not fit: 413 at once, the search never run (before: searched, then refused)."""
    service = load_service("m", translation_dir(tmp_path / "m", eos_bias=1.5, seed=1))
    c, text = service.model.config, "Zwei Hunde spielen im Schnee"
    n_src = len(service.translator.encode([text])[0][0]) + 1
    floor = c.n_heads * (c.n_encoder_layers * n_src**2 + c.n_decoder_layers * (1 + n_src))
    searched, t = [], service.translator

    def counted(f):
        return lambda *a, **k: searched.append(1) or f(*a, **k)

    for name in ("search", "batch"):  # a whole search, or the rows a running search adds
        setattr(t, name, counted(getattr(t, name)))
    with TestClient(create_app([service], Settings(max_attention_values=floor - 1))) as client:
        r = client.post("/v1/translate", json={"q": [text], "attention": True})
        assert r.status_code == 413 and "max-attention-values" in r.json()["error"] and not searched
        assert r.json()["error"].startswith("the attention weights")  # as the refusal after a search reads
        assert client.post("/v1/translate", json={"q": [text]}).status_code == 200 and len(searched) == 1
    with TestClient(create_app([service], Settings(max_attention_values=floor))) as client:
        r = client.post("/v1/translate", json={"q": [text], "attention": True, "max_len": 1})
        assert r.status_code in (200, 413) and len(searched) == 2  # searched: the floor fits


def test_a_text_longer_than_the_model_reads_is_translated_in_part_and_says_so(tmp_path):
    """The CLI warns when it cuts a line to the source tokens the model reads; the server cut it
    silently, and the page showed the first part's translation as the whole text's."""
    from tests.decoding.fixtures import translation_dir

    learned = translation_dir(tmp_path / "short", eos_bias=2.0, positional="learned", max_len=12)
    de_en_meta(learned)
    with TestClient(create_app([load_service("short", learned)])) as client:
        results = client.post("/v1/translate", json={"q": ["Ein Mann fährt Fahrrad.", "Zwei"]}).json()[
            "results"
        ]
        libre = client.post(
            "/translate", json={"q": "Ein Mann fährt Fahrrad.", "source": "de", "target": "en"}
        )
    assert [r["truncated"] for r in results] == [True, False]
    with pytest.warns(UserWarning, match="line 1 truncated to 12 source tokens"):  # the CLI's warning
        cli = Translator.from_dir(learned)
        expected = cli.translate(["Ein Mann fährt Fahrrad."], SearchConfig(beam=4))[0]
    assert results[0]["translation"] == expected == libre.json()["translatedText"]  # what the CLI writes


def test_attention_of_a_translation_stopped_at_its_length_limit_is_of_what_the_decoder_read(tmp_path):
    """A hypothesis without eos (stopped at max_len) was read as [bos] + every token: one position
    past a learned table of max_len rows, answered 400; the decoder read [bos] + all but the last."""
    from tests.decoding.fixtures import translation_dir

    looping = translation_dir(tmp_path / "loop", eos_bias=-30.0, positional="learned", max_len=12)
    with TestClient(create_app([load_service("loop", looping)])) as client:
        r = client.post("/v1/translate", json={"q": ["Zwei Hunde"], "beam": 2, "attention": True})
    assert r.status_code == 200, r.text
    result = r.json()["results"][0]
    tokens, att = result["hypotheses"][0]["tokens"], result["attention"]
    assert len(tokens) == 12 and att["tgt_tokens"][0] == "<s>" and len(att["tgt_tokens"]) == 12
    assert len(att["decoder_self"][0][0]) == 12  # rows: the 12 positions read


def test_a_marian_style_bos_that_is_also_padding_is_labelled_bos():
    from types import SimpleNamespace

    from aiayn.decoding.maps import decoder_read, token_labels
    from tests.decoding.fixtures import char_tokenizer

    config = SimpleNamespace(pad_id=5, bos_id=5, eos_id=0)  # OPUS-MT: the decoder starts with <pad>'s id
    assert token_labels(char_tokenizer(), [5, 0], config) == ["<s>", "</s>"]  # was "<pad>" on the page
    assert decoder_read([7, 8, 0], 5) == decoder_read([7, 8, 9], 5) == [5, 7, 8]


def test_a_seeded_sample_is_the_same_alone_and_batched_with_another_request(tmp_path):
    """Requests with the same options are decoded together: a shared stream of draws made one request's
    samples depend on the other's texts, so its seed did not fix them."""
    from tests.decoding.fixtures import translation_dir

    service = load_service("m", translation_dir(tmp_path / "m"))
    (a, b), _ = service.encode(["Ein Mann", "Zwei Hunde spielen im Park"])
    config = SearchConfig(sample=True, beam=1, seed=7, min_len=8, max_len=8)
    alone = service.run(config, [[a]], attention=False)[0]
    after_another = service.run(config, [[b], [a, a]], attention=False)[1]
    tokens = lambda answer: answer["hypotheses"][0]["tokens"]  # noqa: E731
    assert tokens(after_another[0]) == tokens(alone[0]) != tokens(after_another[1])  # a repeat: new samples


def test_map_labels_show_where_words_start_and_name_bytes_and_specials():
    """A word's pieces read as one word (the piece that starts it shows its space), a byte of part of a
    character is its piece, not the U+FFFD it decodes to, and unk and mask are named, not numbered."""
    from types import SimpleNamespace

    from aiayn.data import SentencePieceTokenizer
    from aiayn.decoding.maps import token_labels

    tok = SentencePieceTokenizer.train(TEXTS, 300, mask=True)
    config = SimpleNamespace(pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id, unk_id=tok.unk_id)
    ids = tok.encode("the movie 中")
    pieces = [tok.sp.id_to_piece(i) for i in ids]
    labels = token_labels(tok, ids, config)
    assert labels == [p if p.startswith("<0x") else p.replace("\u2581", "␣") for p in pieces]
    assert "<0xE4>" in labels and not any("\ufffd" in label for label in labels), pieces
    assert len([x for x in labels if x.startswith("␣")]) == 3  # three words, whatever their pieces
    assert token_labels(tok, [tok.unk_id, tok.mask_id], config) == ["<unk>", "<mask>"]


def test_sentencepieces_lone_word_boundary_is_labelled_a_space():
    """ "▁" alone (before a word split another way) decodes to nothing: it was labelled by its id."""
    from types import SimpleNamespace

    from aiayn.data import SentencePieceTokenizer
    from aiayn.decoding.maps import token_labels

    tok = SentencePieceTokenizer.train(TEXTS, 300)
    boundary = tok.sp.piece_to_id("\u2581")
    assert boundary != tok.sp.unk_id() and tok.decode([boundary]) == ""
    config = SimpleNamespace(pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    word = tok.encode("movie")[-1]
    assert token_labels(tok, [boundary, word], config) == ["␣", tok.decode([word])]
