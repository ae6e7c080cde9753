// opscope report: shared helpers, the page header and the tab switcher.
// Everything is built with DOM calls and textContent, never innerHTML, so names
// from the trace cannot inject markup.
"use strict";
const DATA = JSON.parse(document.getElementById("opscope-data").textContent);
const VIEWS = {};   // view name -> render(section), filled by the other scripts
const report = window.opscopeReport = { data: DATA, rendered: {}, errors: [] };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// An SVG element, as el() builds HTML ones.
const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) if (child) node.append(child);
  return node;
}

// Units as torch.profiler's table prints them.
function fmtUs(us) {
  if (us === null || us === undefined || !isFinite(us)) return "";
  const a = Math.abs(us);
  if (a >= 1e6) return (us / 1e6).toFixed(3) + "s";
  if (a >= 1e3) return (us / 1e3).toFixed(3) + "ms";
  return us.toFixed(3) + "us";
}
function fmtPct(part, total) { return total ? (100 * part / total).toFixed(2) + "%" : "NaN"; }
function fmtBytes(b) {
  const units = [["GB", 1024 ** 3], ["MB", 1024 ** 2], ["KB", 1024]];
  for (const [name, size] of units) if (Math.abs(b) >= size) return (b / size).toFixed(2) + " " + name;
  return b + " B";
}
// Axes: round ticks from 0 up to at least max (steps of 1, 2 or 5 times a power of ten),
// all labelled in one unit, the largest the axis reaches (as export_memory_timeline's page).
function roundTicks(max, count = 5) {
  if (!(max > 0)) return [0];
  const raw = max / count, mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw * (1 - 1e-9));
  const ticks = [];
  for (let k = 0; k === 0 || ticks[k - 1] < max * (1 - 1e-9); k++) ticks.push(Number((k * step).toPrecision(12)));
  return ticks;
}
const BYTE_UNITS = [["GiB", 1024 ** 3], ["MiB", 1024 ** 2], ["KiB", 1024], ["B", 1]];
const TIME_UNITS = [["s", 1e6], ["ms", 1e3], ["us", 1]];
// [[value in base units, label], ...] for an axis up to max (bytes, or us for time)
function axisTicks(max, units, count = 5) {
  const [name, size] = units.find(([, s]) => max >= s) || units[units.length - 1];
  return roundTicks(max / size, count).map(v => [v * size, `${v} ${name}`]);
}
function fmtBinary(b) {
  const [name, size] = BYTE_UNITS.find(([, s]) => Math.abs(b) >= s) || BYTE_UNITS[3];
  return size === 1 ? `${b} B` : `${(b / size).toFixed(2)} ${name}`;
}
function fmtCount(x, unit) {
  const prefixes = ["", "K", "M", "G", "T", "P"];
  let k = 0;
  while (Math.abs(x) >= 1000 && k < prefixes.length - 1) { x /= 1000; k++; }
  return (k ? x.toFixed(2) : String(Math.round(x))) + " " + prefixes[k] + unit;
}

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948",
                 "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac", "#2f4b7c", "#a05195"];
const CATEGORY_COLORS = {
  "matmul/conv": "#4e79a7", "copy/cast": "#e15759", "allocation": "#bab0ac",
  "view/reshape": "#d4a6c8", "norm/reduce": "#499894", "elementwise": "#59a14f",
  "other ops": "#9c755f", "backward": "#f28e2b", "optimizer": "#edc948",
  "data loading": "#b07aa1", "communication": "#ff9da7", "Python/other": "#a0cbe8", "idle": "#e8e8e8",
  "autograd engine": "#ffbe7d",
};
function hashColor(name) {
  let h = 0;
  for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) | 0;
  const hue = Math.abs(h) % 360;
  return `hsl(${hue}, 55%, ${62 + (Math.abs(h >> 8) % 14)}%)`;
}

const tooltip = document.getElementById("tooltip");
function showTip(event, text) {
  tooltip.textContent = text;
  tooltip.hidden = false;
  const x = Math.min(event.clientX + 14, window.innerWidth - tooltip.offsetWidth - 6);
  const y = Math.min(event.clientY + 14, window.innerHeight - tooltip.offsetHeight - 6);
  tooltip.style.left = Math.max(0, x) + "px";
  tooltip.style.top = Math.max(0, y) + "px";
}
function hideTip() { tooltip.hidden = true; }

