// Timeline: per-thread lanes of nested ranges on a canvas; wheel or +/- to zoom,
// drag or a/d to pan, hover for details.
"use strict";

// A lane's title: the Python thread's name (MainThread) with its id, else the id.
function laneLabel(lane) {
  if (lane.device) return lane.thread;   // a GPU stream's lane: "GPU 0 stream 7"
  return lane.thread ? `${lane.thread} (thread ${lane.tid})` : `thread ${lane.tid}`;
}
const TL_ROW = 16, TL_HEAD = 20, TL_AXIS = 22;

// Zoom (by factor f around pixel px, default the middle) and pan (by dx pixels) of a
// timeline's view [state.t0, state.t1] of a window of windowNs; both redraw via schedule().
function zoomPan(state, windowNs, schedule) {
  const zoomBy = (f, px) => {
    const at = state.t0 + (state.t1 - state.t0) * ((px === undefined ? state.width / 2 : px) / state.width);
    const span = Math.min(Math.max((state.t1 - state.t0) * f, 1000), windowNs * 4 || 1e9);
    state.t0 = at - (at - state.t0) * span / (state.t1 - state.t0);
    state.t1 = state.t0 + span;
    schedule();
  };
  const panBy = dx => {
    const d = (state.t1 - state.t0) * dx / state.width;
    state.t0 += d; state.t1 += d;
    schedule();
  };
  return { zoomBy, panBy };
}

function decodeLanes(tl) {
  return tl.lanes.map(lane => {
    const n = lane.start.length, start = new Float64Array(n);
    let t = 0;
    for (let i = 0; i < n; i++) { t += lane.start[i]; start[i] = t; }
    const byDepth = [];
    for (let i = 0; i < n; i++) (byDepth[lane.depth[i]] = byDepth[lane.depth[i]] || []).push(i);
    return { tid: lane.tid, thread: lane.thread, device: lane.device, events: lane.events, start,
             dur: lane.dur, self: lane.self,
             depth: lane.depth, name: lane.name, byDepth, rows: Math.max(1, byDepth.length) };
  });
}

// First index in `list` (event ids sorted by start) whose event may end after t.
function firstEnding(lane, list, t) {
  let lo = 0, hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (lane.start[list[mid]] < t) lo = mid + 1; else hi = mid;
  }
  return Math.max(0, lo - 1);
}

