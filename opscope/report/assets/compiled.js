// Compiled (a recording with torch.compile'd graphs only): Dynamo's frames with their own
// time (guards, AOT wrappers, compiles, graph breaks), then the graphs (report/compiled.py
// computes the data). The tab and its section are added here, before the page starts, so a
// recording with no compiled graph has no Compiled tab.
"use strict";
(function addCompiledTab() {
  if (!DATA.compiled) return;
  const tabs = document.getElementById("tabs");
  const after = tabs.querySelector('button[data-view="modules"]');
  tabs.insertBefore(el("button", { "data-view": "compiled", text: "Compiled" }),
                    after ? after.nextSibling : null);
  const modules = document.getElementById("view-modules");
  const section = el("section", { id: "view-compiled", class: "view" });
  if (modules) modules.after(section); else document.querySelector("main").append(section);
})();

function compiledTable(id, heads, rows) {
  return el("div", { class: "tablewrap" }, el("table", { class: "grid", id },
    el("thead", {}, el("tr", {}, heads.map(([text, cls]) => el("th", { class: cls, text })))),
    el("tbody", {}, rows)));
}

VIEWS.compiled = function (section) {
  const c = DATA.compiled, t = c.totals;
  section.append(el("p", { class: "muted", text:
    `${c.graphs.length} compiled graph(s) in ${c.frames.length} Dynamo frame(s). ` +
    "Dynamo's own time per frame: guards (the TorchDynamo Cache Lookup before each run), " +
    "the AOT wrappers (their time outside the graph calls) and compiles in this window." }),
    el("div", { class: "cards", id: "compiled-cards" },
      [[fmtUs(t.graph_us), `in ${t.graph_calls} graph call(s)`],
       [fmtUs(t.guard_us), `guards (${t.guard_calls} cache lookups)`],
       [fmtUs(t.wrapper_us), "AOT wrappers"], [fmtUs(t.compile_us), "compiling in this window"],
       [String(t.recompiles), "recompiles so far"], [String(t.graph_breaks), "graph breaks so far"]]
        .map(([value, label]) => el("div", { class: "card" }, el("b", { text: value }),
                                    el("span", { text: label })))));
  section.append(el("h3", { text: "Dynamo frames" }), compiledTable("compiled-frames",
    [["Frame"], ["Code", "name"], ["Calls"], ["Forward"], ["Backward"], ["In graphs"],
     ["Guards"], ["Guard time"], ["Wrappers"], ["Compiling"], ["Compiles"], ["Graph breaks"]],
    c.frames.map(f => el("tr", { "data-frame": f.frame },
      el("td", { text: f.frame, title: f.compile_ids.join(", ") }),
      el("td", { class: "name", text: f.code, title: f.code }), el("td", { text: String(f.calls) }),
      el("td", { text: fmtUs(f.time_us) }), el("td", { text: fmtUs(f.backward_us) }),
      el("td", { text: fmtUs(f.graph_us) }), el("td", { text: String(f.guard_calls) }),
      el("td", { text: fmtUs(f.guard_us) }), el("td", { text: fmtUs(f.wrapper_us) }),
      el("td", { text: f.compile_us ? fmtUs(f.compile_us) : "" }),
      el("td", { text: String(f.compiles) }),
      el("td", { text: String(Math.max(f.break_lines.length, f.break_reasons.length)) })))));
  const notes = c.frames.flatMap(f => f.notes);
  if (notes.length)
    section.append(el("ul", { id: "compiled-notes" }, notes.map(n => el("li", { text: n }))));
  section.append(el("h3", { text: "Graphs" }), compiledTable("compiled-graphs",
    [["Graph", "name"], ["Direction"], ["Frame"], ["Calls"], ["Time"], ["Kernels"],
     ["In modules"], ["Called from", "name"]],
    c.graphs.map(g => el("tr", { "data-graph": g.key },
      el("td", { class: "name", text: g.key.slice(0, 12), title: g.key }),
      el("td", { text: g.direction }), el("td", { text: g.frame }),
      el("td", { text: String(g.calls) }), el("td", { text: fmtUs(g.time_us) }),
      el("td", { text: String(g.kernels) }), el("td", { text: g.in_modules_pct.toFixed(1) + "%" }),
      el("td", { class: "name", text: g.caller, title: g.caller })))));
  if (c.breaks.length)
    section.append(el("h3", { text: "Graph breaks so far in the process" }),
      el("ul", { id: "compiled-breaks" }, c.breaks.map(([reason, n]) =>
        el("li", { text: `${n} × ${reason.split("\n")[0]}`, title: reason }))));
  section.append(el("p", { class: "muted", id: "compiled-see-also", text:
    "Which ops ran outside the graphs (captured vs total ops, with their source lines): " +
    "opscope.dynamo.Profiler (docs/compiled.md, \"Finding graph breaks\"). The same " +
    "tables as text: opscope table TRACE --group-by graph." }));
};
