// aiayn's page: a translator, an attention explorer for the translation just made, a language-model
// playground and an encoder's classifier and mask filler. Plain JavaScript, no library, no request
// beyond this server.
"use strict";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2457c5", "#d1495b", "#00798c", "#edae49", "#66a182", "#8e5ea2", "#30638e", "#e07a5f"];
const MAX_PNG_SIDE = 16384; // pixels; a larger canvas fails (or stalls the tab) in browsers
let attention = null, sentences = [], models = [];

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

function number(id, fallback) { // an emptied field is its default, not 0
  const text = $(id).value.trim();
  return text === "" ? fallback : Number(text);
}

function shown(token) { // a label a reader can see: spaces and line breaks drawn, an empty token named
  return token.trim() !== "" ? token : token.replace(/ /g, "\u2423").replace(/\n/g, "\u21b5") || "\u2205";
}

function fill(select, items) {
  select.replaceChildren(...items.map(([value, text]) => new Option(text, value)));
}

async function api(path, body) {
  const headers = { "Content-Type": "application/json" }, key = $("api-key").value;
  if (key) headers["X-API-Key"] = key;
  const r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  if (!r.ok) {
    let message = r.statusText;
    try { message = (await r.json()).error || message; } catch (_) { /* not JSON: a proxy's page */ }
    if (r.status === 403) { // the server was started with --api-keys
      $("key-box").hidden = false;
      message += ": enter the key above";
    }
    const error = new Error(message);
    error.status = r.status;
    throw error;
  }
  return r;
}

async function init() {
  const r = await fetch("/health"), health = await r.json().catch(() => ({}));
  // a 503 "stuck" still lists the models: the page works once the workers are free again
  if (!health.models) throw new Error(health.error || `/health answered ${r.status} ${r.statusText}`);
  models = health.models;
  const limits = health.limits || {}; // offer no more than the server answers
  if (limits.max_beam) for (const id of ["t-beam", "t-nbest"]) $(id).max = limits.max_beam;
  if (limits.max_new_tokens) $("g-max").max = limits.max_new_tokens;
  $("models").textContent = "models: " + models.map((m) => `${m.name} (${m.kind})`).join(", ");
  const translators = models.filter((m) => m.kind === "translation");
  const lms = models.filter((m) => m.kind === "lm");
  const encoders = models.filter((m) => m.kind === "encoder" && (m.classify || m.fill_mask));
  fill($("t-model"), translators.map((m) => [m.name, `${m.name}: ${m.source} → ${m.target}`]));
  fill($("g-model"), lms.map((m) => [m.name, m.name]));
  fill($("e-model"), encoders.map((m) => [m.name, m.name]));
  $("translator").hidden = translators.length === 0;
  $("playground").hidden = lms.length === 0;
  $("encoder").hidden = encoders.length === 0;
  if (encoders.length) encoderButtons();
}