function notRecorded(what, how) {
  return el("div", { class: "notrecorded" }, el("b", { text: what + ": not recorded" }),
            el("div", { text: how }));
}

// Mouse position in CSS pixels relative to `node`'s top-left corner.
function localPoint(node, event) {
  const r = node.getBoundingClientRect();
  return [event.clientX - r.left, event.clientY - r.top];
}

// A canvas sized for the device pixel ratio; returns its 2d context scaled to CSS pixels.
function fitCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  canvas.width = Math.max(1, Math.round(width * ratio));
  canvas.height = Math.max(1, Math.round(height * ratio));
  canvas.style.width = width + "px";
  canvas.style.height = height + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  return ctx;
}

// Round values from t0 to t1, about `count` of them (steps of 1, 2 or 5 times a power of ten).
function niceTicks(t0, t1, count) {
  const span = t1 - t0;
  if (!(span > 0)) return [t0];
  const raw = span / count, p = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1 + step * 1e-9; t += step) out.push(t);
  return out;
}

// Touches a view gets after it is drawn, by view name (views.js's charts, drawn elsewhere).
const AFTER_VIEW = {};

// The memory chart's x axis: time labels (the trace's clock, as the peak card says),
// in the chart's plot box (views.js: 80 px left, 10 px right, 30 px below, 10 px above).
AFTER_VIEW.memory = function (section) {
  const chart = section.querySelector("#memory-chart"), mem = DATA.memory;
  if (!chart || !mem || !mem.times_us.length) return;
  const width = Number(chart.getAttribute("width")), height = Number(chart.getAttribute("height"));
  const left = 80, right = width - 10, bottom = height - 30, times = mem.times_us;
  const t0 = times[0], t1 = Math.max(times[times.length - 1], t0 + 1e-9);
  const axis = svg("g", { id: "memory-x-axis" });
  axis.append(svg("line", { x1: left, x2: right, y1: bottom, y2: bottom, stroke: "#8b93a5" }));
  for (const t of niceTicks(t0, t1, Math.max(2, Math.floor((right - left) / 110)))) {
    const x = left + (right - left) * (t - t0) / (t1 - t0);
    axis.append(svg("line", { x1: x, x2: x, y1: bottom, y2: bottom + 4, stroke: "#8b93a5" }));
    const label = svg("text", { x, y: bottom + 16, "text-anchor": "middle", class: "time-tick" });
    label.textContent = fmtUs(t);
    axis.append(label);
  }
  chart.append(axis);
};

function showView(name) {
  if (!VIEWS[name]) name = "overview";
  for (const button of document.querySelectorAll("#tabs button"))
    button.classList.toggle("active", button.dataset.view === name);
  for (const section of document.querySelectorAll(".view"))
    section.classList.toggle("active", section.id === "view-" + name);
  const section = document.getElementById("view-" + name);
  if (!report.rendered[name]) {
    report.rendered[name] = true;
    VIEWS[name](section);
    if (AFTER_VIEW[name]) AFTER_VIEW[name](section);
  }
  report.current = name;
  if (location.hash !== "#" + name) history.replaceState(null, "", "#" + name);
}
report.show = showView;

function renderHeader() {
  const m = DATA.meta;
  document.getElementById("title").textContent = m.title;
  const on = Object.entries(m.options).filter(([, v]) => v).map(([k]) => k);
  document.getElementById("meta").textContent =
    `${m.events.toLocaleString()} events on ${m.threads} thread(s) · window ${fmtUs(m.window_us)}` +
    ` · collector ${m.collector} · pid ${m.process_id}` +
    (m.started ? ` · recorded ${m.started}` : "") +
    ` · options: ${on.length ? on.join(", ") : "none"} · opscope ${m.version}`;
  for (const button of document.querySelectorAll("#tabs button"))
    button.addEventListener("click", () => showView(button.dataset.view));
}

window.addEventListener("load", () => {
  renderHeader();
  showView((location.hash || "#overview").slice(1));
  report.ready = true;
});
window.addEventListener("hashchange", () => showView(location.hash.slice(1)));
