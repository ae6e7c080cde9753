// GPU view: the device's busy share and idle gaps, device time per module, and the top
// kernels with the ops that launched them (report/kernels.py computes the data).
"use strict";
VIEWS.kernels = function (section) {
  const gpu = DATA.kernels;
  if (!gpu) {
    section.append(notRecorded("GPU", "Profile a CUDA program with ProfilerActivity.CUDA " +
      "(the default where torch.cuda.is_available()) to see its kernels, copies and memsets."));
    return;
  }
  section.append(el("div", { class: "cards", id: "gpu-cards" },
    el("div", { class: "card" }, el("b", { text: fmtPct(gpu.busy_us, gpu.window_us) }),
      el("span", { text: "GPU busy" })),
    el("div", { class: "card" }, el("b", { text: fmtUs(gpu.busy_us) }),
      el("span", { text: "device busy of " + fmtUs(gpu.window_us) })),
    el("div", { class: "card" }, el("b", { text: String(gpu.events) }),
      el("span", { text: "kernels, copies, memsets" })),
    el("div", { class: "card" }, el("b", { text: String(gpu.unowned) }),
      el("span", { text: "launched outside any op" }))));
  if (gpu.gaps.length) {
    section.append(el("h3", { text: "Longest idle gaps" }), el("table", { class: "grid", id: "gpu-gaps" },
      el("thead", {}, el("tr", {}, el("th", { text: "Idle" }), el("th", { text: "From (since start)" }))),
      el("tbody", {}, ...gpu.gaps.map(g => el("tr", {}, el("td", { text: fmtUs(g.us) }),
        el("td", { text: fmtUs(g.start_us) }))))));
  }
  if (gpu.modules.length) {
    section.append(el("h3", { text: "Device time per module" }), el("table", { class: "grid", id: "gpu-modules" },
      el("thead", {}, el("tr", {}, el("th", { class: "name", text: "Module" }), el("th", { text: "Device time" }))),
      el("tbody", {}, ...gpu.modules.map(m => el("tr", {}, el("td", { class: "name", text: m.module }),
        el("td", { text: fmtUs(m.us) }))))));
  }
  section.append(el("h3", { text: "Top kernels" }), el("div", { class: "tablewrap" },
    el("table", { class: "grid", id: "kernel-table" },
      el("thead", {}, el("tr", {}, el("th", { class: "name", text: "Kernel" }), el("th", { text: "Kind" }),
        el("th", { text: "Calls" }), el("th", { text: "Device time" }), el("th", { text: "Share" }),
        el("th", { text: "Avg" }), el("th", { class: "name", text: "Launched by" }),
        el("th", { class: "name", text: "Where" }))),
      el("tbody", {}, ...gpu.kernels.map(k => el("tr", {},
        el("td", { class: "name", text: k.name, title: k.name }), el("td", { text: k.category }),
        el("td", { text: String(k.calls) }), el("td", { text: fmtUs(k.us) }),
        el("td", { text: (100 * k.share).toFixed(2) + "%" }), el("td", { text: fmtUs(k.avg_us) }),
        el("td", { class: "name", text: k.launched_by.map(([op, n]) => `${op} (${n})`).join(", ") }),
        el("td", { class: "name", text: k.stack ? k.stack[0] : "", title: k.stack ? k.stack.join("\n") : "" })))))));
};
