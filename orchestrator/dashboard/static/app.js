// netai-testbed dashboard: draws the topology (Cytoscape.js), each directed link's load, the trees
// of the running tasks, and their round figures. Live runs push a frame a second (server-sent
// events); a finished run is replayed with the time slider. Nothing is loaded from the network
// but this page's own server. Site names are data: they are only ever set as text, never as HTML.
"use strict";

const state = { meta: null, frame: null, selected: null, frames: 0, cy: null };
window.netai = state; // for tests and the curious: netai.cy, netai.frame, netai.frames

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function fmt(x, d = 3) { return x === null || x === undefined ? "–" : Number(x).toFixed(d); }

const linkId = (a, b) => "L\u0000" + a + "\u0000" + b;
const hopId = (kind, a, b) => "T\u0000" + kind + "\u0000" + a + "\u0000" + b;

function colourOf(ai, bg) {
  // AI share of the load: grey (background only) to blue (AI only).
  const total = ai + bg;
  const share = total > 0 ? ai / total : 0;
  const mix = (x, y) => Math.round(x + (y - x) * share);
  return `rgb(${mix(153, 31)},${mix(153, 111)},${mix(153, 209)})`;
}

function buildGraph(meta) {
  const elements = [];
  for (const s of meta.topology.sites) {
    elements.push({ group: "nodes", data: { id: s.id, label: s.id }, position: { x: s.x, y: s.y },
                    classes: s.compute ? "compute" : "switching" });
  }
  for (const ln of meta.topology.links) {
    for (const [a, b] of [[ln.a, ln.b], [ln.b, ln.a]]) {
      elements.push({ group: "edges", data: { id: linkId(a, b), source: a, target: b, kind: "link",
        rate: 0, ai: 0, bg: 0, cap: ln.emulated_mbps || 0, width: 1, colour: "#ccc" }, classes: "link" });
    }
  }
  state.cy = cytoscape({
    container: document.getElementById("graph"),
    elements,
    layout: { name: "preset", fit: true, padding: 30 },
    wheelSensitivity: 0.3,
    style: [
      { selector: "node", style: { label: "data(label)", "font-size": 10, width: 14, height: 14,
        "background-color": "#567", "text-valign": "top", "text-margin-y": -3 } },
      { selector: "node.switching", style: { shape: "rectangle", "background-color": "#aaa" } },
      { selector: "node.global", style: { "background-color": "#ffb000", width: 22, height: 22, shape: "star" } },
      { selector: "node.agg", style: { "border-width": 4, "border-color": "#6a3d9a" } },
      { selector: "node.local", style: { "background-color": "#1f6fd1" } },
      { selector: "edge.link", style: { width: "data(width)", "line-color": "data(colour)",
        "curve-style": "bezier", "control-point-step-size": 10, "target-arrow-shape": "none", opacity: 0.85 } },
      { selector: "edge.down", style: { "line-style": "dotted", "line-color": "#b00" } },
      { selector: "edge.tree", style: { width: 3, "curve-style": "bezier", "control-point-step-size": 22,
        "line-style": "dashed", "target-arrow-shape": "triangle", "arrow-scale": 0.8 } },
      { selector: "edge.broadcast", style: { "line-color": "#2ca02c", "target-arrow-color": "#2ca02c" } },
      { selector: "edge.upload", style: { "line-color": "#d62728", "target-arrow-color": "#d62728" } },
    ],
  });
}

function applyLinks(frame) {
  const cy = state.cy;
  cy.batch(() => {
    for (const ln of frame.links) {
      const e = cy.getElementById(linkId(ln.a, ln.b));
      if (e.empty()) continue;
      const cap = ln.capacity_mbps || e.data("cap") || 1;
      const util = Math.min(1, ln.rate_mbps / cap);
      e.data({ rate: ln.rate_mbps, ai: ln.ai_mbps, bg: ln.background_mbps, cap, util,
               width: 1 + 11 * util, colour: util > 0.001 ? colourOf(ln.ai_mbps, ln.background_mbps) : "#ccc" });
      e.toggleClass("down", !ln.up);
    }
  });
  const rows = frame.links.slice().sort((x, y) => y.rate_mbps / (y.capacity_mbps || 1) - x.rate_mbps / (x.capacity_mbps || 1))
    .slice(0, 8);
  const tbody = document.querySelector("#links tbody");
  tbody.replaceChildren(...rows.map((ln) => {
    const tr = el("tr");
    tr.append(el("td", `${ln.a} → ${ln.b}`), el("td", fmt(ln.ai_mbps, 1)), el("td", fmt(ln.background_mbps, 1)),
              el("td", `${fmt(ln.rate_mbps, 1)} / ${fmt(ln.capacity_mbps, 0)}${ln.up ? "" : " (down)"}`));
    return tr;
  }));
}

