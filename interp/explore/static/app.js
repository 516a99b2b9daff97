// interp explore: the page. It talks to the server only through its JSON API (/api/info, /api/run,
// /api/export); every edit builds a patch-file spec list and asks /api/run for the maps of one image.
"use strict";
(function () {
  const token = document.querySelector('meta[name="interp-token"]').content;
  const $ = (id) => document.getElementById(id);
  const state = {
    info: null, image: 0, selected: new Set(), typed: [], edit: "ablate", mode: "zero", target: "smiley",
    drawn: null, selcls: false, saeSelected: new Set(), k: 1, threshold: null, block: 0, head: "mean", last: null, seq: 0, runs: 0,
  };
  window.explorer = state;  // for tests and the console: state.last is the latest /api/run answer

  async function api(path, body) {
    const opts = { headers: { "X-Interp-Token": token } };
    if (body !== undefined) {
      opts.method = "POST";
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const res = await fetch(path, opts);
    if (!res.ok) {
      let msg = res.status + " " + res.statusText;
      try { msg = (await res.json()).error || msg; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    return res;
  }

  function showError(msg) {
    const box = $("error");
    box.textContent = msg || "";
    box.hidden = !msg;
  }

  // ------------------------------------------------------------------ drawing (helpers in draw.js)
  const D = window.interpDraw;
  const { ramp, viridis, magma, fmt } = D;
  // opts.grid: the grid of the values (a pyramid's block of another stage); default the detection block's
  function drawGrid(canvas, values, lo, hi, cmap, opts) {
    D.drawGrid(canvas, opts.grid || state.info.grid, values, lo, hi, cmap, Object.assign({}, opts,
      { image: opts.image ? thumb(state.image) : null }));
  }
  const blockGrid = (b) => state.info.grids[b];
  function renderCurves() {
    D.curves($("curves"), state.last.curves, state.last.baseline.curves, state.info.n_blocks, state.block);
  }

  const imageCache = {};
  function thumb(i) {
    if (!imageCache[i]) {
      const img = new Image();
      img.src = "api/image/" + i + "?token=" + encodeURIComponent(token);
      imageCache[i] = img;
    }
    return imageCache[i];
  }

  function renderMaps() {
    const r = state.last;
    if (!r) return;
    const b = state.block, thr = r.threshold;
    const cur = r.norms[b], base = r.baseline.norms[b];
    const all = cur.concat(base).filter((v) => v > 0);
    const lo = Math.min.apply(null, all), hi = Math.max.apply(null, all.concat([thr * 1.05]));
    const above = (row) => row.map((v) => (v > thr ? 1 : 0));
    const outCur = above(cur);
    const grid = blockGrid(b);
    drawGrid($("norm-map"), cur, lo, hi, viridis, { log: true, outline: outCur, image: true, alpha: 0.72, grid: grid });
    drawGrid($("norm-base"), base, lo, hi, viridis,
      { log: true, outline: above(base), image: true, alpha: 0.72, grid: grid });
    $("map-count").textContent = outCur.reduce((a, v) => a + v, 0) + " above " + fmt(thr) + " at block " + b;
    $("scale").textContent = "norm colour scale (log, both maps): " + fmt(lo) + " (dark) to " + fmt(hi) + " (yellow)";
    if (r.cls_attention) {
      const heads = r.cls_attention[b];
      const row = state.head === "mean"
        ? heads[0].map((_, p) => heads.reduce((a, hrow) => a + hrow[p], 0) / heads.length)
        : heads[Number(state.head)];
      // 0 .. max, but never less than twice the uniform share, so a flat row does not look saturated
      const top = Math.max.apply(null, row), uniform = 1 / row.length, hiA = Math.max(top, 2 * uniform);
      drawGrid($("attn-map"), row, 0, hiA, magma, { log: false, image: true, alpha: 0.8 });
      $("attn-scale").textContent = "(block " + b + "; colour 0 to " + fmt(hiA) + ", max " + fmt(top) +
        ", uniform " + fmt(uniform) + ")";
    } else {
      const ctx = $("attn-map").getContext("2d");
      ctx.clearRect(0, 0, $("attn-map").width, $("attn-map").height);
      ctx.fillText("this model has no CLS token", 20, 40);
    }
    $("prefix").textContent = D.prefixSentence(r, b);
    renderCurves();
  }

  function renderNeurons() {
    const r = state.last;
    const byKey = {};
    (r ? r.neuron_maps : []).forEach((m) => { byKey[m.layer + ":" + m.neuron] = m; });
    document.querySelectorAll("#neurons canvas").forEach((cv) => {
      const m = byKey[cv.dataset.key];
      if (!m) return;
      // each map on its own scale, lowest to highest value: a dense neuron's variations show too
      const lo = Math.min.apply(null, m.map), hi = Math.max.apply(null, m.map);
      drawGrid(cv, m.map, lo, hi, D.activationRamp, { log: false, grid: blockGrid(m.layer) });
      const range = lo === hi ? fmt(lo) + " everywhere" : fmt(lo) + " to " + fmt(hi);
      cv.title = cv.dataset.key + ": activation " + range + " (white: lowest, dark red: highest on this map)";
      cv.parentNode.nextSibling.textContent = range;
    });
  }

  // ------------------------------------------------------------------ edits -> spec
  function neuronDict(keys) {
    const out = {};
    keys.forEach((k) => {
      const [l, n] = k.split(":").map(Number);
      (out[l] = out[l] || []).push(n);
    });
    Object.values(out).forEach((v) => v.sort((a, b) => a - b));
    return out;
  }

  function interventions() {
    const keys = Array.from(state.selected).concat(state.typed.filter((k) => !state.selected.has(k)));
    const spec = [];
    if (keys.length) {
      const neurons = neuronDict(keys);
      if (state.edit === "ablate") spec.push({ kind: "NeuronAblation", neurons: neurons, mode: state.mode });
      else if (state.edit === "register") spec.push({ kind: "TestTimeRegister", neurons: neurons });
      else spec.push({ kind: "Relocation", neurons: neurons, target: currentTarget() });
    }
    if (state.saeSelected.size) {
      const features = Array.from(state.saeSelected).sort((a, b) => a - b);
      spec.push({ kind: "SAEFeatureAblation", features: features, mode: state.mode });
    }
    if (state.selcls) spec.push({ kind: "SelectiveCLS", k: state.k });
    return spec;
  }

  function currentTarget() {
    if (state.target === "draw") return state.drawn;
    return state.info.targets[state.target];
  }

  function parseTyped(text) {
    const items = text.split(",").map((s) => s.trim()).filter(Boolean);
    const bad = items.filter((s) => !/^\d+\s*:\s*\d+$/.test(s));
    if (bad.length) throw new Error("cannot read " + JSON.stringify(bad[0]) + ": type LAYER:NEURON pairs, e.g. 2:17,5:40");
    return items.map((s) => s.replace(/\s/g, ""));
  }

  // ------------------------------------------------------------------ running
  async function run() {
    const seq = ++state.seq;
    const spec = interventions();
    const body = { image: state.image, interventions: spec };
    if (state.threshold !== null) body.threshold = state.threshold;
    $("status").textContent = "running...";
    const t0 = performance.now();
    try {
      const res = await (await api("api/run", body)).json();
      if (seq !== state.seq) return;  // a newer edit is on its way
      state.last = res;
      state.spec = spec;  // the edits the maps show
      $("edits").textContent = res.edits;
      renderMaps();
      renderNeurons();
      renderSae();
      renderReadout();
      showError("");
      state.browserMs = performance.now() - t0;
      state.runs += 1;
      $("timing").textContent = "server " + (res.seconds * 1000).toFixed(0) + " ms" + (res.cached ? " (cached)" : "") +
        ", page " + state.browserMs.toFixed(0) + " ms";
      $("status").textContent = "ready";
      $("status").dataset.runs = String(state.runs);
    } catch (e) {
      if (seq !== state.seq) return;
      showError(e.message + (state.last ? " (the maps still show the edits listed under 'edits')" : ""));
      state.errors = (state.errors || 0) + 1;
      $("status").textContent = "error";
      $("status").dataset.errors = String(state.errors);
    }
  }

  function renderReadout() {
    const r = state.last, ro = r.readout;
    $("outlier-count").textContent = r.outlier_count;
    $("outlier-base").textContent = r.baseline.outlier_count;
    $("detect-layer").textContent = r.detect_layer;
    $("threshold-label").textContent = fmt(r.threshold);
    if (document.activeElement !== $("threshold-num")) $("threshold-num").value = Number(r.threshold.toPrecision(6));
    setThresholdSlider(r.threshold);
    $("readout-metric").textContent = ro.metric;
    let value = ro.kind === "classifier" ? (100 * ro.value).toFixed(1) + " %" : ro.value.toFixed(6) + " (min " + ro.min.toFixed(6) + ")";
    if (ro.kind === "classifier" && ro.accuracy !== null) {
      value += "; accuracy " + (100 * ro.accuracy).toFixed(1) + " % (unedited " + (100 * ro.baseline_accuracy).toFixed(1) + " %)";
    }
    $("readout-value").textContent = value + " over " + ro.n_images + " image(s)";
    const why = ro.kind === "embedding" ? "not a classifier: " + ro.why : ro.why;
    $("readout-why").textContent = ro.accuracy_note ? why + "; " + ro.accuracy_note : why;
  }

  // threshold slider: log scale between the smallest and 4x the largest norm at the detection block
  function thresholdRange() {
    const r = state.last;
    const vals = r.baseline.norms[r.detect_layer].concat(r.norms[r.detect_layer]).filter((v) => v > 0);
    return [Math.log(Math.min.apply(null, vals)), Math.log(4 * Math.max.apply(null, vals.concat([r.default_threshold])))];
  }
  function setThresholdSlider(v) {
    const [lo, hi] = thresholdRange();
    $("threshold").value = String(Math.round(1000 * (Math.log(v) - lo) / (hi - lo)));
  }

  // ------------------------------------------------------------------ set-up
  function buildThumbs() {
    const nav = $("thumbs");
    state.info.images.forEach((im) => {
      const img = thumb(im.index);
      img.alt = im.id;
      img.title = im.id;
      img.dataset.index = im.index;
      img.addEventListener("click", () => {
        state.image = im.index;
        nav.querySelectorAll("img").forEach((el) => el.classList.toggle("selected", el === img));
        run();
      });
      img.addEventListener("load", renderMaps);
      nav.appendChild(img);
    });
    nav.firstChild.classList.add("selected");
  }

  // ------------------------------------------------------------------ SAE artifact features (--sae)
  function buildSae() {
    const sae = state.info.sae;
    if (!sae) return;
    $("sae-panel").hidden = false;
    $("sae-note").textContent = sae.message + " (" + sae.n_alive + " of " + sae.n_features + " features alive; " +
      sae.hook + "). Ticked features are removed with the ablation mode above.";
    const tbody = document.querySelector("#sae-features tbody"), [h, w] = state.info.grid;
    sae.features.forEach((f) => {
      const tr = document.createElement("tr");
      const cos = f.cos_register_neurons_max === null ? "-" : fmt(f.cos_register_neurons_max);
      tr.innerHTML = '<td><input type="checkbox" class="sae-feature"></td><td>' + f.feature + "</td><td>" +
        fmt(f.rates.high_norm) + " / " + fmt(f.rates.normal_patch || 0) + "</td><td>" + fmt(f.cos_mean_high_norm) +
        " / " + cos + '</td><td><canvas width="' + w + '" height="' + h + '"></canvas></td>';
      const box = tr.querySelector("input");
      box.dataset.feature = f.feature;
      box.addEventListener("change", () => {
        if (box.checked) state.saeSelected.add(f.feature); else state.saeSelected.delete(f.feature);
        run();
      });
      tr.querySelector("canvas").dataset.feature = f.feature;
      tbody.appendChild(tr);
    });
  }

  function renderSae() {
    const sae = state.info.sae;
    if (!sae) return;
    const byFeature = {};
    sae.features.forEach((f) => { byFeature[f.feature] = f; });
    document.querySelectorAll("#sae-features canvas").forEach((cv) => {
      const f = byFeature[cv.dataset.feature], map = f && f.maps[state.image];
      if (!map) return;
      const hi = Math.max.apply(null, map.concat([1e-9]));
      drawGrid(cv, map, 0, hi, D.activationRamp, { log: false });
      cv.title = "feature " + f.feature + ": code 0 to " + fmt(hi) + " on this image (unedited)";
    });
  }

  function buildNeurons() {
    const tbody = document.querySelector("#neurons tbody"), info = state.info;
    const planted = new Set(info.planted ? info.planted.neurons.map((n) => info.planted.layer + ":" + n) : []);
    const [h, w] = info.grid;
    info.neurons.list.forEach((n) => {
      const key = n.layer + ":" + n.neuron;
      const tr = document.createElement("tr");
      if (planted.has(key)) tr.className = "planted";
      tr.innerHTML = '<td><input type="checkbox" class="neuron"></td><td>' + key + "</td><td>" +
        (n.score === null ? "-" : fmt(n.score)) + '</td><td><canvas width="' + w + '" height="' + h + '"></canvas></td><td class="amax"></td>';
      const box = tr.querySelector("input");
      box.dataset.layer = n.layer;
      box.dataset.neuron = n.neuron;
      box.addEventListener("change", () => {
        if (box.checked) state.selected.add(key); else state.selected.delete(key);
        run();
      });
      tr.querySelector("canvas").dataset.key = key;
      tbody.appendChild(tr);
    });
    $("neuron-note").textContent = info.neurons.note + (info.neurons.list.length ? "" : " (no neurons listed)");
  }

  function buildTargets() {
    const sel = $("target");
    Object.keys(state.info.targets).concat(["draw"]).forEach((name) => {
      const o = document.createElement("option");
      o.value = name;
      o.textContent = name === "draw" ? "drawn target" : name;
      sel.appendChild(o);
    });
    const [h, w] = state.info.grid;
    state.drawn = Array.from({ length: h }, () => Array(w).fill(0));
    const cv = $("draw");
    let painting = null;
    const cell = (ev) => {
      const rect = cv.getBoundingClientRect();
      return [Math.floor((ev.clientY - rect.top) / rect.height * h), Math.floor((ev.clientX - rect.left) / rect.width * w)];
    };
    const paint = (ev) => {
      const [r, c] = cell(ev);
      if (r < 0 || c < 0 || r >= h || c >= w) return;
      if (painting === null) painting = state.drawn[r][c] ? 0 : 1;
      state.drawn[r][c] = painting;
      drawTarget();
    };
    cv.addEventListener("mousedown", (ev) => { painting = null; paint(ev); cv.dataset.down = "1"; });
    cv.addEventListener("mousemove", (ev) => { if (cv.dataset.down === "1") paint(ev); });
    window.addEventListener("mouseup", () => {
      if (cv.dataset.down === "1") { cv.dataset.down = "0"; if (state.edit === "relocate") run(); }
    });
    $("draw-clear").addEventListener("click", () => { state.drawn.forEach((row) => row.fill(0)); drawTarget(); });
    drawTarget();
  }

  function drawTarget() {
    const flat = state.drawn.flat();
    drawGrid($("draw"), flat, 0, 1, ramp([[255, 255, 255], [214, 39, 40]]), { log: false, image: true, alpha: 0.55 });
  }

  function wire() {
    document.querySelectorAll('input[name="edit"]').forEach((el) => el.addEventListener("change", () => {
      state.edit = el.value;
      run();
    }));
    $("ablate-mode").addEventListener("change", (e) => { state.mode = e.target.value; if (state.edit === "ablate") run(); });
    $("target").addEventListener("change", (e) => {
      state.target = e.target.value;
      $("draw-box").hidden = state.target !== "draw";
      if (state.edit === "relocate") run();
    });
    $("selcls").addEventListener("change", (e) => { state.selcls = e.target.checked; run(); });
    $("selk").addEventListener("change", (e) => {
      state.k = Math.max(1, parseInt(e.target.value, 10) || 1);
      if (state.selcls) run();
    });
    $("typed-apply").addEventListener("click", () => {
      try { state.typed = parseTyped($("typed").value); } catch (e) { showError(e.message); return; }
      run();
    });
    $("typed").addEventListener("keydown", (e) => { if (e.key === "Enter") $("typed-apply").click(); });
    $("block").addEventListener("input", (e) => {
      state.block = Number(e.target.value);
      $("block-label").textContent = state.block;
      renderMaps();
    });
    $("head").addEventListener("change", (e) => { state.head = e.target.value; renderMaps(); });
    $("threshold").addEventListener("change", (e) => {
      const [lo, hi] = thresholdRange();
      state.threshold = Math.exp(lo + (hi - lo) * Number(e.target.value) / 1000);
      run();
    });
    $("threshold-num").addEventListener("change", (e) => {
      const v = Number(e.target.value);
      if (isFinite(v) && v > 0) { state.threshold = v; run(); }
    });
    $("threshold-reset").addEventListener("click", () => { state.threshold = null; run(); });
    $("reset").addEventListener("click", () => {
      state.selected.clear();
      state.typed = [];
      $("typed").value = "";
      document.querySelectorAll("input.neuron").forEach((el) => { el.checked = false; });
      state.selcls = false;
      $("selcls").checked = false;
      run();
    });
    $("export").addEventListener("click", exportPatch);
  }

  async function exportPatch() {
    try {
      const blob = await (await api("api/export", { interventions: interventions() })).blob();
      const a = document.createElement("a");
      a.href = URL.createObjectURL(blob);
      a.download = "explore-patch.safetensors";
      document.body.appendChild(a);
      a.click();
      a.remove();
      state.exported = (state.exported || 0) + 1;
      $("status").textContent = "exported explore-patch.safetensors";
      showError("");
    } catch (e) {
      showError("export: " + e.message);
    }
  }

  async function start() {
    /* the controls of edits the model does not define: disabled, the reason as their tooltip */
    function disableRefused(refused) {
      const inputs = { register: document.querySelector('input[name="edit"][value="register"]'), selcls: $("selcls"),
        head: $("head") };
      Object.keys(inputs).forEach((key) => {
        if (!refused[key] || !inputs[key]) return;
        inputs[key].disabled = true;
        inputs[key].title = refused[key];
        (inputs[key].closest("label") || inputs[key]).title = refused[key];
      });
    }
    try {
      state.info = await (await api("api/info")).json();
    } catch (e) {
      showError(e.message);
      $("status").textContent = "error";
      return;
    }
    const info = state.info;
    $("model-name").textContent = "- " + info.model + " (" + info.images.length + " images, " + info.n_blocks + " blocks)";
    const notes = [];
    if (info.planted) notes.push(info.planted.note + "; planted neurons " + info.planted.neurons.map((n) => info.planted.layer + ":" + n).join(", "));
    if (info.threshold.note) notes.push(info.threshold.note);
    $("model-note").textContent = notes.join(". ");
    disableRefused(info.refused || {});
    $("threshold-note").textContent = "threshold at block " + info.detect_layer + ": " + info.threshold.label +
      (info.threshold.artifacts_found ? "" : "; no artifacts found");
    $("block").max = String(info.n_blocks - 1);
    state.block = info.detect_layer;
    $("block").value = String(state.block);
    $("block-label").textContent = state.block;
    for (let hh = 0; hh < info.n_heads; hh++) {
      const o = document.createElement("option");
      o.value = String(hh);
      o.textContent = "head " + hh;
      $("head").appendChild(o);
    }
    buildThumbs();
    buildNeurons();
    buildSae();
    buildTargets();
    wire();
    run();
  }
  start();
})();
