// Operators: key_averages() rows (sorted by self time by default), sortable and searchable,
// with a drill-down per op.
"use strict";
const OP_RENDER_LIMIT = 3000;

function operatorColumns(ops) {
  const self = ops.self_total_us;
  const cols = [
    { key: "name", title: "Name", cls: "name", value: r => r.name, text: r => r.name },
    { key: "self_pct", title: "Self CPU %", value: r => r.self_us, text: r => fmtPct(r.self_us, self) },
    { key: "self_us", title: "Self CPU", value: r => r.self_us, text: r => fmtUs(r.self_us) },
    { key: "total_pct", title: "CPU total %", value: r => r.total_us, text: r => fmtPct(r.total_us, self) },
    { key: "total_us", title: "CPU total", value: r => r.total_us, text: r => fmtUs(r.total_us) },
    { key: "avg_us", title: "CPU time avg", value: r => r.total_us / Math.max(1, r.calls),
      text: r => fmtUs(r.total_us / Math.max(1, r.calls)) },
    { key: "calls", title: "# of Calls", value: r => r.calls, text: r => String(r.calls) },
  ];
  if (ops.has_shapes) cols.push({ key: "shapes", title: "Input shapes (most calls)", cls: "shapes",
    value: r => r.shapes && r.shapes.length ? r.shapes[0][0] : "",
    text: r => !(r.shapes && r.shapes.length) ? "" :
      r.shapes[0][0] + (r.shapes.length > 1 ? ` (+${r.shapes.length - 1})` : "") });
  if (ops.has_flops) {
    cols.push({ key: "flops", title: "FLOPs", value: r => r.flops,
      text: r => r.flops ? fmtCount(r.flops, "FLOP") : "" });
    cols.push({ key: "flop_rate", title: "FLOP/s", value: r => r.total_us ? r.flops / r.total_us : 0,
      text: r => r.flops && r.total_us ? fmtCount(r.flops / (r.total_us * 1e-6), "FLOP/s") : "" });
  }
  if (ops.has_memory) {
    cols.push({ key: "cpu_mem", title: "CPU Mem", value: r => r.cpu_mem, text: r => fmtBytes(r.cpu_mem) });
    cols.push({ key: "self_cpu_mem", title: "Self CPU Mem", value: r => r.self_cpu_mem,
      text: r => fmtBytes(r.self_cpu_mem) });
  }
  return cols;
}

function detailList(title, items, render, empty) {
  const box = el("div", {}, el("b", { text: title }));
  if (!items) box.append(el("div", { class: "muted", text: empty }));
  else if (!items.length) box.append(el("div", { class: "muted", text: "none" }));
  else box.append(el("table", { class: "grid" }, el("tbody", {}, items.map(render))));
  return box;
}

// Call sites show the user's frames, innermost first; torch's plumbing frames (module
// _call_impl, ...) are folded unless the checkbox asks for them (site[3]: with them).
const siteState = { torchFrames: false };
function callSites(row, redraw) {
  const box = detailList("Call sites (Python stacks, innermost first)", row.stacks, site =>
    el("tr", { class: "site" }, el("td", { class: "name" }, el("pre", {
      text: (siteState.torchFrames && site[3] ? site[3] : site[0]).join("\n") })),
    el("td", { text: `${site[1]} calls` }), el("td", { text: fmtUs(site[2]) + " self" })),
    "not recorded (profile with with_stack=True)");
  if (row.stacks && row.stacks.some(site => site[3])) {
    const toggle = el("input", { type: "checkbox", id: "op-torch-frames", onchange: () => {
      siteState.torchFrames = toggle.checked;
      redraw();
    } });
    toggle.checked = siteState.torchFrames;
    box.firstChild.after(el("label", { class: "muted" }, " ", toggle, " show torch's frames"));
  }
  return box;
}

