"""The page in a real headless browser (Debian's chromium driven by Playwright): translate as the
CLI does, explore the attention (hover highlights, both views), export PNG and SVG, stream from the
language model; no request leaves 127.0.0.1. Skipped, with the reason, where no browser is installed;
CI sets AIAYN_REQUIRE_BROWSER=1 so that it fails instead."""

import json
import os
import shutil
from pathlib import Path

import pytest

from aiayn.cli.main import main
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.translator import Translator
from tests.decoding.fixtures import translation_dir
from tests.serve.conftest import post, start_serve, stop

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _browser():
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "the playwright package is not installed (pip install playwright)"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if reason is None and chromium is None:
        reason = "no chromium on PATH (apt-get install chromium)"
    if reason is not None:
        if os.environ.get("AIAYN_REQUIRE_BROWSER"):
            pytest.fail(f"AIAYN_REQUIRE_BROWSER is set but {reason}")
        pytest.skip(reason)
    return sync_playwright, chromium


@pytest.fixture(scope="module")
def browser():
    sync_playwright, chromium = _browser()
    with sync_playwright() as p:  # one per thread: every page of this module opens in this browser
        launched = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def page(server, browser):
    tab = browser.new_page(viewport={"width": 1000, "height": 900}, accept_downloads=True)
    tab.requests = []
    tab.on("request", lambda r: tab.requests.append(r.url))
    tab.goto(server[0])
    tab.wait_for_selector("#translator:not([hidden])")
    yield tab
    tab.close()


def test_translate_like_the_cli_and_explore_attention(page, server, served, capsys, tmp_path):
    (tmp_path / "in.txt").write_text("Ein Mann fährt.\n", encoding="utf-8")
    assert (
        main(
            ["translate", "--model", str(served["de-en"]), "--input", str(tmp_path / "in.txt"), "--beam", "3"]
        )
        == 0
    )
    expected = capsys.readouterr().out.rstrip("\n")
    page.fill("#t-src", "Ein Mann fährt.")
    page.fill("#t-beam", "3")
    page.fill("#t-nbest", "2")
    page.click("#t-go")
    page.wait_for_selector("#explorer:not([hidden])")
    assert page.text_content("#t-out") == expected
    assert page.locator("#t-alts li").count() == 2
    assert page.is_hidden("#t-r2l")  # a plain model has no right-to-left pass, nor its maps
    assert _kinds(page) == ["encoder", "decoder_self", "cross"]
    # heat map of the encoder (the source has several tokens whatever this random model outputs):
    # hovering query token 1 outlines its row, and only its row
    page.select_option("#a-kind", "encoder")
    page.hover('#a-svg-view text[data-query="1"]')
    outlined = page.eval_on_selector_all(
        '#a-svg-view rect[stroke="#f0a500"]', "els => els.map(e => e.dataset.i)"
    )
    assert outlined and set(outlined) == {"1"}
    # lines (bertviz's head view), all heads overlaid: hovering a query hides every other query's lines
    page.select_option("#a-view", "lines")
    page.select_option("#a-head", "all")
    page.hover('#a-svg-view text[data-query="0"]')
    shown = page.eval_on_selector_all(
        "#a-svg-view line", "els => els.filter(e => e.style.display !== 'none').map(e => e.dataset.i)"
    )
    assert shown and set(shown) == {"0"}
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "serve-page.png"), full_page=True)
    for button, magic in (("#a-png", b"\x89PNG"), ("#a-svg", b"<svg")):
        with page.expect_download() as download:
            page.click(button)
        assert Path(download.value.path()).read_bytes().startswith(magic)


def test_keyboard_reaches_the_tokens(page):
    page.select_option("#a-view", "matrix")
    page.focus('#a-svg-view text[data-key="0"]')
    assert page.eval_on_selector_all('#a-svg-view rect[stroke="#f0a500"]', "els => els.length") > 0