function applyTrees(frame) {
  const cy = state.cy;
  const shown = frame.tasks.filter((t) => t.schedule && (state.selected === null || t.key === state.selected));
  const want = new Map();
  const roles = new Map();
  for (const t of shown) {
    const s = t.schedule;
    for (const kind of ["broadcast", "upload"]) {
      for (const [a, b] of (s.hops[kind] || [])) want.set(hopId(kind, a, b), { kind, a, b });
    }
    roles.set(s.global, "global");
    for (const l of s.locals) if (!roles.has(l)) roles.set(l, "local");
    for (const g of s.aggregation_sites) roles.set(g + "\u0000agg", "agg");
  }
  cy.batch(() => {
    cy.edges(".tree").forEach((e) => { if (!want.has(e.id())) e.remove(); });
    for (const [id, h] of want) {
      if (cy.getElementById(id).empty() && !cy.getElementById(h.a).empty() && !cy.getElementById(h.b).empty()) {
        cy.add({ group: "edges", data: { id, source: h.a, target: h.b, kind: h.kind }, classes: "tree " + h.kind });
      }
    }
    cy.nodes().forEach((n) => {
      n.toggleClass("global", roles.get(n.id()) === "global");
      n.toggleClass("local", roles.get(n.id()) === "local");
      n.toggleClass("agg", roles.has(n.id() + "\u0000agg"));
    });
  });
}

function applyTasks(frame) {
  const counts = Object.entries(frame.counts).map(([k, v]) => `${k} ${v}`).join(", ");
  document.getElementById("counts").textContent = counts ? `(${counts})` : "";
  const tbody = document.querySelector("#tasks tbody");
  tbody.replaceChildren(...frame.tasks.map((t) => {
    const tr = el("tr", null, t.key === state.selected ? "sel" : "");
    tr.dataset.key = t.key;
    const last = t.last_round || {};
    const split = last.latency_s !== undefined
      ? `${fmt(last.latency_s)}: ${fmt(last.broadcast_s)} / ${fmt(last.train_s)} / ${fmt(last.upload_s)}` : "–";
    tr.append(el("td", `${t.key} (${t.n_locals ?? "?"} locals)`), el("td", t.state),
              el("td", `${t.rounds_done}/${t.rounds ?? "?"}`), el("td", split),
              el("td", last.accuracy !== undefined ? fmt(last.accuracy) : "–"));
    tr.addEventListener("click", () => {
      state.selected = state.selected === t.key ? null : t.key;
      render(state.frame);
    });
    return tr;
  }));
  const ended = document.querySelector("#ended tbody");
  ended.replaceChildren(...frame.ended.map((t) => {
    const tr = el("tr");
    tr.append(el("td", t.key), el("td", t.state, t.state), el("td", fmt(t.at_s, 1)), el("td", t.reason, "reason"));
    return tr;
  }));
}

function render(frame) {
  if (!frame || !state.cy) return;
  state.frame = frame;
  state.frames += 1;
  if (state.selected !== null && !frame.tasks.some((t) => t.key === state.selected)) state.selected = null;
  applyLinks(frame);
  applyTrees(frame);
  applyTasks(frame);
  document.getElementById("clock").textContent = `t = ${fmt(frame.t, 1)} s`;
}

async function getJSON(url) {
  const r = await fetch(url, { cache: "no-store" });
  if (!r.ok) throw new Error(`${url}: ${r.status}`);
  return r.json();
}

async function main() {
  const meta = await getJSON("/api/meta");
  state.meta = meta;
  const run = meta.run;
  document.getElementById("run").textContent =
    `${run.name} · ${meta.topology.name} (${meta.topology.layout}) · ${meta.live ? "live" : "replay"} · ${run.status}` +
    (run.delay_emulated === false ? " · delays not emulated" : "");
  buildGraph(meta);
  if (meta.live) {
    const source = new EventSource("/api/stream");
    source.onmessage = (ev) => render(JSON.parse(ev.data));
    source.onerror = () => { document.getElementById("clock").textContent = "stream lost; retrying"; };
  } else {
    const box = document.getElementById("replay");
    const slider = document.getElementById("slider");
    const label = document.getElementById("slider-t");
    box.hidden = false;
    slider.min = meta.range[0];
    slider.max = meta.range[1];
    slider.value = meta.range[1];
    let pending = null;
    const show = async () => {
      const t = Number(slider.value);
      label.textContent = `${t.toFixed(1)} s of ${Number(meta.range[1]).toFixed(1)} s`;
      const frame = await getJSON(`/api/frame?t=${encodeURIComponent(t)}`);
      if (Number(slider.value) === t) render(frame);
    };
    slider.addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(show, 60); });
    await show();
  }
}

main().catch((e) => { document.getElementById("run").textContent = `error: ${e.message}`; });
