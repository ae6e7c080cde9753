// Flame graph: an icicle of export_stacks' paths (root on top); click a frame to zoom.
// torch's plumbing frames (flame.plumbing) are folded by default; a checkbox shows them.
"use strict";
const FLAME_ROW = 18;

// The tree without the plumbing frames: their children join their parent, merged by name.
function foldFlame(flame) {
  const skip = new Set(flame.plumbing || []);
  function kids(children) {
    const out = new Map();
    (function add(list) {
      for (const c of list) {
        if (skip.has(c[0])) { add(c[2]); continue; }
        const have = out.get(c[0]);
        if (have) { have[1] += c[1]; have[2] = have[2].concat(c[2]); }
        else out.set(c[0], [c[0], c[1], c[2]]);
      }
    })(children);
    return [...out.values()].map(c => [c[0], c[1], kids(c[2])]).sort((a, b) => b[1] - a[1]);
  }
  return skip.size ? [flame.tree[0], flame.tree[1], kids(flame.tree[2])] : flame.tree;
}

function flattenFlame(names, tree) {
  const nodes = [];   // {name, total, x, depth, parent, children}
  (function walk(node, x, depth, parent) {
    const index = nodes.length;
    const entry = { name: names[node[0]], total: node[1], x, depth, parent, children: [] };
    nodes.push(entry);
    let cx = x;
    for (const child of node[2]) {
      entry.children.push(walk(child, cx, depth + 1, index));
      cx += child[1];
    }
    entry.self = node[1] - (cx - x);
    return index;
  })(tree, 0, 0, -1);
  return nodes;
}

VIEWS.flame = function (section) {
  const flame = DATA.flame, folded = foldFlame(flame);
  let nodes = flattenFlame(flame.names, folded), height = 0;
  const rootTotal = nodes[0].total;
  const toggle = el("input", { type: "checkbox", id: "flame-torch-frames", onchange: () => {
    nodes = flattenFlame(flame.names, toggle.checked ? flame.tree : folded);
    report.flame.nodes = nodes;
    zoom(0);
  } });
  const crumbs = el("div", { class: "crumbs", id: "flame-crumbs" });
  const canvas = el("canvas", { id: "flame-canvas" });
  const box = el("div", { class: "canvasbox" }, canvas);
  section.append(el("div", { class: "toolbar" },
    el("span", { class: "muted", text: `Self CPU time by path, as export_stacks writes it ` +
      `(${nodes.length} frames; total ${fmtUs(rootTotal)}; ProfilerStep#N merged into ` +
      `ProfilerStep*). Click a frame to zoom, ` +
      `a frame above it or a crumb to zoom out.` }),
    (flame.plumbing || []).length ? el("label", {}, toggle, " show torch's frames (module " +
      "_call_impl, ...)") : null), crumbs, box);
  const state = { focus: 0, width: 800 };

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
    height = (Math.max(...nodes.map(n => n.depth)) + 1) * FLAME_ROW + 2;
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
    nodes, zoom, folded: () => !toggle.checked, focusName: () => nodes[state.focus].name,
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