def test_a_paragraph_is_translated_sentence_by_sentence_with_each_sentences_maps(page, server):
    """A text of several sentences and lines is translated as LibreTranslate's route translates it
    (one sentence at a time, put back line by line: the server's /translate answer), and the explorer
    offers each sentence's maps. Before, the page sent the paragraph whole: a model trained on
    sentences translated its first one or two."""
    text = "Ein Mann fährt. Zwei Hunde spielen im Schnee.\nEine Frau singt."
    status, answer = post(server[0] + "translate", {"q": text, "source": "de", "target": "en"})
    assert status == 200 and answer["translatedText"].count("\n") == 1
    page.fill("#t-src", text)
    page.fill("#t-beam", "4")
    page.fill("#t-nbest", "1")
    page.click("#t-go")
    page.wait_for_selector("#a-sentence-box:not([hidden])")
    assert page.text_content("#t-out") == answer["translatedText"]
    options = page.eval_on_selector_all("#a-sentence option", "els => els.length")
    assert options == 3
    page.select_option("#a-kind", "encoder")
    sources = []
    for i in range(3):
        page.select_option("#a-sentence", str(i))
        keys = page.eval_on_selector_all("#a-svg-view text[data-key]", "els => els.map(e => e.textContent)")
        sources.append(keys)
    assert len({tuple(k) for k in sources}) == 3  # three sentences, three sources
    page.fill("#t-src", "Ein Mann fährt.")
    page.click("#t-go")
    page.wait_for_function("document.getElementById('t-go').disabled === false")
    assert page.is_hidden("#a-sentence-box")  # one sentence: nothing to choose


def test_an_ensemble_translates_without_the_explorer(page, pair):
    search = SearchConfig(beam=3)
    expected = Translator.from_dirs(pair).translate(["Ein Mann fährt."], search)[0]
    assert all(expected != Translator.from_dir(d).translate(["Ein Mann fährt."], search)[0] for d in pair)
    page.select_option("#t-model", "pair")
    page.click("#t-go")
    page.wait_for_function("document.getElementById('t-go').disabled === false")
    assert page.text_content("#t-out") == expected.strip()  # its sentences' translations, put back stripped
    assert page.is_hidden("#explorer")  # an ensemble has no one attention map to show
    page.select_option("#t-model", "de-en")


def test_language_model_streams(page, server):
    """What the page shows, streamed piece by piece, is the server's whole answer to the same request.
    The page samples without a seed, so the test adds one (a sampled end-of-text first would otherwise
    leave nothing to see, now and then)."""
    sent = []

    def seeded(route):
        sent.append({**route.request.post_data_json, "seed": 3})
        route.continue_(post_data=json.dumps(sent[-1]))

    page.route("**/v1/generate", seeded)
    page.wait_for_selector("#playground:not([hidden])")
    page.fill("#g-prompt", "Ein")
    page.fill("#g-max", "12")
    page.click("#g-go")
    page.wait_for_function("document.getElementById('g-go').disabled === false")
    page.unroute("**/v1/generate")
    assert sent and sent[0]["stream"] is True and page.text_content("#error") == ""
    status, whole = post(server[0] + "v1/generate", {**sent[0], "stream": False})
    text = whole["text"]
    assert status == 200 and text and page.text_content("#g-out") == "Ein" + text


def test_no_request_leaves_the_server(page, server):
    assert page.requests and all(u.startswith(server[0]) or u.startswith("blob:") or u.startswith("data:")
                                 for u in page.requests)  # fmt: skip


def test_a_bidirectional_model_shows_the_right_to_left_translation_and_attention_it_read(browser, tmp_path):
    """Served alone (its own process and page), a bidirectional model's answer shows, under the
    translation, the right-to-left translation whose states it read (what the library gives), and
    the explorer its right-to-left maps."""
    bidir = translation_dir(tmp_path / "bidir", eos_bias=1.5, seed=1, bidirectional=True)
    t, src = Translator.from_dir(bidir), "Zwei Hunde spielen im Schnee"
    hyp = t.search(t.encode([src])[0], SearchConfig(beam=4))[0][0]
    assert t.detokenize_r2l(hyp)
    url, proc = start_serve(["--model", f"bidir={bidir}"], tmp_path / "serve.log")
    tab = browser.new_page()
    try:
        tab.goto(url)
        tab.wait_for_selector("#translator:not([hidden])")
        tab.fill("#t-src", src)
        tab.click("#t-go")
        tab.wait_for_selector("#t-r2l:not([hidden])")
        assert tab.text_content("#t-out") == t.detokenize(hyp)
        assert tab.text_content("#t-r2l-text") == t.detokenize_r2l(hyp)
        assert tab.text_content("#error") == ""
        # the explorer offers the right-to-left decoder's maps and the fourth sublayer's: decoder
        # queries (<s> + the translation) over the right-to-left decoder's states (<s> + its output)
        tab.wait_for_selector("#explorer:not([hidden])")
        assert _kinds(tab) == ["encoder", "decoder_self", "cross", "r2l_self", "r2l_cross", "cross_r2l"]
        tab.select_option("#a-kind", "cross_r2l")
        rows = tab.eval_on_selector_all("#a-svg-view text[data-query]", "els => els.length")
        cols = tab.eval_on_selector_all("#a-svg-view text[data-key]", "els => els.length")
        c = t.model.config
        assert (rows, cols) == (
            1 + sum(i != c.eos_id for i in hyp.tokens),
            1 + sum(i != c.eos_id for i in hyp.r2l.tokens),
        )
        assert tab.get_attribute("#a-svg-view", "aria-label").startswith("decoder → right-to-left states")
    finally:
        tab.close()
        stop(proc)