// -- translate -----------------------------------------------------------------------------------
$("t-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError();
  const beam = number("t-beam", 4), nbest = Math.min(number("t-nbest", 1), beam);
  $("t-go").disabled = true;
  // the last answer leaves at once: after an error nothing on the page belongs to another text
  $("t-out").textContent = "";
  $("t-alts").replaceChildren();
  $("t-r2l").hidden = true;
  $("t-note").hidden = true;
  attention = null;
  sentences = [];
  setupExplorer();
  try { // sentence by sentence, as LibreTranslate translates: a model trained on sentences drops the rest
    const body = { model: $("t-model").value, q: [$("t-src").value], beam, nbest, attention: true, sentences: true };
    let answer;
    try {
      answer = await api("/v1/translate", body);
    } catch (e) { // a long text's maps are over the server's --max-attention-values: translate without
      if (e.status !== 413) throw e;
      answer = await api("/v1/translate", { ...body, attention: false });
      $("t-note").textContent = `No attention maps: ${e.message}`;
      $("t-note").hidden = false;
    }
    const result = (await answer.json()).results[0];
    if (result.truncated) { // more source tokens than the model reads: only the first part was translated
      const cut = "Only the first part of this text was translated: it is longer than the model reads.";
      $("t-note").textContent = $("t-note").hidden ? cut : `${$("t-note").textContent} ${cut}`;
      $("t-note").hidden = false;
    }
    $("t-out").textContent = result.translation;
    $("t-r2l").hidden = result.r2l === undefined; // a bidirectional model: the memory it read
    $("t-r2l-text").textContent = result.r2l || "";
    $("t-alts").replaceChildren(...result.hypotheses.map((h) => {
      const li = document.createElement("li");
      const score = document.createElement("span");
      score.className = "score";
      score.textContent = ` (${h.score.toFixed(3)})`;
      li.append(h.text, score);
      return li;
    }));
    sentences = (result.sentences || []).filter((r) => r.attention && r.attention.encoder);
    fill($("a-sentence"), sentences.map((r, i) => [i, `${i + 1}: ${r.translation}`]));
    $("a-sentence-box").hidden = sentences.length < 2; // each sentence's maps, one at a time
    attention = sentences.length ? sentences[0].attention : null;
    setupExplorer();
  } catch (e) {
    showError(e);
  } finally {
    $("t-go").disabled = false;
  }
});

// -- attention -----------------------------------------------------------------------------------
function setupExplorer() {
  $("explorer").hidden = !(attention && attention.encoder);
  if ($("explorer").hidden) {
    $("a-view-box").replaceChildren(); // nothing left to export
    return;
  }
  for (const option of $("a-kind").options) { // r2l_*: a bidirectional model's only
    option.hidden = option.disabled = !attention[option.value];
  }
  if ($("a-kind").selectedOptions[0].disabled) $("a-kind").value = "cross";
  setupLayers();
}

function setupLayers() { // the kind's own layers and heads (an encoder and a decoder may differ)
  const maps = attention[$("a-kind").value], layer = Number($("a-layer").value), head = $("a-head").value;
  fill($("a-layer"), [...Array(maps.length).keys()].map((i) => [i, `layer ${i}`]));
  fill($("a-head"), [["all", "all heads"], ...[...Array(maps[0].length).keys()].map((i) => [i, `head ${i}`])]);
  if (layer < maps.length) $("a-layer").value = String(layer);
  if (head === "all" || Number(head) < maps[0].length) $("a-head").value = head || "all";
  render();
}

function tokens(kind) { // [query labels, key labels]
  const s = attention.src_tokens, t = attention.tgt_tokens, r = attention.r2l_tokens;
  return { encoder: [s, s], decoder_self: [t, t], cross: [t, s], r2l_self: [r, r], r2l_cross: [r, s],
    cross_r2l: [t, r] }[kind];
}

function headsOf(kind, layer, head) { // a list of (queries × keys) matrices
  const all = attention[kind][layer];
  return head === "all" ? all : [all[Number(head)]];
}

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function label(text, x, y, anchor, extra = {}) {
  const node = el("text", { x, y, "text-anchor": anchor, "font-size": 12, "font-family": "sans-serif", class: "tok",
    tabindex: 0, ...extra }, shown(text));
  node.setAttribute("role", "button");
  return node;
}

function render() {
  if (!attention) return;
  const kind = $("a-kind").value, layer = Number($("a-layer").value), head = $("a-head").value;
  const [queries, keys] = tokens(kind), heads = headsOf(kind, layer, head);
  const svg = $("a-view").value === "matrix" ? matrix(queries, keys, heads) : lines(queries, keys, heads, head);
  svg.id = "a-svg-view";
  svg.setAttribute("aria-label", `${$("a-kind").selectedOptions[0].text}, layer ${layer}, ${head === "all" ? "all heads" : "head " + head}`);
  $("a-view-box").replaceChildren(svg);
}

