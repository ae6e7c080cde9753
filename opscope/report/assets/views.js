// Modules, Memory and Recommendations views; then the page starts (core.js's load handler).
"use strict";
VIEWS.modules = function (section) {
  const mods = DATA.modules;
  if (!mods) {
    section.append(notRecorded("Modules", "Profile with with_modules=True (opscope run --modules) " +
      "to see the nn.Module tree with forward and backward time."));
    return;
  }
  const rows = mods.nodes;   // pre-order, each with depth
  const hasFlops = rows.some(r => r.flops);
  const hasMem = rows.some(r => r.net_mem !== null && r.net_mem !== undefined);
  const open = new Set(rows.map((r, i) => (r.depth < 2 ? i : -1)).filter(i => i >= 0));
  const tbody = el("tbody");
  function visible() {   // rows not under a folded row
    const out = [];
    let foldedAt = Infinity;
    rows.forEach((r, i) => {
      if (r.depth > foldedAt) return;
      foldedAt = Infinity;
      out.push(i);
      if (!r.leaf && !open.has(i)) foldedAt = r.depth;
    });
    return out;
  }
  function draw() {
    tbody.replaceChildren(...visible().map(i => {
      const r = rows[i];
      const mark = r.leaf ? "  " : open.has(i) ? "▾ " : "▸ ";
      return el("tr", { style: `--depth:${r.depth}`, onclick: () => {
        if (r.leaf) return;
        open.has(i) ? open.delete(i) : open.add(i);
        draw();
      } }, el("td", { class: "name", text: mark + r.name, title: r.name }),
        el("td", { text: r.type || "" }), el("td", { text: fmtUs(r.forward_us) }),
        el("td", { text: fmtUs(r.backward_us) }), el("td", { text: fmtUs(r.self_us) }),
        el("td", { text: String(r.calls) }), el("td", { text: r.params ? fmtCount(r.params, "") : "" }),
        ...(hasFlops ? [el("td", { text: r.flops ? fmtCount(r.flops, "FLOP") : "" })] : []),
        ...(hasMem ? [el("td", { text: fmtBytes(r.net_mem) }), el("td", { text: fmtBytes(r.self_net_mem) })] : []));
    }));
  }
  section.append(el("p", { class: "muted",
    text: "Forward and backward time per module (inclusive); click a row to fold it." }),
    el("div", { class: "tablewrap" }, el("table", { class: "grid tree", id: "module-table" },
      el("thead", {}, el("tr", {}, el("th", { class: "name", text: "Module" }), el("th", { text: "Type" }),
        el("th", { text: "Forward" }), el("th", { text: "Backward" }), el("th", { text: "Self" }),
        el("th", { text: "Calls" }), el("th", { text: "Parameters" }),
        hasFlops ? el("th", { text: "FLOPs" }) : null,
        hasMem ? el("th", { text: "Net CPU Mem" }) : null,
        hasMem ? el("th", { text: "Self Net Mem" }) : null)), tbody)));
  if (hasMem) section.append(el("p", { class: "muted", id: "module-memory-note", text: mods.memory_note }));
  if (mods.fused_note) section.append(el("p", { class: "muted", id: "module-fused-note", text: mods.fused_note }));
  draw();
};

VIEWS.memory = function (section) {
  const mem = DATA.memory;
  if (!mem) {
    section.append(notRecorded("Memory", "Profile with profile_memory=True (opscope run --memory) " +
      "to see allocations over time by category and the peak."));
    return;
  }
  const width = Math.max(480, section.clientWidth || 900), height = 300, left = 80, bottom = 30;
  const plotW = width - left - 10, plotH = height - bottom - 10;
  const times = mem.times_us, n = times.length;
  const t0 = n ? times[0] : 0, t1 = n ? Math.max(times[n - 1], t0 + 1e-9) : 1;
  const totals = times.map((_, k) => mem.series.reduce((a, s) => a + s[k], 0));
  const yTicks = axisTicks(Math.max(mem.peak_bytes || 0, ...totals, 1), BYTE_UNITS);
  const xTicks = axisTicks(t1 - t0, TIME_UNITS);
  const top = yTicks[yTicks.length - 1][0], span = xTicks[xTicks.length - 1][0];
  const X = t => left + plotW * (t - t0) / span, Y = b => 10 + plotH - plotH * b / top;
  const root = svg("svg", { width, height, id: "memory-chart" });
  for (const [v, text] of yTicks) {
    const yy = Y(v);
    root.append(svg("line", { x1: left, x2: width - 10, y1: yy, y2: yy, stroke: "#e3e6ec" }));
    const label = svg("text", { x: left - 6, y: yy + 4, "text-anchor": "end", class: "ytick" });
    label.textContent = text;
    root.append(label);
  }
  for (const [v, text] of xTicks) {
    const label = svg("text", { x: X(t0 + v), y: height - bottom + 18, "text-anchor": "middle",
                                class: "xtick" });
    label.textContent = text;
    root.append(label);
  }
  const base = new Array(n).fill(0);
  mem.categories.forEach((cat, c) => {
    const upper = base.map((b, k) => b + mem.series[c][k]);
    if (!upper.some((u, k) => u !== base[k])) return;
    let d = "";
    for (let k = 0; k < n; k++)
      d += (k ? "L" : "M") + X(times[k]).toFixed(1) + "," + Y(upper[k]).toFixed(1);
    for (let k = n - 1; k >= 0; k--) d += "L" + X(times[k]).toFixed(1) + "," + Y(base[k]).toFixed(1);
    const path = svg("path", { d: d + "Z", fill: mem.colors[c], "fill-opacity": 0.85,
                               "data-category": cat });
    path.addEventListener("mousemove", e => showTip(e, cat));
    path.addEventListener("mouseleave", hideTip);
    root.append(path);
    upper.forEach((u, k) => { base[k] = u; });
  });
  if (mem.peak_bytes) {
    const px = X(mem.peak_time_us);
    root.append(svg("line", { x1: px, x2: px, y1: 10, y2: 10 + plotH, stroke: "#d0473b",
                              "stroke-dasharray": "4 3" }));
  }
  section.append(el("div", { class: "cards" },
    el("div", { class: "card", id: "memory-peak" }, el("b", { text: fmtBinary(mem.peak_bytes) }),
       el("span", { text: `peak at ${fmtUs(mem.peak_time_us)}` }))),
    el("div", { class: "legend" }, mem.categories.map((c, k) =>
      el("span", {}, el("i", { style: `background:${mem.colors[k]}` }), c))), root);
  if (mem.note) section.append(el("p", { class: "muted", text: mem.note }));
  section.append(el("ul", { id: "memory-categories" }, mem.categories.map((c, k) =>
    el("li", {}, el("i", { style: `display:inline-block;width:10px;height:10px;margin-right:6px;` +
      `background:${mem.colors[k]}` }), el("b", { text: c }), `: ${mem.meanings[k]}`))));
};

VIEWS.recommendations = function (section) {
  const recs = DATA.recommendations;
  if (!recs.length) {
    section.append(el("p", { id: "no-recommendations",
      text: "No rule fired: nothing stands out in this profile." }));
    return;
  }
  for (const r of recs)
    section.append(el("div", { class: "rec " + r.severity, "data-rule": r.id },
      el("h3", { text: r.title }), el("div", { text: r.advice }),
      el("ul", {}, r.evidence.map(e => el("li", { text: e })))));
};
