// Ranks (a job's report only): step-time heat map, findings, per-rank summary and the
// collective table; the merged timeline is ranks_timeline.js. The tab and its section are
// added here, before the page starts, so report.html stays the single-trace template.
"use strict";
const RANK_ROW_LIMIT = 500;   // collective rows drawn at once
const RANK_INLINE_COLUMNS = 16;   // per-rank wait columns up to this many ranks

(function addRanksTab() {
  const button = el("button", { "data-view": "ranks", text: "Ranks" });
  const tabs = document.getElementById("tabs");
  tabs.insertBefore(button, tabs.firstChild);
  document.querySelector("main").prepend(el("section", { id: "view-ranks", class: "view" }));
  const m = DATA.meta, r = DATA.ranks;
  document.querySelector("header").insertBefore(el("div", { id: "ranks-note", class: "muted",
    text: `Job of ${r.world_size} rank(s): the Ranks tab shows every rank; the other tabs show ` +
      `rank ${m.shown_rank} (${m.shown_file}).` }), tabs);
  if (!location.hash) history.replaceState(null, "", "#ranks");
  // the view's own styles: report.css stays the single-trace stylesheet
  document.head.append(el("style", { text:
    "table.heatmap { border-collapse: collapse; font-size: 11px; }" +
    "table.heatmap th, table.heatmap td { border: 1px solid #fff; padding: 2px 5px; " +
    "min-width: 14px; height: 18px; text-align: right; white-space: nowrap; }" +
    "table.heatmap thead th { position: sticky; top: 0; background: var(--panel); }" +
    "table.heatmap tbody th { text-align: left; background: var(--panel); }" +
    "table.heatmap td.empty { background: #f6f7f9; color: var(--muted); }" }));
})();

// Light yellow (fast) to dark red (slow) over [lo, hi].
function heatColor(v, lo, hi) {
  const f = hi > lo ? (v - lo) / (hi - lo) : 0;
  return `hsl(${Math.round(50 - 50 * f)}, 85%, ${Math.round(88 - 48 * f)}%)`;
}

function rankHeatmap(h) {
  const values = h.ms.flat().filter(v => v !== null);
  // a loop, not Math.min(...values): 64 ranks x 2000 steps is past the argument limit
  const lo = values.reduce((a, v) => Math.min(a, v), Infinity);
  const hi = values.reduce((a, v) => Math.max(a, v), -Infinity), inline = h.steps.length <= 30;
  const head = el("tr", {}, el("th", { text: "rank \\ step" }),
    h.steps.map(s => el("th", { text: String(s) })));
  const rows = h.ranks.map((rank, i) => el("tr", { "data-rank": rank },
    el("th", { text: `rank ${rank}` }),
    h.ms[i].map((v, k) => v === null ? el("td", { class: "empty", text: inline ? "–" : "" }) :
      el("td", { style: `background:${heatColor(v, lo, hi)}` +
        (hi > lo && (v - lo) / (hi - lo) > 0.6 ? ";color:#fff" : ""), text: inline ? v.toFixed(1) : "",
        onmousemove: e => showTip(e, `rank ${rank} · step ${h.steps[k]}\n${fmtUs(v * 1000)}`),
        onmouseleave: hideTip }))));
  const box = el("div", { class: "tablewrap" },
    el("table", { class: "heatmap", id: "rank-heatmap" }, el("thead", {}, head), el("tbody", {}, rows)));
  const note = `Step time per rank and step (ProfilerStep ranges; ms), from ${fmtUs(lo * 1000)} ` +
    `(light) to ${fmtUs(hi * 1000)} (dark); hover a cell for its value.` +
    (h.total_steps > h.steps.length ? ` The first ${h.steps.length} of ${h.total_steps} steps.` : "");
  return [el("p", { class: "muted", text: values.length ? note : "No steps recorded." }), box];
}