function matrix(queries, keys, heads) { // heat map: cell (i, j) = mean over the heads shown
  const cell = 22, pad = 8 + 7 * Math.max(...queries.map((t) => t.length), 4);
  const top = 8 + 7 * Math.max(...keys.map((t) => t.length), 4);
  const svg = el("svg", { xmlns: SVG, width: pad + cell * keys.length + 8, height: top + cell * queries.length + 8 });
  svg.append(el("rect", { width: "100%", height: "100%", fill: "white" }));
  const cells = [];
  queries.forEach((q, i) => keys.forEach((k, j) => {
    const w = heads.reduce((a, h) => a + h[i][j], 0) / heads.length;
    const rect = el("rect", { x: pad + j * cell, y: top + i * cell, width: cell - 1, height: cell - 1,
      fill: COLORS[0], "fill-opacity": w.toFixed(4), "data-i": i, "data-j": j });
    rect.append(el("title", {}, `${q} → ${k}: ${w.toFixed(3)}`));
    cells.push(rect);
    svg.append(rect);
  }));
  const focus = (axis, index) => cells.forEach((c) => {
    c.setAttribute("stroke", index !== null && Number(c.dataset[axis]) === index ? "#f0a500" : "none");
  });
  queries.forEach((q, i) => {
    const t = label(q, pad - 6, top + i * cell + 15, "end", { "data-query": i });
    hover(t, () => focus("i", i), () => focus("i", null));
    svg.append(t);
  });
  keys.forEach((k, j) => {
    const x = pad + j * cell + 15, y = top - 6;
    const t = label(k, x, y, "start", { transform: `rotate(-90 ${x} ${y})`, "data-key": j });
    hover(t, () => focus("j", j), () => focus("j", null));
    svg.append(t);
  });
  return svg;
}

function lines(queries, keys, heads, head) { // bertviz's head view: queries left, keys right
  const row = 22, left = 10 + 7 * Math.max(...queries.map((t) => t.length), 4), gap = 160;
  const height = 16 + row * Math.max(queries.length, keys.length);
  const svg = el("svg", { xmlns: SVG, width: left + gap + 20 + 7 * Math.max(...keys.map((t) => t.length), 4), height });
  svg.append(el("rect", { width: "100%", height: "100%", fill: "white" }));
  const all = [];
  heads.forEach((h, n) => queries.forEach((_, i) => keys.forEach((_, j) => {
    const line = el("line", { x1: left + 4, y1: 12 + i * row, x2: left + gap - 4, y2: 12 + j * row,
      stroke: COLORS[(head === "all" ? n : Number(head)) % COLORS.length], "stroke-width": 2,
      "stroke-opacity": (h[i][j] / heads.length ** 0.5).toFixed(4), "data-i": i, "data-j": j });
    all.push(line);
    svg.append(line);
  })));
  const only = (axis, index) => all.forEach((line) => { // a query's lines, or the lines into a key
    line.style.display = index === null || Number(line.dataset[axis]) === index ? "" : "none";
  });
  queries.forEach((q, i) => {
    const t = label(q, left, 16 + i * row, "end", { "data-query": i });
    hover(t, () => only("i", i), () => only("i", null));
    svg.append(t);
  });
  keys.forEach((k, j) => {
    const t = label(k, left + gap, 16 + j * row, "start", { "data-key": j });
    hover(t, () => only("j", j), () => only("j", null));
    svg.append(t);
  });
  return svg;
}

function hover(node, on, off) {
  node.addEventListener("mouseenter", () => { node.classList.add("on"); on(); });
  node.addEventListener("mouseleave", () => { node.classList.remove("on"); off(); });
  node.addEventListener("focus", () => { node.classList.add("on"); on(); });
  node.addEventListener("blur", () => { node.classList.remove("on"); off(); });
}

