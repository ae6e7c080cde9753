// Flame graph: an icicle of export_stacks' paths (root on top); click a frame to zoom.
"use strict";
const FLAME_ROW = 18;

function flattenFlame(flame) {
  const nodes = [];   // {name, total, x, depth, parent, children}
  (function walk(node, x, depth, parent) {
    const index = nodes.length;
    const entry = { name: flame.names[node[0]], total: node[1], x, depth, parent, children: [] };
    nodes.push(entry);
    let cx = x;
    for (const child of node[2]) {
      entry.children.push(walk(child, cx, depth + 1, index));
      cx += child[1];
    }
    entry.self = node[1] - (cx - x);
    return index;
  })(flame.tree, 0, 0, -1);
  return nodes;
}

VIEWS.flame = function (section) {
  const nodes = flattenFlame(DATA.flame);
  const maxDepth = Math.max(...nodes.map(n => n.depth));
  const rootTotal = nodes[0].total;
  const crumbs = el("div", { class: "crumbs", id: "flame-crumbs" });
  const canvas = el("canvas", { id: "flame-canvas" });
  const box = el("div", { class: "canvasbox" }, canvas);
  section.append(el("div", { class: "toolbar" },
    el("span", { class: "muted", text: `Self CPU time by path, as export_stacks writes it ` +
      `(${nodes.length} frames; total ${fmtUs(rootTotal)}; ProfilerStep#N merged into ` +
      `ProfilerStep*). Click a frame to zoom, ` +
      `a frame above it or a crumb to zoom out.` })), crumbs, box);
  const state = { focus: 0, width: 800 };
  const height = (maxDepth + 1) * FLAME_ROW + 2;

  function inFocus(i) {   // the focus node, its ancestors and its descendants
    for (let k = i; k >= 0; k = nodes[k].parent) if (k === state.focus) return true;
    for (let k = state.focus; k >= 0; k = nodes[k].parent) if (k === i) return true;
    return false;
  }
  function geometry(i) {
    const f = nodes[state.focus], n = nodes[i];
    const scale = state.width / Math.max(f.total, 1e-12);
    if (n.depth <= f.depth) return { x: 0, w: state.width, y: n.depth * FLAME_ROW };
    return { x: (n.x - f.x) * scale, w: n.total * scale, y: n.depth * FLAME_ROW };
  }
  function draw() {
    state.width = Math.max(320, box.clientWidth || section.clientWidth || 900);
    const ctx = fitCanvas(canvas, state.width, height);
    ctx.clearRect(0, 0, state.width, height);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    for (let i = 0; i < nodes.length; i++) {
      if (!inFocus(i)) continue;
      const g = geometry(i);
      if (g.w < 0.5 || g.x > state.width || g.x + g.w < 0) continue;
      const n = nodes[i];
      ctx.fillStyle = n.depth < nodes[state.focus].depth ? "#d9dce3" : hashColor(n.name);
      ctx.fillRect(g.x, g.y, Math.max(0.5, g.w - 1), FLAME_ROW - 1);
      if (g.w > 28) {
        ctx.save();
        ctx.beginPath();
        ctx.rect(g.x, g.y, g.w - 3, FLAME_ROW);
        ctx.clip();
        ctx.fillStyle = "#1d2330";
        ctx.fillText(n.name, g.x + 3, g.y + FLAME_ROW / 2);
        ctx.restore();
      }
    }
    const path = [];
    for (let k = state.focus; k >= 0; k = nodes[k].parent) path.unshift(k);
    crumbs.replaceChildren(...path.map(k => el("button", { text: nodes[k].name,
      onclick: () => zoom(k) })));
  }
  function nodeAt(x, y) {
    const depth = Math.floor(y / FLAME_ROW);
    for (let i = 0; i < nodes.length; i++) {
      if (nodes[i].depth !== depth || !inFocus(i)) continue;
      const g = geometry(i);
      if (x >= g.x && x < g.x + g.w) return i;
    }
    return -1;
  }
  function zoom(i) { state.focus = i; draw(); }
  canvas.addEventListener("click", e => { const i = nodeAt(...localPoint(canvas, e)); if (i >= 0) zoom(i); });
  canvas.addEventListener("mousemove", e => {
    const i = nodeAt(...localPoint(canvas, e));
    if (i < 0) { hideTip(); return; }
    const n = nodes[i];
    showTip(e, `${n.name}\ntotal ${fmtUs(n.total)} (${fmtPct(n.total, rootTotal)} of all)` +
      `\nself ${fmtUs(n.self)}`);
  });
  canvas.addEventListener("mouseleave", hideTip);
  window.addEventListener("resize", () => { if (section.classList.contains("active")) draw(); });
  report.flame = {
    nodes, zoom, focusName: () => nodes[state.focus].name,
    // Client-pixel box of the widest visible frame called `name` (for tests and links).
    boxOf(name) {
      let best = -1;
      nodes.forEach((n, i) => {
        if (n.name === name && inFocus(i) && (best < 0 || n.total > nodes[best].total)) best = i;
      });
      if (best < 0) return null;
      const g = geometry(best), r = canvas.getBoundingClientRect();
      return { x: r.left + g.x, y: r.top + g.y, w: g.w, h: FLAME_ROW - 1, index: best };
    },
  };
  draw();
};
