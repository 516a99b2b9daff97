// interp explore: drawing helpers (colour ramps, patch-grid maps on a canvas, the per-block curves in SVG).
// No state of their own: app.js passes everything in.
"use strict";
window.interpDraw = (function () {
  function ramp(stops) {
    return (t) => {
      t = Math.min(1, Math.max(0, t));
      const x = t * (stops.length - 1), i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
      const a = stops[i], b = stops[i + 1];
      return [0, 1, 2].map((c) => Math.round(a[c] + (b[c] - a[c]) * f));
    };
  }
  const viridis = ramp([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]]);
  const magma = ramp([[0, 0, 4], [81, 18, 124], [183, 55, 121], [252, 137, 97], [252, 253, 191]]);


  // values: flat [h*w] on grid [h, w]; lo..hi on a log scale when opts.log; opts.outline: flat 0/1 or null;
  // opts.image: an <img> drawn under the cells (opts.alpha: their opacity)
  function drawGrid(canvas, grid, values, lo, hi, cmap, opts) {
    const [h, w] = grid;
    if (values.length !== h * w) {  // a map drawn on another block's grid (a pyramid's stages differ) is a bug
      throw new Error("a map of " + values.length + " values drawn on a " + h + " x " + w + " grid");
    }
    const ctx = canvas.getContext("2d");
    const cw = canvas.width / w, ch = canvas.height / h;
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    const img = opts.image || null;
    if (img && img.complete) ctx.drawImage(img, 0, 0, canvas.width, canvas.height);
    ctx.globalAlpha = img ? opts.alpha : 1;
    for (let r = 0; r < h; r++) {
      for (let c = 0; c < w; c++) {
        const v = values[r * w + c];
        let t = opts.log ? (Math.log(Math.max(v, 1e-12)) - Math.log(lo)) / (Math.log(hi) - Math.log(lo) || 1)
                         : (v - lo) / ((hi - lo) || 1);
        const [R, G, B] = cmap(t);
        ctx.fillStyle = "rgb(" + R + "," + G + "," + B + ")";
        ctx.fillRect(c * cw, r * ch, Math.ceil(cw), Math.ceil(ch));
      }
    }
    ctx.globalAlpha = 1;
    if (opts.outline) {
      ctx.strokeStyle = "#ff2020";
      ctx.lineWidth = 2;
      for (let i = 0; i < opts.outline.length; i++) {
        if (opts.outline[i]) ctx.strokeRect((i % w) * cw + 1, Math.floor(i / w) * ch + 1, cw - 2, ch - 2);
      }
    }
  }

  // per block max and median (resid_mid, then resid_post of each block): current solid, unedited dashed, log y;
  // a legend on top names the lines and the grey band (the block the maps show)
  function curves(svg, current, baseline, L, block) {
    const W = svg.width.baseVal.value, H = svg.height.baseVal.value, pad = { l: 62, r: 10, t: 34, b: 30 };
    const series = (curves, key) => {
      const out = [];
      for (let l = 0; l < L; l++) out.push(curves.resid_mid[key][l], curves.resid_post[key][l]);
      return out;
    };
    const MAX = "#e6550d", MEDIAN = "#3182bd";
    const lines = [
      [series(current, "max"), MAX, ""], [series(current, "median"), MEDIAN, ""],
      [series(baseline, "max"), MAX, "5,4"], [series(baseline, "median"), MEDIAN, "5,4"],
    ];
    const vals = lines.flatMap((s) => s[0]).filter((v) => v > 0);
    const lo = Math.log(Math.min.apply(null, vals)), hi = Math.log(Math.max.apply(null, vals));
    const x = (i) => pad.l + (i / Math.max(1, 2 * L - 1)) * (W - pad.l - pad.r);
    const y = (v) => H - pad.b - ((Math.log(Math.max(v, 1e-12)) - lo) / ((hi - lo) || 1)) * (H - pad.t - pad.b);
    const text = (tx, ty, label, extra) => '<text x="' + tx + '" y="' + ty + '"' + (extra || "") + ">" + label + "</text>";
    const seg = (x0, y0, colour, dash) => '<path d="M' + x0 + "," + y0 + "L" + (x0 + 22) + "," + y0 +
      '" stroke="' + colour + '" stroke-width="2" stroke-dasharray="' + dash + '"/>';
    let s = "";
    const bx = (x(2 * block) + x(2 * block + 1)) / 2;
    s += '<rect class="band" x="' + (bx - 12) + '" y="' + pad.t + '" width="24" height="' + (H - pad.t - pad.b) + '" fill="#eee"/>';
    lines.forEach(([pts, colour, dash]) => {
      const d = pts.map((v, i) => (i ? "L" : "M") + x(i).toFixed(1) + "," + y(v).toFixed(1)).join("");
      s += '<path d="' + d + '" fill="none" stroke="' + colour + '" stroke-width="2" stroke-dasharray="' + dash + '"/>';
    });
    for (let l = 0; l < L; l++) s += text((x(2 * l) + x(2 * l + 1)) / 2 - 4, H - 12, l);
    s += text(pad.l, H - 1, "block (each: after attention, after MLP)");
    const ticks = new Set();  // a narrow range gives equal labels: each once
    [lo, (lo + hi) / 2, hi].forEach((v) => {
      const label = fmt(Math.exp(v));
      if (!ticks.has(label)) s += text(pad.l - 40, y(Math.exp(v)) + 4, label);
      ticks.add(label);
    });
    const cy = (pad.t + H - pad.b) / 2;
    s += text(12, cy, "patch norm (log scale)", ' class="axis-title" text-anchor="middle" transform="rotate(-90 12 ' + cy + ')"');
    // legend: colour = statistic, stroke = run, grey band = the block the maps show
    let lx = pad.l;
    [[MAX, "", "max"], [MEDIAN, "", "median"], ["#444", "", "current run"], ["#444", "5,4", "unedited"]].forEach(
      ([colour, dash, label]) => { s += seg(lx, 12, colour, dash) + text(lx + 26, 16, label); lx += 36 + 7 * label.length; });
    s += '<rect x="' + lx + '" y="5" width="14" height="14" fill="#eee" stroke="#ccc"/>' +
      text(lx + 18, 16, "block " + block + " (shown in the maps above)", ' class="band-label"');
    svg.innerHTML = s;
  }

  // the prefix tokens at block b in words: their norms, and where the CLS token's attention goes
  function prefixSentence(r, b) {
    const labels = r.prefix_labels, norms = r.prefix_norms[b];
    if (!labels.length) return "No prefix tokens: this model has neither a CLS nor a register token.";
    let text = "Prefix tokens at block " + b + ": norm " +
      labels.map((name, i) => name + " " + fmt(norms[i])).join(", ") + ".";
    if (r.cls_attention_prefix) {
      const rows = r.cls_attention_prefix[b];  // [heads][prefix]: the CLS query's attention weights
      const share = labels.map((_, i) => rows.reduce((a, hrow) => a + hrow[i], 0) / rows.length);
      const to = (v, who, verb) => percent(v) + verb + who + (v < 1e-4 ? " (negligible)" : "");
      const parts = labels.map((name, i) => to(share[i], name === "CLS" ? "itself" : name, i ? " to " : " goes to "));
      parts.push(to(Math.max(0, 1 - share.reduce((a, v) => a + v, 0)), "the patch tokens", " to "));
      text += " Of the CLS token's attention (mean over heads), " + parts.slice(0, -1).join(", ") + " and " +
        parts[parts.length - 1] + ".";
    }
    return text;
  }

  // a share 0..1 as a percentage with sensible digits (below 0.01 %: "< 0.01 %")
  function percent(v) {
    if (v < 1e-4) return "< 0.01 %";
    return (v < 0.01 ? (100 * v).toPrecision(2) : v < 0.999 ? (100 * v).toFixed(1) : "100") + " %";
  }

  // activation maps: white (lowest) to dark red (highest)
  const activationRamp = ramp([[255, 255, 255], [252, 187, 161], [239, 59, 44], [103, 0, 13]]);

  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return String(v);
    return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(3);
  }
  return { ramp: ramp, viridis: viridis, magma: magma, activationRamp: activationRamp, drawGrid: drawGrid,
    curves: curves, prefixSentence: prefixSentence, percent: percent, fmt: fmt };
})();