function operatorDetail(row, redraw) {
  const calls = (c, w) => [el("td", { text: `${c} calls` }), el("td", { text: fmtUs(w) + " self" })];
  return el("div", { class: "detail", id: "op-detail" },
    el("h3", { text: row.name }),
    el("div", { class: "muted", text: `${row.calls} calls · self ${fmtUs(row.self_us)} · total ` +
      `${fmtUs(row.total_us)}` + (row.user ? " · user range (record_function)" : "") }),
    detailList("Input shapes", row.shapes, ([s, c, w]) => el("tr", {}, el("td", { class: "name", text: s }),
      ...calls(c, w)), "not recorded (profile with record_shapes=True)"),
    detailList("Called from", row.callers, ([n, c, w]) => el("tr", {}, el("td", { class: "name", text: n }),
      ...calls(c, w)), "top-level only"),
    callSites(row, redraw));
}

VIEWS.operators = function (section) {
  const ops = DATA.operators, cols = operatorColumns(ops);
  const state = { sort: cols.find(c => c.key === "self_us"), dir: -1, filter: "", selected: null };
  const tbody = el("tbody"), count = el("span", { class: "muted", id: "op-count" });
  const detail = el("div", { class: "detail-dock" });   // sticks to the window's bottom
  const headers = cols.map(col => el("th", { class: col.cls || null, "data-key": col.key, text: col.title,
    title: "click to sort", onclick: () => {
      state.dir = state.sort === col ? -state.dir : (col.key === "name" ? 1 : -1);
      state.sort = col;
      draw();
    } }));
  const search = el("input", { type: "search", id: "op-search", placeholder: "filter by name (substring)",
    oninput: () => { state.filter = search.value.toLowerCase(); draw(); } });

  function draw() {
    let rows = ops.rows.map((r, i) => [r, i]);
    if (state.filter) rows = rows.filter(([r]) => r.name.toLowerCase().includes(state.filter));
    if (state.sort) {
      const value = state.sort.value;
      rows.sort((a, b) => {
        const x = value(a[0]), y = value(b[0]);
        return (x < y ? -1 : x > y ? 1 : a[1] - b[1]) * (x === y ? 1 : state.dir);
      });
    }
    headers.forEach((th, k) => th.setAttribute("aria-sort",
      state.sort === cols[k] ? (state.dir > 0 ? "ascending" : "descending") : "none"));
    tbody.replaceChildren(...rows.slice(0, OP_RENDER_LIMIT).map(([r, i]) => {
      const tr = el("tr", { class: (r.user ? "user " : "") + (state.selected === i ? "selected" : ""),
        "data-index": i, onclick: () => {
          state.selected = i;
          for (const other of tbody.querySelectorAll("tr.selected")) other.classList.remove("selected");
          tr.classList.add("selected");
          const show = () => detail.replaceChildren(operatorDetail(r, show), el("button", {
            class: "close", title: "close", text: "×", onclick: () => {
              state.selected = null;
              tr.classList.remove("selected");
              detail.replaceChildren();
            } }));
          show();
        } }, cols.map(col => el("td", { class: col.cls || null, text: col.text(r), title: col.text(r) })));
      return tr;
    }));
    count.textContent = `${rows.length} of ${ops.rows.length} rows` +
      (rows.length > OP_RENDER_LIMIT ? ` (first ${OP_RENDER_LIMIT} shown)` : "") +
      ` · self CPU time total: ${fmtUs(ops.self_total_us)}`;
  }
  section.append(el("div", { class: "toolbar" }, search, count,
    el("span", { class: "muted",
      text: "Rows as key_averages(), by self time; click a header to sort, a row for details." })));
  if (ops.has_memory) section.append(el("p", { class: "muted", id: "op-memory-note",
    text: "CPU Mem: bytes allocated minus freed while the op or range ran, on its thread, what it " +
      "called included; Self CPU Mem: its own part (torch's columns). A module's range counts its " +
      "forward only: the Modules view's Net CPU Mem adds its backward." }));
  section.append(el("div", { class: "tablewrap grow" },
    el("table", { class: "grid", id: "op-table" }, el("thead", {}, el("tr", {}, headers)), tbody)));
  section.append(detail);
  draw();
};
