// The book's Transformer in plain JavaScript: the same operations as transformer_lib, part by part.
// Load model.js (which sets TRANSLATOR_MODEL) first; this file sets the global BookTranslator.
(function () {
  "use strict";

  // ---- weights: float16 bytes (base64) to Float32Arrays -------------------------------------------
  function halfToFloat(h) {
    const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, f = h & 0x3ff;
    if (e === 0) return s * f * Math.pow(2, -24);
    if (e === 31) return f ? NaN : s * Infinity;
    return s * (1 + f / 1024) * Math.pow(2, e - 15);
  }
  function loadWeights(model) {
    const bin = atob(model.data), n = bin.length >> 1, table = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) table[h] = halfToFloat(h);
    const all = new Float32Array(n);
    for (let i = 0; i < n; i++) all[i] = table[bin.charCodeAt(2 * i) | (bin.charCodeAt(2 * i + 1) << 8)];
    const W = {};
    for (const [name, t] of Object.entries(model.tensors)) {
      const size = t.shape.reduce((a, b) => a * b, 1);
      W[name] = all.subarray(t.offset, t.offset + size);
    }
    return W;
  }

  // ---- the byte-level BPE of chapter 1b (tokenizer.py) --------------------------------------------
  const N_SPECIAL = 4, N_BASE = N_SPECIAL + 256, SPECIAL = ["<pad>", "<bos>", "<eos>", "<unk>"];
  // Python's PATTERN " ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+" with its Unicode classes spelled out:
  // \w = letters and numbers (and _), \d = decimal digits, \s = Python's str.isspace() characters.
  const S = "\\t\\n\\v\\f\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
  const PRETOKEN = new RegExp(
    ` ?[\\p{L}\\p{Nl}\\p{No}]+| ?\\p{Nd}+| ?[^${S}\\p{L}\\p{N}]+|[${S}]+(?![^${S}])|[${S}]+`, "gu");
  const PATTERN = " ?[^\\W\\d_]+| ?\\d+| ?(?:[^\\s\\w]|_)+|\\s+(?!\\S)|\\s+";  // the pattern PRETOKEN spells out
  const BLANK = new RegExp(`^[${S}]*$`, "u");  // what Python's str.strip() leaves empty
  function pretokenize(text) { return Array.from(text.matchAll(PRETOKEN), (m) => m[0]); }

  function Tokenizer(merges) {
    this.merges = merges;
    this.rank = new Map();  // "a,b" -> merged id (the earliest merge has the lowest id)
    this.bytes = SPECIAL.map((t) => new TextEncoder().encode(t));
    for (let b = 0; b < 256; b++) this.bytes.push(Uint8Array.of(b));
    merges.forEach(([a, b], k) => {
      this.rank.set(a + "," + b, N_BASE + k);
      const x = this.bytes[a], y = this.bytes[b], z = new Uint8Array(x.length + y.length);
      z.set(x); z.set(y, x.length); this.bytes.push(z);
    });
    this.cache = new Map();
  }
  Tokenizer.prototype.encodePiece = function (piece) {
    let ids = Array.from(new TextEncoder().encode(piece), (b) => b + N_SPECIAL);
    while (ids.length > 1) {
      let best = Infinity;
      for (let i = 0; i + 1 < ids.length; i++) {
        const r = this.rank.get(ids[i] + "," + ids[i + 1]);
        if (r !== undefined && r < best) best = r;
      }
      if (best === Infinity) break;
      const [a, b] = this.merges[best - N_BASE], out = [];
      for (let i = 0; i < ids.length; i++) {  // merge_ids: left to right
        if (i + 1 < ids.length && ids[i] === a && ids[i + 1] === b) { out.push(best); i++; }
        else out.push(ids[i]);
      }
      ids = out;
    }
    return ids;
  };
  Tokenizer.prototype.encode = function (text) {
    const out = [];
    for (const piece of pretokenize(text)) {
      let ids = this.cache.get(piece);
      if (ids === undefined) { ids = this.encodePiece(piece); this.cache.set(piece, ids); }
      out.push(...ids);
    }
    return out;
  };
  Tokenizer.prototype.decodeBytes = function (ids) {
    const parts = ids.filter((i) => i >= N_SPECIAL).map((i) => this.bytes[i]);
    const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) { all.set(p, at); at += p.length; }
    return all;
  };
  // bytes that are not valid UTF-8 become U+FFFD, as Python's errors="replace"
  Tokenizer.prototype.decode = function (ids) { return new TextDecoder("utf-8").decode(this.decodeBytes(ids)); };
  Tokenizer.prototype.token = function (i) {  // a readable token, <0xNN> for a byte that is not UTF-8 alone
    if (i < N_SPECIAL) return SPECIAL[i];
    try { return new TextDecoder("utf-8", { fatal: true }).decode(this.bytes[i]); }
    catch (e) { return Array.from(this.bytes[i], (b) => "<0x" + b.toString(16).toUpperCase().padStart(2, "0") + ">").join(""); }
  };

  // ---- the layers: rows of a (T, D) matrix are Float32Arrays -------------------------------------
  // nn.Linear: y = x W^T + b, W of shape (out, in)
  function linear(x, W, b, nOut) {
    const nIn = x.length, y = new Float32Array(nOut);
    for (let o = 0; o < nOut; o++) {
      let s = b ? b[o] : 0;
      const row = o * nIn;
      for (let i = 0; i < nIn; i++) s += W[row + i] * x[i];
      y[o] = s;
    }
    return y;
  }
  // nn.LayerNorm(d_model), eps 1e-5: biased variance
  function layerNorm(x, g, b) {
    const n = x.length;
    let mean = 0; for (let i = 0; i < n; i++) mean += x[i]; mean /= n;
    let v = 0; for (let i = 0; i < n; i++) v += (x[i] - mean) ** 2; v /= n;
    const inv = 1 / Math.sqrt(v + 1e-5), y = new Float32Array(n);
    for (let i = 0; i < n; i++) y[i] = (x[i] - mean) * inv * g[i] + b[i];
    return y;
  }
  function add(x, y) { const z = new Float32Array(x.length); for (let i = 0; i < x.length; i++) z[i] = x[i] + y[i]; return z; }
  // post-norm sublayer connection (norm_first=False): norm(x + sublayer(x))
  function sublayer(W, p, x, out) { return layerNorm(add(x, out), W[p + ".norm.weight"], W[p + ".norm.bias"]); }
  // PositionwiseFeedForward: linear2(relu(linear1(x)))
  function ffn(W, p, x, c) {
    const h = linear(x, W[p + ".linear1.weight"], W[p + ".linear1.bias"], c.d_ff);
    for (let i = 0; i < h.length; i++) if (h[i] < 0) h[i] = 0;
    return linear(h, W[p + ".linear2.weight"], W[p + ".linear2.bias"], c.d_model);
  }
  // the keys and values of rows xs: [k rows, v rows]
  function keysValues(W, p, xs, c) {
    return [xs.map((x) => linear(x, W[p + ".k_proj.weight"], W[p + ".k_proj.bias"], c.d_model)),
            xs.map((x) => linear(x, W[p + ".v_proj.weight"], W[p + ".v_proj.bias"], c.d_model))];
  }
  // MultiHeadAttention for one query row over the keys/values it may attend (the mask, applied by
  // passing only the allowed keys): softmax(q k^T / sqrt(d_head)) v per head, heads concatenated, out_proj.
  // Returns the output row and the weights, one array per head.
  function attend(W, p, x, keys, values, c) {
    const H = c.n_heads, Dh = c.d_model / H, q = linear(x, W[p + ".q_proj.weight"], W[p + ".q_proj.bias"], c.d_model);
    const cat = new Float32Array(c.d_model), weights = [];
    for (let h = 0; h < H; h++) {
      const o = h * Dh, scores = new Float64Array(keys.length);
      let max = -Infinity;
      for (let j = 0; j < keys.length; j++) {
        let s = 0; for (let d = 0; d < Dh; d++) s += q[o + d] * keys[j][o + d];
        scores[j] = s / Math.sqrt(Dh); if (scores[j] > max) max = scores[j];
      }
      let sum = 0; for (let j = 0; j < keys.length; j++) { scores[j] = Math.exp(scores[j] - max); sum += scores[j]; }
      for (let j = 0; j < keys.length; j++) scores[j] /= sum;
      for (let d = 0; d < Dh; d++) { let s = 0; for (let j = 0; j < keys.length; j++) s += scores[j] * values[j][o + d]; cat[o + d] = s; }
      weights.push(scores);
    }
    return [linear(cat, W[p + ".out_proj.weight"], W[p + ".out_proj.bias"], c.d_model), weights];
  }
  // sinusoidal_encoding: interleaved sin/cos pairs, frequencies 10000^(-2i/D)
  function position(t, D) {
    const pe = new Float32Array(D);
    for (let i = 0; i < D; i += 2) { const a = t * Math.pow(10000, -i / D); pe[i] = Math.sin(a); pe[i + 1] = Math.cos(a); }
    return pe;
  }
  // TokenEmbedding * sqrt(d_model) + positions (embeddings tied: one (V, D) matrix)
  function embed(W, id, t, c) {
    const E = W["src_embed.embedding.weight"], D = c.d_model, x = new Float32Array(D), s = Math.sqrt(D), pe = position(t, D);
    for (let i = 0; i < D; i++) x[i] = E[id * D + i] * s + pe[i];
    return x;
  }

  // ---- the model: encoder, cached decoder step, tied generator ----------------------------------
  // the encoder, one layer at a time (a generator: the page may yield between layers); returns the memory
  function* encoding(W, c, src) {
    let xs = src.map((id, t) => embed(W, id, t, c));
    for (let l = 0; l < c.n_encoder_layers; l++) {
      const p = "encoder.layers." + l, [K, V] = keysValues(W, p + ".self_attn", xs, c);
      xs = xs.map((x) => sublayer(W, p + ".sublayers.0", x, attend(W, p + ".self_attn", x, K, V, c)[0]));
      yield l;
      xs = xs.map((x) => sublayer(W, p + ".sublayers.1", x, ffn(W, p + ".ffn", x, c)));
      yield l;
    }
    return xs;  // the memory (S rows)
  }
  function encode(W, c, src) {
    const layers = encoding(W, c, src);
    for (;;) { const { value, done } = layers.next(); if (done) return value; }
  }
  function Decoder(W, c, memory) {
    this.W = W; this.c = c; this.t = 0;
    this.self = [];  // per layer: keys and values of the positions so far (the KVCache of chapter 12b)
    this.cross = [];  // per layer: the memory's keys and values, computed once (a static cache)
    for (let l = 0; l < c.n_decoder_layers; l++) {
      this.self.push([[], []]);
      this.cross.push(keysValues(W, "decoder.layers." + l + ".cross_attn", memory, c));
    }
  }
  // one step: the newest token in, log-probabilities of the next one out, with the cross-attention weights
  Decoder.prototype.step = function (id) {
    const W = this.W, c = this.c, crossWeights = [];
    let y = embed(W, id, this.t, c);
    for (let l = 0; l < c.n_decoder_layers; l++) {
      const p = "decoder.layers." + l, [K, V] = this.self[l];
      K.push(linear(y, W[p + ".self_attn.k_proj.weight"], W[p + ".self_attn.k_proj.bias"], c.d_model));
      V.push(linear(y, W[p + ".self_attn.v_proj.weight"], W[p + ".self_attn.v_proj.bias"], c.d_model));
      y = sublayer(W, p + ".sublayers.0", y, attend(W, p + ".self_attn", y, K, V, c)[0]);  // causal: keys so far
      const [out, w] = attend(W, p + ".cross_attn", y, this.cross[l][0], this.cross[l][1], c);
      crossWeights.push(w);
      y = sublayer(W, p + ".sublayers.1", y, out);
      y = sublayer(W, p + ".sublayers.2", y, ffn(W, p + ".ffn", y, c));
    }
    this.t += 1;
    // Generator: the tied (V, D) matrix and its bias, then log_softmax
    const logits = linear(y, W["src_embed.embedding.weight"], W["generator.bias"], c.vocab_size);
    let max = -Infinity; for (let i = 0; i < logits.length; i++) if (logits[i] > max) max = logits[i];
    let sum = 0; for (let i = 0; i < logits.length; i++) sum += Math.exp(logits[i] - max);
    const lse = max + Math.log(sum), logp = new Float32Array(logits.length);
    for (let i = 0; i < logits.length; i++) logp[i] = logits[i] - lse;
    logp[c.pad_id] = -Infinity; logp[c.bos_id] = -Infinity;  // never an output
    return [logp, crossWeights];
  };

  function argmax(a) { let b = 0; for (let i = 1; i < a.length; i++) if (a[i] > a[b]) b = i; return b; }

  function BookTranslator(model) {
    if (model.pattern !== PATTERN)  // a tokenizer trained with another pattern needs PRETOKEN rewritten
      throw new Error(`the tokenizer's pattern ${model.pattern} is not the one this page implements, ${PATTERN}`);
    this.config = model.config;
    this.W = loadWeights(model);
    this.tokenizer = new Tokenizer(model.merges);
  }
  // Translator.encode: tokens cut to max_len - 1, then eos; clean_text makes lone surrogates U+FFFD
  BookTranslator.prototype.source = function (text) {
    const clean = text.replace(/[\ud800-\udfff]/gu, "\ufffd"), limit = this.config.max_len - 1;
    const ids = this.tokenizer.encode(clean), cut = ids.length > limit;
    return { ids: ids.slice(0, limit).concat([this.config.eos_id]), cut: cut, limit: limit };
  };
  // greedy_decode, one sentence, as a generator: it yields after each token so that a page stays responsive.
  // The budget is output_budget's min(S + 50, max_len) tokens: decoding always stops.
  BookTranslator.prototype.greedySteps = function* (text) {
    const c = this.config, result = { text: "", ids: [], source: [], attention: [], note: "" };
    if (BLANK.test(text)) { result.note = "An empty sentence translates to an empty one."; yield result; return result; }
    const src = this.source(text);
    if (src.cut) result.note = `The sentence is longer than ${src.limit} tokens, the most the model has positions for: it was truncated to its first ${src.limit} tokens.`;
    result.source = src.ids;
    const layers = encoding(this.W, c, src.ids);
    let memory;
    for (;;) { const { value, done } = layers.next(); if (done) { memory = value; break; } yield result; }
    const dec = new Decoder(this.W, c, memory);
    const steps = Math.min(src.ids.length + 50, c.max_len);
    let id = c.bos_id;
    for (let s = 0; s < steps; s++) {
      const [logp, w] = dec.step(id);
      id = argmax(logp);
      result.attention.push(w);  // [layer][head] -> weights over the source, for the token chosen here
      if (id === c.eos_id) break;
      result.ids.push(id);
      yield result;
    }
    result.text = this.tokenizer.decode(result.ids);
    if (!result.note && result.ids.length === steps) result.note = `Decoding stopped at its budget of ${steps} tokens.`;
    yield result;
    return result;
  };
  BookTranslator.prototype.encode = function (ids) { return encode(this.W, this.config, ids); };
  BookTranslator.prototype.greedy = function (text) {
    let last; for (const r of this.greedySteps(text)) last = r; return last;
  };
  BookTranslator.pretokenize = pretokenize;
  window.BookTranslator = BookTranslator;
})();
