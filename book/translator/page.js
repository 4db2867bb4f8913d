// The page of appendix E: a text box, the translation, its cross-attention as a heatmap.
// Decoding yields to the browser after each token (setTimeout), so typing never freezes the page.
(function () {
  "use strict";
  const $ = (id) => document.getElementById(id);
  const state = { translator: null, run: 0, result: null, drawn: null };
  window.BookTranslatorPage = state;
  const MAX_CELLS = 4000;  // a table up to this many cells; a canvas above

  function escapeText(s) { const d = document.createElement("span"); d.textContent = s; return d.innerHTML; }

  // the weights drawn: one row per target piece, one column per source piece (a layer, one head or their mean)
  function matrix(result, layer, head) {
    return result.attention.map((perLayer) => {
      const heads = perLayer[layer], S = heads[0].length, row = new Array(S).fill(0);
      const chosen = head === "mean" ? heads : [heads[+head]];
      for (const w of chosen) for (let j = 0; j < S; j++) row[j] += w[j] / chosen.length;
      return row;
    });
  }

  function draw() {
    const r = state.result, box = $("bt-heatmap");
    if (!r || !r.attention.length) { box.innerHTML = ""; state.drawn = null; return; }
    const tok = state.translator.tokenizer, eos = state.translator.config.eos_id;
    const rows = matrix(r, +$("bt-layer").value, $("bt-head").value);
    state.drawn = rows;
    const targets = r.ids.slice(0, rows.length).map((i) => tok.token(i));
    while (targets.length < rows.length) targets.push(tok.token(eos));
    const sources = r.source.map((i) => tok.token(i));
    if (rows.length * sources.length > MAX_CELLS) {  // too many cells for a table: an unlabelled canvas
      const canvas = document.createElement("canvas"), g = canvas.getContext("2d");
      const cw = Math.max(1, Math.floor(700 / sources.length)), ch = Math.max(2, Math.floor(400 / rows.length));
      canvas.width = cw * sources.length; canvas.height = ch * rows.length;
      rows.forEach((row, t) => row.forEach((w, j) => {
        const shade = Math.round(255 * (1 - w));
        g.fillStyle = `rgb(${shade}, ${shade}, 255)`; g.fillRect(cw * j, ch * t, cw, ch);
      }));
      box.innerHTML = `<p>${rows.length} target pieces by ${sources.length} source pieces: too many to label.</p>`;
      box.appendChild(canvas);
      return;
    }
    let html = '<table class="bt-map"><thead><tr><th></th>';
    for (const s of sources) html += `<th class="bt-src"><span>${escapeText(s.replace(/ /g, "\u2423"))}</span></th>`;
    html += "</tr></thead><tbody>";
    rows.forEach((row, t) => {
      html += `<tr><th class="bt-tgt">${escapeText(targets[t].replace(/ /g, "\u2423"))}</th>`;
      for (const w of row) {
        const shade = Math.round(255 * (1 - w));
        html += `<td style="background: rgb(${shade}, ${shade}, 255)" title="${w.toFixed(3)}"></td>`;
      }
      html += "</tr>";
    });
    box.innerHTML = html + "</tbody></table>";
  }

  function translate() {
    const run = ++state.run, text = $("bt-input").value, steps = state.translator.greedySteps(text);
    const started = performance.now();
    $("bt-status").textContent = "Translating\u2026";
    function next() {
      if (run !== state.run) return;  // a newer text replaced this one
      const { value, done } = steps.next();
      if (value) { state.result = value; $("bt-output").textContent = value.text || state.translator.tokenizer.decode(value.ids); }
      if (done) return finish();
      setTimeout(next, 0);
    }
    function finish() {
      const r = state.result, ms = performance.now() - started;
      $("bt-output").textContent = r.text;
      $("bt-status").textContent = (r.note ? r.note + " " : "") +
        (r.source.length ? `${r.source.length} source tokens with <eos>, ${r.ids.length} target tokens, ${Math.round(ms)} ms.` : "");
      draw();
      state.done = run;
    }
    next();
  }

  const STYLE = [
    ".book-translator textarea { width: 100%; box-sizing: border-box; font-size: 1rem; }",
    ".book-translator .bt-output { font-size: 1.15rem; font-weight: 600; min-height: 1.5em; }",
    ".bt-scroll { max-width: 100%; overflow-x: auto; }",
    ".bt-map { border-collapse: collapse; font-size: 0.75rem; }",
    ".bt-map td { width: 1.4em; min-width: 1.4em; height: 1.4em; padding: 0; border: 1px solid #eee; }",
    ".bt-map th { font-weight: normal; padding: 0 0.3em; white-space: nowrap; }",
    ".bt-map th.bt-tgt { text-align: right; }",
    ".bt-map th.bt-src { vertical-align: bottom; height: 6em; }",
    ".bt-map th.bt-src span { writing-mode: vertical-rl; transform: rotate(180deg); }",
  ].join("\n");

  function start() {
    const style = document.createElement("style");
    style.textContent = STYLE;
    document.head.appendChild(style);
    if (!window.TRANSLATOR_MODEL || !window.BookTranslator) {
      $("bt-status").textContent = "The model's files did not load: the box works on the book's site, built with make html.";
      return;
    }
    try { state.translator = new window.BookTranslator(window.TRANSLATOR_MODEL); }
    catch (e) { $("bt-status").textContent = "The model cannot run here: " + e.message; return; }
    const c = state.translator.config;
    for (let l = 0; l < c.n_decoder_layers; l++) $("bt-layer").add(new Option(`layer ${l + 1}`, l));
    $("bt-layer").value = c.n_decoder_layers - 1;
    $("bt-head").add(new Option("heads averaged", "mean"));
    for (let h = 0; h < c.n_heads; h++) $("bt-head").add(new Option(`head ${h + 1}`, h));
    $("bt-layer").onchange = draw; $("bt-head").onchange = draw;
    $("bt-go").onclick = translate;
    $("bt-input").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); translate(); } });
    state.translateNow = translate;
    translate();
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start); else start();
})();