VIEWS.timeline = function (section) {
  const tl = DATA.timeline, lanes = decodeLanes(tl);
  const info = el("span", { class: "muted", id: "timeline-info" });
  const canvas = el("canvas", { id: "timeline-canvas", tabindex: "0" });
  const scroll = el("div", { class: "timeline-scroll" }, canvas);
  const state = { t0: 0, t1: Math.max(tl.window_ns, 1), width: 900, drag: null, frame: 0 };
  let y = TL_AXIS;
  for (const lane of lanes) { lane.y = y; y += TL_HEAD + lane.rows * TL_ROW + 6; }
  const height = Math.max(y, TL_AXIS + 40);
  const { zoomBy, panBy } = zoomPan(state, tl.window_ns, () => schedule());
  const reset = () => { state.t0 = 0; state.t1 = Math.max(tl.window_ns, 1); schedule(); };
  section.append(el("div", { class: "toolbar" },
    el("button", { text: "+", title: "zoom in (w)", onclick: () => zoomBy(0.5) }),
    el("button", { text: "−", title: "zoom out (s)", onclick: () => zoomBy(2) }),
    el("button", { text: "reset", onclick: reset }),
    info), scroll);
  if (tl.shown < tl.total)
    section.append(el("p", { class: "muted", id: "timeline-decimated", text:
      `Showing the ${tl.shown.toLocaleString()} longest of ${tl.total.toLocaleString()} events ` +
      `(events shorter than ${fmtUs(tl.min_dur_ns / 1000)} are left out to keep the page fast).` }));

  const px = t => (t - state.t0) * state.width / (state.t1 - state.t0);
  function schedule() { if (!state.frame) state.frame = requestAnimationFrame(draw); }
  function draw() {
    state.frame = 0;
    state.width = Math.max(320, scroll.clientWidth || section.clientWidth || 900);
    const ctx = fitCanvas(canvas, state.width, height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    drawAxis(ctx);
    let drawn = 0;
    for (const lane of lanes) {
      ctx.fillStyle = "#f0f2f6";
      ctx.fillRect(0, lane.y, state.width, TL_HEAD - 2);
      ctx.fillStyle = "#1d2330";
      ctx.fillText(`${laneLabel(lane)} · ${lane.events.toLocaleString()} events`, 6, lane.y + TL_HEAD / 2);
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
          if (x1 <= lastPx) continue;   // this pixel column is painted already
          const w = Math.max(x1 - x0, 1);
          const name = tl.names[lane.name[i]];
          ctx.fillStyle = hashColor(name.replace(/#\d+$/, ""));
          ctx.fillRect(x0, top, w, TL_ROW - 1);
          lastPx = x0 + w;
          drawn++;
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
    state.drawn = drawn;
    info.textContent = `${fmtUs(state.t0 / 1000)} – ${fmtUs(state.t1 / 1000)} ` +
      `(${fmtUs((state.t1 - state.t0) / 1000)} wide) · ${lanes.length} thread(s) · ` +
      `${tl.shown.toLocaleString()} of ${tl.total.toLocaleString()} events`;
  }
  function drawAxis(ctx) {
    const span = state.t1 - state.t0, raw = span / 8, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
    ctx.fillStyle = "#667085";
    ctx.strokeStyle = "#e3e6ec";
    for (let t = Math.ceil(state.t0 / step) * step; t <= state.t1; t += step) {
      const x = px(t);
      ctx.beginPath(); ctx.moveTo(x, 0); ctx.lineTo(x, height); ctx.stroke();
      ctx.fillText(fmtUs(t / 1000), x + 3, TL_AXIS / 2);
    }
  }
  function eventAt(x, yy) {
    for (const lane of lanes) {
      const depth = Math.floor((yy - lane.y - TL_HEAD) / TL_ROW);
      if (depth < 0 || depth >= lane.rows || !lane.byDepth[depth]) continue;
      const list = lane.byDepth[depth], t = state.t0 + x * (state.t1 - state.t0) / state.width;
      const slack = 2 * (state.t1 - state.t0) / state.width;   // 2 px for thin events
      let best = -1, bestGap = Infinity;   // the event under the mouse, else the nearest
      for (let k = firstEnding(lane, list, t - slack); k < list.length; k++) {
        const i = list[k], s = lane.start[i], e = s + lane.dur[i];
        if (s > t + slack) break;
        const gap = t < s ? s - t : t > e ? t - e : 0;
        if (gap <= slack && gap < bestGap) { best = i; bestGap = gap; }
      }
      if (best >= 0) return [lane, best];
    }
    return null;
  }
  const local = e => localPoint(canvas, e);
  canvas.addEventListener("wheel", e => {
    e.preventDefault();
    zoomBy(e.deltaY > 0 ? 1.25 : 0.8, local(e)[0]);
  }, { passive: false });
  canvas.addEventListener("mousedown", e => { state.drag = local(e)[0]; });
  window.addEventListener("mouseup", () => { state.drag = null; });
  canvas.addEventListener("mousemove", e => {
    const [x, yy] = local(e);
    if (state.drag !== null) { panBy(state.drag - x); state.drag = x; hideTip(); return; }
    const hit = eventAt(x, yy);
    if (!hit) { hideTip(); return; }
    const [lane, i] = hit;
    showTip(e, `${tl.names[lane.name[i]]}\nstart ${fmtUs(lane.start[i] / 1000)} · duration ` +
      `${fmtUs(lane.dur[i] / 1000)} · self ${fmtUs(lane.self[i] / 1000)}` +
      `\n${laneLabel(lane)} · depth ${lane.depth[i]}`);
  });
  canvas.addEventListener("mouseleave", hideTip);
  canvas.addEventListener("keydown", e => {
    const keys = { w: () => zoomBy(0.8), s: () => zoomBy(1.25), a: () => panBy(-state.width / 10),
                   d: () => panBy(state.width / 10) };
    if (keys[e.key]) { keys[e.key](); e.preventDefault(); }
  });
  window.addEventListener("resize", () => { if (section.classList.contains("active")) schedule(); });
  report.timeline = {
    lanes, view: () => [state.t0, state.t1], zoomBy, panBy, drawn: () => state.drawn,
    setView(t0, t1) { state.t0 = t0; state.t1 = t1; draw(); },
    // Client-pixel box of the first event called `name` (for tests).
    boxOf(name) {
      const id = tl.names.indexOf(name);
      for (const lane of lanes) for (let i = 0; i < lane.name.length; i++) if (lane.name[i] === id) {
        const r = canvas.getBoundingClientRect(), x0 = px(lane.start[i]);
        return { x: r.left + x0, y: r.top + lane.y + TL_HEAD + lane.depth[i] * TL_ROW,
                 w: px(lane.start[i] + lane.dur[i]) - x0, h: TL_ROW - 1 };
      }
      return null;
    },
  };
  draw();
};
