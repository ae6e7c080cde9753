// Overview: summary cards, step-time breakdown chart, spread, top ops and modules.
"use strict";

function stepChart(ov, width) {
  const steps = ov.steps, cats = ov.categories, height = 240, left = 70, bottom = 34;
  const plotW = width - left - 10, plotH = height - bottom - 10;
  const ticks = axisTicks(Math.max(...steps.map(s => s.dur_us), 1e-3), TIME_UNITS, 4);
  const maxDur = ticks[ticks.length - 1][0];
  const barW = plotW / steps.length;
  const root = svg("svg", { width, height, id: "step-chart", role: "img" });
  for (const [v, text] of ticks) {
    const y = 10 + plotH - plotH * v / maxDur;
    root.append(svg("line", { x1: left, x2: width - 10, y1: y, y2: y, stroke: "#e3e6ec" }));
    const label = svg("text", { x: left - 6, y: y + 4, "text-anchor": "end", class: "ytick" });
    label.textContent = text;
    root.append(label);
  }
  const every = Math.ceil(steps.length / 12);
  steps.forEach((step, i) => {
    const g = svg("g", { class: "step-bar", "data-step": step.name });
    let y = 10 + plotH;
    cats.forEach((cat, k) => {
      const h = plotH * step.parts[k] / maxDur;
      if (h <= 0) return;
      y -= h;
      const rect = svg("rect", { x: left + i * barW + barW * 0.1, y, height: h,
                                 width: Math.max(1, barW * 0.8), fill: CATEGORY_COLORS[cat] || "#999" });
      rect.addEventListener("mousemove", e => showTip(e,
        `${step.name}\n${cat}: ${fmtUs(step.parts[k])} (${fmtPct(step.parts[k], step.dur_us)})` +
        `\nstep: ${fmtUs(step.dur_us)}`));
      rect.addEventListener("mouseleave", hideTip);
      g.append(rect);
    });
    if (i % every === 0) {
      const label = svg("text", { x: left + (i + 0.5) * barW, y: height - bottom + 16,
                                  "text-anchor": "middle" });
      label.textContent = step.name.replace("ProfilerStep", "").replace("step ", "#");
      g.append(label);
    }
    root.append(g);
  });
  return root;
}

function categoryTable(ov) {
  const total = ov.totals.reduce((a, b) => a + b, 0);
  const rows = ov.categories.map((c, k) => [c, ov.totals[k]]).filter(r => r[1] > 0)
    .sort((a, b) => b[1] - a[1]);
  const perStep = Math.max(1, ov.spread.count || 1);
  const swatch = c => el("i", { style: `display:inline-block;width:10px;height:10px;` +
    `margin-right:6px;background:${CATEGORY_COLORS[c] || "#999"}` });
  const bwd = ov.backward;
  const bwdRows = c => c !== "backward" || !bwd ? [] : bwd.parts.map((p, k) => [p, bwd.totals[k]])
    .filter(r => r[1] > 0).sort((a, b) => b[1] - a[1]).map(([p, t]) =>
      el("tr", { class: "sub", "data-backward-part": p, "data-us": String(t) },
        el("td", { class: "name" }, swatch(p), p), el("td", { text: fmtUs(t / perStep) }),
        el("td", { text: fmtPct(t, total) })));
  return el("table", { class: "grid", id: "category-table" },
    el("thead", {}, el("tr", {}, el("th", { class: "name", text: "Category" }),
      el("th", { text: "Time per step" }), el("th", { text: "Share" }))),
    el("tbody", {}, rows.flatMap(([c, t]) => [el("tr", { "data-category": c, "data-us": String(t) },
      el("td", { class: "name" }, swatch(c), c),
      el("td", { text: fmtUs(t / perStep) }), el("td", { text: fmtPct(t, total) })), ...bwdRows(c)])));
}

const STEP_SOURCES = { "ProfilerStep": "steps (ProfilerStep#N)",
                       "optimizer.step": "steps (one per optimizer.step())" };

function topTable(id, rows, columns) {
  return el("table", { class: "grid", id },
    el("thead", {}, el("tr", {}, columns.map(([title], k) =>
      el("th", { class: k ? null : "name", text: title })))),
    el("tbody", {}, rows.map(r => el("tr", {}, columns.map(([, get], k) =>
      el("td", { class: k ? null : "name", text: get(r), title: k ? null : get(r) }))))));
}

