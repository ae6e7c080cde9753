// The Ranks view's timeline: one lane group per rank (its threads' lanes, as the Timeline
// view draws them, from timeline.js's decodeLanes), every rank on the job's aligned clock.
// Wheel or +/- to zoom, drag to pan, hover for details.
"use strict";
const RT_GROUP = 22;

// "2 ranks" or "2 ranks, 4 windows": a rank profiled in several windows has a group for each
function rankCount(tl) {
  const ranks = tl.ranks ?? tl.groups.length, windows = tl.groups.length;
  return `${ranks} rank${ranks === 1 ? "" : "s"}` +
    (windows > ranks ? `, ${windows} windows` : "");
}

function rankTimeline(box, tl) {
  const groups = tl.groups.map(g => {
    const lanes = decodeLanes(g);
    for (const lane of lanes) for (let i = 0; i < lane.start.length; i++) lane.start[i] += g.offset_ns;
    return { rank: g.rank, file: g.file, total: g.total, lanes };
  });
  let y = TL_AXIS;
  for (const g of groups) {
    g.y = y;
    y += RT_GROUP;
    for (const lane of g.lanes) { lane.y = y; y += TL_HEAD + lane.rows * TL_ROW + 6; }
  }
  const height = Math.max(y, TL_AXIS + 40);
  const canvas = el("canvas", { id: "ranks-timeline-canvas", tabindex: "0" });
  const scroll = el("div", { class: "timeline-scroll" }, canvas);
  const info = el("span", { class: "muted" });
  const state = { t0: 0, t1: Math.max(tl.window_ns, 1), width: 900, drag: null, frame: 0, drawn: 0 };
  const { zoomBy, panBy } = zoomPan(state, tl.window_ns, () => schedule());
  box.append(el("div", { class: "toolbar" },
    el("button", { text: "+", onclick: () => zoomBy(0.5) }),
    el("button", { text: "−", onclick: () => zoomBy(2) }),
    el("button", { text: "reset", onclick: () => { state.t0 = 0; state.t1 = Math.max(tl.window_ns, 1); schedule(); } }),
    info), scroll);
  if (tl.shown < tl.total)
    box.append(el("p", { class: "muted", text: `Showing the ${tl.shown.toLocaleString()} longest ` +
      `of ${tl.total.toLocaleString()} events (each window keeps its longest events, up to ` +
      `${Math.floor(tl.cap / Math.max(1, groups.length)).toLocaleString()}).` }));

  const px = t => (t - state.t0) * state.width / (state.t1 - state.t0);
  function schedule() { if (!state.frame) state.frame = requestAnimationFrame(draw); }
  function drawLane(ctx, lane) {
    lane.byDepth.forEach((list, depth) => {
      if (!list) return;
      const top = lane.y + TL_HEAD + depth * TL_ROW;
      let lastPx = -1;
      for (let k = firstEnding(lane, list, state.t0); k < list.length; k++) {
        const i = list[k], s = lane.start[i];
        if (s > state.t1) break;
        const e = s + lane.dur[i];
        if (e < state.t0) continue;
        const x0 = Math.max(px(s), 0), x1 = Math.min(px(e), state.width);
        if (x1 <= lastPx) continue;
        const w = Math.max(x1 - x0, 1), name = tl.names[lane.name[i]];
        ctx.fillStyle = hashColor(name.replace(/#\d+$/, ""));
        ctx.fillRect(x0, top, w, TL_ROW - 1);
        lastPx = x0 + w;
        state.drawn++;
        if (w > 30) {
          ctx.save();
          ctx.beginPath(); ctx.rect(x0, top, w - 2, TL_ROW); ctx.clip();
          ctx.fillStyle = "#1d2330";
          ctx.fillText(name, x0 + 2, top + TL_ROW / 2);
          ctx.restore();
        }
      }
    });
  }
  function draw() {
    state.frame = 0;
    state.drawn = 0;
    state.width = Math.max(320, scroll.clientWidth || box.clientWidth || 900);
    const ctx = fitCanvas(canvas, state.width, height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    const span = state.t1 - state.t0, raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
    ctx.fillStyle = "#667085";
    ctx.strokeStyle = "#e3e6ec";
    for (let t = Math.ceil(state.t0 / step) * step; t <= state.t1; t += step) {
      ctx.beginPath(); ctx.moveTo(px(t), 0); ctx.lineTo(px(t), height); ctx.stroke();
      ctx.fillText(fmtUs(t / 1000), px(t) + 3, TL_AXIS / 2);
    }
    for (const g of groups) {
      ctx.fillStyle = "#d9e1f5";
      ctx.fillRect(0, g.y, state.width, RT_GROUP - 2);
      ctx.fillStyle = "#1d2330";
      ctx.fillText(`rank ${g.rank} · ${g.file} · ${g.total.toLocaleString()} events`, 6, g.y + RT_GROUP / 2);
      for (const lane of g.lanes) {
        ctx.fillStyle = "#f0f2f6";
        ctx.fillRect(0, lane.y, state.width, TL_HEAD - 2);
        ctx.fillStyle = "#1d2330";
        ctx.fillText(`rank ${g.rank} · ${laneLabel(lane)} · ${lane.events.toLocaleString()} events`,
                     16, lane.y + TL_HEAD / 2);
        drawLane(ctx, lane);
      }
    }
    info.textContent = `${fmtUs(state.t0 / 1000)} – ${fmtUs(state.t1 / 1000)} · ${rankCount(tl)} · ` +
      `${tl.shown.toLocaleString()} of ${tl.total.toLocaleString()} events`;
  }
  function eventAt(x, yy) {
    const t = state.t0 + x * (state.t1 - state.t0) / state.width;
    const slack = 2 * (state.t1 - state.t0) / state.width;
    for (const g of groups) for (const lane of g.lanes) {
      const depth = Math.floor((yy - lane.y - TL_HEAD) / TL_ROW);
      if (depth < 0 || depth >= lane.rows || !lane.byDepth[depth]) continue;
      const list = lane.byDepth[depth];
      for (let k = firstEnding(lane, list, t - slack); k < list.length; k++) {
        const i = list[k], s = lane.start[i];
        if (s > t + slack) break;
        if (t <= s + lane.dur[i] + slack) return [g, lane, i];
      }
    }
    return null;
  }
  canvas.addEventListener("wheel", e => {
    e.preventDefault();
    zoomBy(e.deltaY > 0 ? 1.25 : 0.8, localPoint(canvas, e)[0]);
  }, { passive: false });
  canvas.addEventListener("mousedown", e => { state.drag = localPoint(canvas, e)[0]; });
  window.addEventListener("mouseup", () => { state.drag = null; });
  canvas.addEventListener("mousemove", e => {
    const [x, yy] = localPoint(canvas, e);
    if (state.drag !== null) { panBy(state.drag - x); state.drag = x; hideTip(); return; }
    const hit = eventAt(x, yy);
    if (!hit) { hideTip(); return; }
    const [g, lane, i] = hit;
    showTip(e, `${tl.names[lane.name[i]]}\nrank ${g.rank} · ${laneLabel(lane)}\nstart ` +
      `${fmtUs(lane.start[i] / 1000)} · duration ${fmtUs(lane.dur[i] / 1000)}`);
  });
  canvas.addEventListener("mouseleave", hideTip);
  window.addEventListener("resize", () => { if (box.isConnected) schedule(); });
  report.ranksTimeline = { groups, drawn: () => state.drawn, view: () => [state.t0, state.t1], zoomBy };
  draw();
}