function rankFindings(r) {
  const out = [];
  if (r.stragglers.length)
    out.push(el("div", { class: "rec high", id: "rank-stragglers" }, el("h3", { text: "Stragglers" }),
      el("ul", {}, r.stragglers.map(s => el("li", { "data-rank": s.rank,
        text: `rank ${s.rank}: arrived last at ${s.late_count} collective(s), ` +
          `${fmtUs(s.mean_lateness_ms * 1000)} after the others on average` })))));
  else out.push(el("div", { class: "rec info", id: "rank-stragglers" },
    el("h3", { text: "No straggler: no rank arrived last by more than the noise floor" })));
  for (const d of r.desync)
    out.push(el("div", { class: "rec high", id: "rank-desync" },
      el("h3", { text: `Desync at process group ${d.pg}, collective #${d.seq}` }),
      el("ul", {}, Object.keys(d.ranks).map(k => el("li", { text: `rank ${k}: ` +
        (d.ranks[k] === null ? "issued none" : d.ranks[k] +
          (d.bytes[k] !== null && d.bytes[k] !== undefined ? ` (${fmtBytes(d.bytes[k])})` : "") +
          (d.in_nelems && d.in_nelems[k] !== null && d.in_nelems[k] !== undefined ?
            ` ${d.in_nelems[k]} -> ${d.out_nelems[k]} elements` : "") +
          (d.dtypes && d.dtypes[k] ? ` ${d.dtypes[k]}` : "")) +
        (d.call_sites[k] ? ` at ${d.call_sites[k]}` : "") })))));
  if (!r.desync.length) out.push(el("div", { class: "rec info", id: "rank-desync" },
    el("h3", { text: "No desync: every rank issued the same collectives" })));
  if (r.missing_ranks.length) out.push(el("div", { class: "rec high" },
    el("h3", { text: `No trace for rank(s) ${r.missing_ranks.join(", ")} of ${r.world_size}` })));
  return out;
}

function rankSummary(rows) {
  const ms = v => fmtUs(v * 1000);
  return el("div", { class: "tablewrap" }, el("table", { class: "grid", id: "rank-summary" },
    el("thead", {}, el("tr", {}, ["Rank", "Steps", "Mean step", "Compute", "Communication",
      "Waiting", "Overlap", "Collectives"].map(t => el("th", { text: t })))),
    el("tbody", {}, rows.map(r => el("tr", {}, [String(r.rank), String(r.steps), ms(r.mean_step_ms),
      ms(r.compute_ms), ms(r.comm_ms), ms(r.wait_ms), ms(r.overlap_ms), String(r.collectives)]
      .map(t => el("td", { text: t })))))));
}

function collectiveColumns(c) {
  const ms = v => (v === null || v === undefined ? "" : fmtUs(v * 1000));
  const cols = [
    { key: "pg", title: "PG", value: r => r.pg, text: r => r.pg },
    { key: "seq", title: "Seq", value: r => r.seq, text: r => String(r.seq) },
    { key: "kind", title: "Kind", cls: "name", value: r => r.kind, text: r => r.kind },
    { key: "bytes", title: "Bytes", value: r => r.bytes || 0,
      text: r => (r.bytes === null ? "?" : fmtBytes(r.bytes)),
      tip: r => (r.bytes === null ? "not known: the traces hold no input shapes (record_shapes=True)" : null) },
    { key: "last_rank", title: "Last in", value: r => r.last_rank, text: r => `rank ${r.last_rank}` },
    { key: "max_wait_ms", title: "Longest wait", value: r => r.max_wait_ms, text: r => ms(r.max_wait_ms) },
    { key: "spread_ms", title: "Arrival spread", value: r => r.spread_ms, text: r => ms(r.spread_ms) },
  ];
  if (c.ranks.length <= RANK_INLINE_COLUMNS) c.ranks.forEach((rank, i) => cols.push({
    key: "wait" + rank, title: `rank ${rank} wait`, value: r => r.wait_ms[i] ?? -1,
    text: r => ms(r.wait_ms[i]),
    tip: r => r.start_ms[i] === null ? `rank ${rank}: did not issue it` :
      `rank ${rank}: arrived ${ms(r.start_ms[i])} · waited ${ms(r.wait_ms[i])} · ` +
      `transfer ${ms(r.transfer_ms[i])}` }));
  return cols;
}

