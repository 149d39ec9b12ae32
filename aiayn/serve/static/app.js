// aiayn's page: a translator, an attention explorer for the translation just made, and a language-model
// playground. Plain JavaScript, no library, no request beyond this server.
"use strict";
const $ = (id) => document.getElementById(id);
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2457c5", "#d1495b", "#00798c", "#edae49", "#66a182", "#8e5ea2", "#30638e", "#e07a5f"];
let attention = null;

function showError(e) { $("error").textContent = e ? String(e.message || e) : ""; }

function fill(select, items) {
  select.replaceChildren(...items.map(([value, text]) => new Option(text, value)));
}

async function api(path, body) {
  const r = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  if (!r.ok) throw new Error((await r.json()).error || r.statusText);
  return r;
}

async function init() {
  const health = await (await fetch("/health")).json();
  const models = health.models;
  $("models").textContent = "models: " + models.map((m) => `${m.name} (${m.kind})`).join(", ");
  const translators = models.filter((m) => m.kind === "translation");
  const lms = models.filter((m) => m.kind === "lm");
  fill($("t-model"), translators.map((m) => [m.name, `${m.name}: ${m.source} → ${m.target}`]));
  fill($("g-model"), lms.map((m) => [m.name, m.name]));
  $("translator").hidden = translators.length === 0;
  $("playground").hidden = lms.length === 0;
}

// -- translate -----------------------------------------------------------------------------------
$("t-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError();
  const beam = Number($("t-beam").value), nbest = Math.min(Number($("t-nbest").value), beam);
  $("t-go").disabled = true;
  try {
    const body = { model: $("t-model").value, q: [$("t-src").value], beam, nbest, attention: true };
    const result = (await (await api("/v1/translate", body)).json()).results[0];
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
    attention = result.attention || null;
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
  if ($("explorer").hidden) return;
  for (const option of $("a-kind").options) option.hidden = !attention[option.value]; // r2l_*: bidirectional only
  if ($("a-kind").selectedOptions[0].hidden) $("a-kind").value = "cross";
  const layers = attention.encoder.length, heads = attention.encoder[0].length;
  fill($("a-layer"), [...Array(layers).keys()].map((i) => [i, `layer ${i}`]));
  fill($("a-head"), [["all", "all heads"], ...[...Array(heads).keys()].map((i) => [i, `head ${i}`])]);
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
    tabindex: 0, ...extra }, text);
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
      "stroke-opacity": (h[i][j] / heads.length ** 0.5).toFixed(4), "data-i": i });
    all.push(line);
    svg.append(line);
  })));
  const only = (i) => all.forEach((line) => {
    line.style.display = i === null || Number(line.dataset.i) === i ? "" : "none";
  });
  queries.forEach((q, i) => {
    const t = label(q, left, 16 + i * row, "end", { "data-query": i });
    hover(t, () => only(i), () => only(null));
    svg.append(t);
  });
  keys.forEach((k, j) => svg.append(label(k, left + gap, 16 + j * row, "start", { "data-key": j })));
  return svg;
}

function hover(node, on, off) {
  node.addEventListener("mouseenter", () => { node.classList.add("on"); on(); });
  node.addEventListener("mouseleave", () => { node.classList.remove("on"); off(); });
  node.addEventListener("focus", () => { node.classList.add("on"); on(); });
  node.addEventListener("blur", () => { node.classList.remove("on"); off(); });
}

for (const id of ["a-kind", "a-layer", "a-head", "a-view"]) $(id).addEventListener("change", render);

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
  const svg = $("a-svg-view"), image = new Image();
  image.onload = () => {
    const canvas = document.createElement("canvas");
    canvas.width = Number(svg.getAttribute("width")) * 2;
    canvas.height = Number(svg.getAttribute("height")) * 2;
    const ctx = canvas.getContext("2d");
    ctx.scale(2, 2);
    ctx.drawImage(image, 0, 0);
    canvas.toBlob((blob) => download(blob, "attention.png"), "image/png");
  };
  image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(svgText());
});

// -- language model ------------------------------------------------------------------------------
$("g-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  showError();
  const out = $("g-out"), topK = Number($("g-topk").value), topP = Number($("g-topp").value);
  const body = { model: $("g-model").value, prompt: $("g-prompt").value, max_new_tokens: Number($("g-max").value),
    temperature: Number($("g-temp").value), top_k: topK > 0 ? topK : null, top_p: topP < 1 ? topP : null, stream: true };
  out.textContent = body.prompt;
  $("g-go").disabled = true;
  try {
    const reader = (await api("/v1/generate", body)).body.getReader();
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

init().catch(showError);