def test_keys_layers_per_kind_errors_and_an_encoder(browser, served, tmp_path):
    """Served with --api-keys: the page asks for the key; a 3+1-layer model's explorer lists each
    kind's own layers, and a key token shows the lines into it; a text whose maps are over the limit is
    translated without them; an error clears the last answer; encoders classify and fill masks."""
    deep = translation_dir(tmp_path / "deep", eos_bias=1.0, seed=1, n_encoder_layers=3, n_decoder_layers=1)
    (tmp_path / "keys.txt").write_text("secret\n", encoding="utf-8")
    models = ["--model", f"deep={deep}", "--model", f"sentiment={served['sentiment']}",
              "--model", f"mlm={served['mlm']}"]  # fmt: skip
    url, proc = start_serve([*models, "--api-keys", str(tmp_path / "keys.txt")], tmp_path / "serve.log")
    tab, errors = browser.new_page(), []
    tab.on("pageerror", lambda e: errors.append(str(e)))
    done = "document.getElementById('t-go').disabled === false"
    try:
        tab.goto(url)
        tab.wait_for_selector("#translator:not([hidden])")
        assert not tab.is_visible("#key-box")  # before: shown by label's display rule, hidden or not
        tab.click("#t-go")
        tab.wait_for_selector("#key-box:not([hidden])")
        assert tab.is_visible("#key-box")
        assert "enter the key above" in tab.text_content("#error") and tab.text_content("#t-out") == ""
        tab.fill("#api-key", "secret")
        tab.click("#t-go")
        tab.wait_for_selector("#explorer:not([hidden])")
        translation = tab.text_content("#t-out")
        assert tab.text_content("#error") == "" and translation
        disabled = tab.eval_on_selector_all(
            "#a-kind option", "els => els.filter(e => e.disabled).map(e => e.value)"
        )
        assert disabled == ["r2l_self", "r2l_cross", "cross_r2l"]  # not reachable by typing either
        layers = lambda: tab.eval_on_selector_all("#a-layer option", "els => els.length")  # noqa: E731
        tab.select_option("#a-kind", "encoder")
        assert layers() == 3
        tab.select_option("#a-layer", "2")
        tab.select_option("#a-kind", "cross")
        assert layers() == 1 and tab.input_value("#a-layer") == "0"
        tab.select_option("#a-view", "lines")
        tab.hover('#a-svg-view text[data-key="0"]')
        into = tab.eval_on_selector_all(
            "#a-svg-view line", "els => els.filter(e => e.style.display !== 'none').map(e => e.dataset.j)"
        )
        assert into and set(into) == {"0"}
        tab.set_viewport_size({"width": 400, "height": 800})  # a phone: no sideways scrolling
        assert tab.evaluate("document.documentElement.scrollWidth") <= 400
        tab.set_viewport_size({"width": 1000, "height": 900})

        def over_the_limit(route):  # the server's answer to maps over --max-attention-values
            if route.request.post_data_json["attention"]:
                route.fulfill(status=413, content_type="application/json", body='{"error": "over the limit"}')
            else:
                route.continue_()

        tab.route("**/v1/translate", over_the_limit)
        tab.click("#t-go")
        tab.wait_for_selector("#t-note:not([hidden])")
        assert tab.text_content("#t-out") == translation and tab.is_hidden("#explorer")
        assert "over the limit" in tab.text_content("#t-note")
        tab.unroute("**/v1/translate")
        tab.route("**/v1/translate", lambda r: r.fulfill(status=503, content_type="application/json",
                                                         body='{"error": "busy"}'))  # fmt: skip
        tab.click("#t-go")
        tab.wait_for_function(done)
        assert tab.text_content("#error") == "busy" and tab.text_content("#t-out") == ""
        assert tab.locator("#t-alts li").count() == 0 and tab.is_hidden("#explorer")
        tab.unroute("**/v1/translate")

        tab.select_option("#e-model", "sentiment")
        assert tab.is_enabled("#e-classify") and tab.is_disabled("#e-fill")
        tab.fill("#e-text", "a great film")
        tab.click("#e-classify")
        tab.wait_for_selector("#e-out li")
        status, answer = post(url + "v1/classify", {"q": "a great film", "model": "sentiment", "top_k": 3,
                                                    "api_key": "secret"})  # fmt: skip
        assert status == 200
        assert tab.eval_on_selector_all("#e-out li", "els => els.map(e => e.textContent)") == [
            f"{r['label']} {r['probability']:.3f}" for r in answer["results"]
        ]
        tab.select_option("#e-model", "mlm")
        assert tab.is_disabled("#e-classify") and tab.is_enabled("#e-fill")
        tab.fill("#e-text", "a great <mask> .")
        tab.click("#e-fill")
        tab.wait_for_selector("#e-out li")
        assert (
            tab.text_content("#e-out li").startswith("<mask> 1: ") and tab.locator("#e-out li").count() == 1
        )
        assert errors == [] and tab.text_content("#error") == ""
    finally:
        tab.close()
        stop(proc)