VIEWS.overview = function (section) {
  const ov = DATA.overview, sp = ov.spread;
  if (!ov.steps.length) { section.append(el("p", { text: "No events were recorded." })); return; }
  section.append(el("div", { class: "cards" },
    el("div", { class: "card" }, el("b", { text: String(sp.count) }),
       el("span", { text: STEP_SOURCES[ov.step_source] || "no steps: whole session" })),
    el("div", { class: "card" }, el("b", { text: fmtUs(sp.median) }), el("span", { text: "median step" })),
    el("div", { class: "card" }, el("b", { text: fmtUs(sp.mean) }), el("span", { text: "mean step" })),
    el("div", { class: "card" }, el("b", { text: `${fmtUs(sp.min)} – ${fmtUs(sp.max)}` }),
       el("span", { text: "fastest – slowest" })),
    el("div", { class: "card" }, el("b", { text: fmtUs(sp.std) }), el("span", { text: "std deviation" })),
    el("div", { class: "card" }, el("b", { text: fmtUs(sp.p90) }), el("span", { text: "p90 step" })),
    // CPU and GPU apart: the device's busy time (see the GPU view) beside the host's steps
    DATA.kernels ? el("div", { class: "card", id: "gpu-busy-card" },
      el("b", { text: fmtPct(DATA.kernels.busy_us, DATA.kernels.window_us) }),
      el("span", { text: `GPU busy (${fmtUs(DATA.kernels.busy_us)} of ${fmtUs(DATA.kernels.window_us)})` }))
      : null));
  if (!ov.has_steps) section.append(el("p", { class: "muted", id: "no-steps", text: "No ProfilerStep#N " +
    "ranges and no optimizer.step() were recorded, so the whole session is one step. Profile with a " +
    "schedule and call prof.step() once per iteration to get per-step times." }));
  if (ov.step_source === "optimizer.step") section.append(el("p", { class: "muted", id: "step-note",
    text: "No ProfilerStep#N ranges: a step ends where each optimizer.step() ends. The first step " +
      "starts at the first recorded event, so it also holds any setup before the loop; time after " +
      "the last optimizer.step() is in no step." }));
  section.append(el("h2", { text: "Step time, broken down" }));
  if (ov.steps_shown < sp.count)
    section.append(el("p", { class: "muted",
      text: `${ov.steps_shown} of ${sp.count} steps drawn (evenly sampled).` }));
  section.append(el("div", { class: "legend" }, ov.categories.filter((c, k) => ov.totals[k] > 0)
    .map(c => el("span", {}, el("i", { style: `background:${CATEGORY_COLORS[c]}` }), c))));
  const width = Math.max(480, section.clientWidth || 900);
  section.append(stepChart(ov, width));
  section.append(el("p", { class: "muted", text: "Each event's self time counts once: ops by the kind of " +
    "their outermost op, unless inside the optimizer, backward or data loading; communication is " +
    "time in collectives (c10d:: ops, gloo:/nccl: ranges) and the step's idle time while one was " +
    "in flight on another thread (waiting for it, or for the other ranks); idle is the rest of " +
    "the step range's own time (nothing recorded ran on its thread); Python/other is time in user ranges " +
    "and Python frames outside ops. Backward is split again by the kind of op inside it " +
    "(indented rows); autograd engine is backward time outside any op." }));
  section.append(categoryTable(ov));
  section.append(el("h2", { text: "Top 10 operators by self time" }));
  const self = DATA.operators.self_total_us;
  section.append(topTable("top-ops", DATA.overview.top_ops, [
    ["Name", r => r.communication ? `${r.name} (communication)` : r.name],
    ["Self CPU", r => fmtUs(r.self_us)],
    ["Self CPU %", r => fmtPct(r.self_us, self)], ["# of Calls", r => String(r.calls)]]));
  section.append(el("h2", { text: "Top 10 modules" }));
  if (!DATA.modules) section.append(notRecorded("Modules", "Profile with with_modules=True."));
  else section.append(topTable("top-modules", DATA.modules.top, [
    ["Module", r => r.name], ["Self (fwd+bwd)", r => fmtUs(r.self_us)],
    ["Forward", r => fmtUs(r.forward_us)], ["Backward", r => fmtUs(r.backward_us)],
    ["Calls", r => String(r.calls)]]));
};