function collectiveDetail(c, row) {
  const ms = v => (v === null ? "" : fmtUs(v * 1000));
  return el("div", { class: "detail", id: "collective-detail" },
    el("h3", { text: `${row.kind} · process group ${row.pg} · #${row.seq}` +
      (row.bytes !== null ? ` · ${fmtBytes(row.bytes)}` : "") }),
    el("table", { class: "grid" }, el("thead", {}, el("tr", {}, ["Rank", "Arrival", "Wait",
      "Transfer"].map(t => el("th", { text: t })))), el("tbody", {}, c.ranks.map((rank, i) =>
      el("tr", {}, [`rank ${rank}`, ms(row.start_ms[i]), ms(row.wait_ms[i]), ms(row.transfer_ms[i])]
        .map(t => el("td", { text: t })))))));
}

function collectiveTable(c) {
  const cols = collectiveColumns(c), state = { sort: null, dir: -1 };
  const tbody = el("tbody"), detail = el("div");
  const headers = cols.map(col => el("th", { class: col.cls || null, "data-key": col.key, text: col.title,
    title: "click to sort", onclick: () => {
      state.dir = state.sort === col ? -state.dir : -1;
      state.sort = col;
      draw();
    } }));
  function draw() {
    const rows = c.rows.map((r, i) => [r, i]);
    if (state.sort) {
      const value = state.sort.value;
      rows.sort((a, b) => {
        const x = value(a[0]), y = value(b[0]);
        return (x < y ? -1 : x > y ? 1 : a[1] - b[1]) * (x === y ? 1 : state.dir);
      });
    }
    headers.forEach((th, k) => th.setAttribute("aria-sort",
      state.sort === cols[k] ? (state.dir > 0 ? "ascending" : "descending") : "none"));
    tbody.replaceChildren(...rows.slice(0, RANK_ROW_LIMIT).map(([r]) => el("tr", {
      onclick: () => detail.replaceChildren(collectiveDetail(c, r)) },
      cols.map(col => el("td", { class: col.cls || null, text: col.text(r),
        title: col.tip ? col.tip(r) : null })))));
  }
  draw();
  const shown = Math.min(c.rows.length, RANK_ROW_LIMIT);
  return [el("p", { class: "muted", text: `${c.total} collective(s) matched across ranks by ` +
      `(process group, sequence number); the longest wait first` +
      (c.total > shown ? ` (${shown} shown)` : "") + `. Transfer is the shortest duration ` +
      `across ranks, wait the rest. Click a header to sort, a row for every rank.` +
      (c.rows.some(r => r.bytes === null) ? ` Bytes "?": the traces hold no input shapes, so ` +
        `the sizes are not known; profile with record_shapes=True (opscope run --record-shapes).` : "") }),
    el("div", { class: "tablewrap" }, el("table", { class: "grid", id: "collective-table" },
      el("thead", {}, el("tr", {}, headers)), tbody)), detail];
}

VIEWS.ranks = function (section) {
  const r = DATA.ranks;
  section.append(el("h2", { text: "Findings" }), ...rankFindings(r),
    el("h2", { text: "Step time per rank" }), ...rankHeatmap(r.heatmap),
    el("h2", { text: "Per rank" }), rankSummary(r.summary),
    el("h2", { text: "Collectives" }), ...collectiveTable(r.collectives),
    el("h2", { text: "Timeline, all ranks on one clock" }));
  const timeline = el("div", { id: "ranks-timeline" });
  section.append(timeline);
  rankTimeline(timeline, r.timeline);
};