def _kinds(tab) -> list[str]:
    """The attention kinds the explorer offers (its visible options)."""
    return tab.eval_on_selector_all("#a-kind option", "els => els.filter(e => !e.hidden).map(e => e.value)")


def test_a_refused_health_check_shows_the_servers_error(browser, server):
    """A /health that is not 200 (a proxy's Host refused: 400 with the server's error) showed
    "Cannot read properties of undefined" instead of what the server said."""
    tab = browser.new_page()
    try:
        tab.route("**/health", lambda r: r.fulfill(status=400, content_type="application/json",
                                                   body='{"error": "Host refused"}'))  # fmt: skip
        tab.goto(server[0])
        tab.wait_for_function("document.getElementById('error').textContent !== ''")
        assert tab.text_content("#error") == "Host refused"
        tab.unroute("**/health")  # a 503 "stuck" still lists the models: the page works (as it did)
        stuck = json.dumps({"status": "stuck", "models": [{"name": "de-en", "kind": "translation"}]})
        tab.route("**/health", lambda r: r.fulfill(status=503, content_type="application/json", body=stuck))
        tab.goto(server[0])
        tab.wait_for_selector("#translator:not([hidden])")
        assert tab.text_content("#error") == ""
    finally:
        tab.close()


def test_the_forms_offer_what_the_server_answers(browser, served, tmp_path):
    """The number fields take the server's own limits (/health's ``limits``), not fixed ones, and
    any temperature or top-p in range, not only multiples of a step."""
    models = ["--model", str(served["de-en"]), "--model", str(served["lm"])]
    url, proc = start_serve([*models, "--max-new-tokens", "1000", "--max-beam", "6"], tmp_path / "serve.log")
    tab = browser.new_page()
    try:
        tab.goto(url)
        tab.wait_for_selector("#playground:not([hidden])")

        def valid(selector: str, value: str) -> bool:
            tab.fill(selector, value)
            return tab.eval_on_selector(selector, "e => e.checkValidity()")

        assert valid("#g-max", "1000") and not valid("#g-max", "1001")
        assert valid("#t-beam", "6") and not valid("#t-beam", "7") and not valid("#t-nbest", "7")
        assert valid("#g-topp", "0.92") and valid("#g-temp", "0.33")
        assert not valid("#g-topp", "0")  # the server refuses 0
        tab.fill("#g-topp", "1")
        tab.fill("#g-max", "5")
        tab.fill("#g-prompt", "a \u2713")  # a character the model lacks: 400 before any text
        tab.click("#g-go")
        tab.wait_for_function("document.getElementById('error').textContent !== ''")
        assert "vocabulary lacks" in tab.text_content("#error") and tab.text_content("#g-out") == ""
    finally:
        tab.close()
        stop(proc)
