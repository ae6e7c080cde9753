// Black box (a black box dump only): why it was written, the facts of the moment, and for a
// slow step the slow step beside a median step of the ring, op by op (report/black_box.py
// computes the data). The tab comes first, and the page opens at it.
"use strict";
(function addBlackBoxTab() {
  if (!DATA.black_box) return;
  const tabs = document.getElementById("tabs");
  tabs.insertBefore(el("button", { "data-view": "black_box", text: "Black box" }),
                    tabs.firstChild);
  const section = el("section", { id: "view-black_box", class: "view" });
  document.querySelector("main").prepend(section);
  if (!location.hash) history.replaceState(null, "", "#black_box");
})();

VIEWS.black_box = function (section) {
  const b = DATA.black_box;
  section.append(el("h3", { id: "black-box-reason", text: `Written for: ${b.reason}` }));
  section.append(el("ul", { id: "black-box-facts" }, Object.entries(b.facts).map(([k, v]) =>
    el("li", { text: `${k}: ${v}` }))));
  const s = b.steps;
  if (!s) return;
  section.append(el("p", { id: "black-box-accounts", text:
    `The slow step took ${fmtUs(s.slow_us)}, a median step ${fmtUs(s.typical_us)} ` +
    `(${s.rule}). ` + (s.accounts.length ? `The difference is mostly ${s.accounts.join(", ")}.`
                                          : "No op grew: the time went outside ops.") }));
  section.append(el("div", { class: "tablewrap" }, el("table", { class: "grid",
    id: "black-box-steps" },
    el("thead", {}, el("tr", {}, [["Op", "name"], ["Slow step"], ["Median step"], ["Extra"],
                                  ["Calls (slow)"], ["Calls (median)"]]
      .map(([text, cls]) => el("th", { class: cls, text })))),
    el("tbody", {}, s.rows.map(r => el("tr", {},
      el("td", { class: "name", text: r.name, title: r.name }),
      el("td", { text: fmtUs(r.slow_us) }), el("td", { text: fmtUs(r.typical_us) }),
      el("td", { text: fmtUs(r.extra_us) }), el("td", { text: String(r.slow_calls) }),
      el("td", { text: String(r.typical_calls) })))))));
};