$("a-sentence").addEventListener("change", () => { // another sentence's maps, the same kind, layer and head
  attention = sentences[Number($("a-sentence").value)].attention;
  setupExplorer();
});
$("a-kind").addEventListener("change", setupLayers);
for (const id of ["a-layer", "a-head", "a-view"]) $(id).addEventListener("change", render);

function download(blob, name) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

function svgText() { return new XMLSerializer().serializeToString($("a-svg-view")); }

$("a-svg").addEventListener("click", () => download(new Blob([svgText()], { type: "image/svg+xml" }), "attention.svg"));
$("a-png").addEventListener("click", () => {
  showError();
  const svg = $("a-svg-view"), image = new Image();
  const width = Number(svg.getAttribute("width")), height = Number(svg.getAttribute("height"));
  const scale = Math.min(2, MAX_PNG_SIDE / Math.max(width, height)); // twice the size, where it fits
  if (scale < 0.5) {
    showError(`This map is too large for a PNG (${width} × ${height}); export SVG`);
    return;
  }
  image.onerror = () => showError("The browser could not draw this map as a PNG; export SVG");
  image.onload = () => {
    const canvas = document.createElement("canvas");
    canvas.width = Math.ceil(width * scale);
    canvas.height = Math.ceil(height * scale);
    const ctx = canvas.getContext("2d");
    ctx.scale(scale, scale);
    ctx.drawImage(image, 0, 0);
    canvas.toBlob((blob) => blob ? download(blob, "attention.png")
      : showError("The browser could not make this PNG; export SVG"), "image/png");
  };
  image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText());
});

// -- language model ------------------------------------------------------------------------------
$("g-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError();
  const out = $("g-out"), topK = number("g-topk", 0), topP = number("g-topp", 1); // emptied: off
  const body = { model: $("g-model").value, prompt: $("g-prompt").value, max_new_tokens: number("g-max", 100),
    temperature: number("g-temp", 0.8), top_k: topK > 0 ? topK : null, top_p: topP < 1 ? topP : null, stream: true };
  out.textContent = ""; // a refused request leaves no prompt shown as if it were an answer
  $("g-go").disabled = true;
  try {
    const reader = (await api("/v1/generate", body)).body.getReader();
    out.textContent = body.prompt;
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const line = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (!line.startsWith("data: ")) continue;
        const data = JSON.parse(line.slice(6));
        if (data.error) showError(data.error);
        else if (!data.done) out.textContent += data.text;
      }
    }
  } catch (e) {
    showError(e);
  } finally {
    $("g-go").disabled = false;
  }
});

// -- encoder -------------------------------------------------------------------------------------
function encoderButtons() { // what the chosen encoder can do: classify (a head), fill masks (a masked LM)
  const m = models.find((x) => x.name === $("e-model").value) || {};
  $("e-classify").disabled = !m.classify;
  $("e-fill").disabled = !m.fill_mask;
}

$("e-model").addEventListener("change", encoderButtons);

function item(text) {
  const li = document.createElement("li");
  li.textContent = text;
  return li;
}

$("e-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError();
  const fillMasks = event.submitter === $("e-fill"), out = $("e-out");
  const body = { model: $("e-model").value, q: $("e-text").value, top_k: number("e-topk", 3) };
  out.replaceChildren();
  $("e-classify").disabled = $("e-fill").disabled = true;
  try {
    const answer = await (await api(fillMasks ? "/v1/fill-mask" : "/v1/classify", body)).json();
    if (fillMasks) { // per <mask>: its pieces, most probable first
      out.replaceChildren(...answer.masks.map((fillers, k) => item(`<mask> ${k + 1}: ` + fillers.map((f) =>
        `${shown(f.token.trim())} ${f.probability.toFixed(3)}`).join(", "))));
    } else {
      out.replaceChildren(...answer.results.map((r) => item(`${r.label} ${r.probability.toFixed(3)}`)));
    }
  } catch (e) {
    showError(e);
  } finally {
    encoderButtons();
  }
});

init().catch(showError);
