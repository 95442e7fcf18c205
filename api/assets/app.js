// cdnmap operator dashboard: plain JS, hand-written SVG, no external fetches. It polls the JSON
// API (docs/dashboard.md) every POLL_MS and redraws without reloading the page.
"use strict";

const POLL_MS = 2000;
const W = 960, H = 480; // the map: equirectangular, 2.667 px per degree
const SVGNS = "http://www.w3.org/2000/svg";

const state = {
  version: -1,
  clusters: [],
  map: null,
  history: [],
  sort: { key: "demand", desc: true },
  selected: null,
  lastEventSeq: -1,
  actionsEnabled: false,
  busy: false,
  lookup: null, // the last lookup's units, drawn on the map
  preview: null, // the action awaiting confirmation: { id, target, label, answer }, its flows drawn on the map
  flashUntil: 0,
};

// --- helpers --------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "style") e.setAttribute("style", v);
    else e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function sv(tag, attrs, ...children) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) e.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c !== null && c !== undefined) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  if (digits !== undefined) return x.toFixed(digits);
  return quantity(x, "");
}

// The page's one formatter of quantities: `x` in the API's unit `unit`, shown in the unit an
// operator reads, with an SI prefix.
//   "bps"   the model's Bps, bytes per second: shown as bits per second (bps, kbps, Mbps, Gbps)
//   "fps"   the model's Fps, flytes per second (flytes/s, kflytes/s, Mflytes/s)
//   "ratio" a share (0.011 → 1.1%)
//   "ms"    milliseconds (ms below a second, s above)
//   ""      a plain count or demand (k, M, G)
// `ref` (optional) picks the prefix and precision instead of `x`, so that the ticks of an axis
// or a load and its capacity share one ("1.2 / 2.1 Mbps").
const SI = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
function quantity(x, unit, ref, bare) {
  if (x === null || x === undefined || Number.isNaN(x)) return "—";
  const r = Math.abs(ref === undefined || ref === null ? x : ref);
  if (unit === "ratio") {
    // Below 0.0005% is float noise (a churn of 4e-16): shown as 0.
    const d = r < 5e-6 ? 0 : r < 0.001 ? 3 : r < 0.01 ? 2 : r < 0.1 ? 1 : 0;
    const v = 100 * x;
    return (Math.abs(v) < 0.5 * 10 ** -d ? 0 : v).toFixed(d) + (bare ? "" : "%");
  }
  if (unit === "ms") {
    if (r >= 1000) return num(x / 1000, r / 1000) + (bare ? "" : " s");
    return num(x, r) + (bare ? "" : " ms");
  }
  const k = unit === "bps" ? 8 : 1;
  if (x === 0 && !bare) return unit === "bps" ? "0 bps" : unit === "fps" ? "0 flytes/s" : "0";
  const [div, p] = SI.find(([d]) => k * r >= d) || [1, ""];
  const name = p + (unit === "bps" ? "bps" : unit === "fps" ? "flytes/s" : "");
  return num((k * x) / div, (k * r) / div) + (bare || !name ? "" : " " + name);
}
// A number with 3 significant digits of `ref` (at most).
function num(v, ref) {
  const d = ref === 0 ? 0 : ref < 10 ? 2 : ref < 100 ? 1 : 0;
  return v.toFixed(d).replace(/(\.\d*?)0+$/, "$1").replace(/\.$/, "");
}
const pct = (x) => quantity(x, "ratio");
const utilColor = (u) => `hsl(${Math.round(120 * (1 - Math.min(1, Math.max(0, u))))} 75% ${u >= 0.999 ? 55 : 45}%)`;
const proj = (lat, lon) => [((lon + 180) / 360) * W, ((90 - lat) / 180) * H];

function token() { return sessionStorage.getItem("cdnmap.token") || ""; }

async function api(path, opts) {
  const r = await fetch(path, opts);
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  if (!r.ok) throw new Error((body && body.error) || `${r.status} ${r.statusText}`);
  return body;
}

// --- status and header ----------------------------------------------------------------------

function renderStatus(s) {
  const v = document.getElementById("version");
  v.textContent = `map v${s.map_version} · ${(s.map_age_ms / 1000).toFixed(0)} s old`;
  v.className = "pill" + (s.stale ? " stale" : "");
  v.dataset.version = s.map_version;
  const f = document.getElementById("figures");
  f.replaceChildren(
    el("span", { title: "demand units (the estimator's forecast the round mapped)" }, "demand ", el("b", {}, fmt(s.demand))),
    el("span", {}, "overflow ", el("b", {}, pct(s.overflow_share))),
    el("span", {}, "churn ", el("b", {}, pct(s.churn))),
    el("span", {}, "mean RTT ", el("b", {}, quantity(s.mean_rtt_ms, "ms"))),
    s.cost == null ? "" : el("span", { title: "the map's cost under the cost policy: each cluster's price × the Bps placed there (docs/policy.md)" }, "cost ", el("b", {}, fmt(s.cost))),
    el("span", { title: "wall time of the last round (estimates, solve, index)" }, "round ", el("b", {}, quantity(s.last_round.solve_ms, "ms"))),
    el("span", {}, "clusters ", el("b", {}, `${s.clusters.up} up`), ` · ${s.clusters.drained} drained · ${s.clusters.down} down`),
    el("span", {}, "units ", el("b", {}, fmt(s.map_units))),
  );
  // A replica (cdnmap serve --etcd): its role, its term, the replicas and etcd's state.
  const r = s.replication;
  if (r) {
    f.append(el("span", { id: "replication" },
      el("b", {}, r.role), ` ${r.node_id}`,
      r.role === "leader" ? ` · epoch ${r.leader_epoch}` : (r.replicas.length ? ` · ${r.replicas[0]} leads` : ""),
      ` · replicas ${r.replicas.join(", ") || "—"}`,
      ` · etcd ${r.etcd_reachable ? "ok" : "unreachable: " + r.etcd_error}`));
  }
  const b = document.getElementById("banner");
  if (Date.now() < state.flashUntil) {
    // an action's error stays up a while
  } else if (s.banner) {
    b.textContent = s.banner;
    b.className = "banner" + (s.last_round.failed || !s.map_version ? "" : " warn");
    b.hidden = false;
  } else {
    b.hidden = true;
  }
  state.actionsEnabled = s.actions_enabled;
  renderMode();
}

function renderMode() {
  const m = document.getElementById("mode");
  const can = state.actionsEnabled && token() !== "";
  m.textContent = !state.actionsEnabled ? "read-only (no admin token on the server)" : can ? "actions enabled" : "read-only: enter the admin token";
  m.className = "pill" + (can ? " rw" : "");
  document.querySelectorAll("#clusters button[data-action]").forEach((btn) => { btn.disabled = !can; });
}

// --- the world map --------------------------------------------------------------------------

function renderMap() {
  const m = state.map;
  if (!m) return;
  const svg = sv("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "world map of clusters and demand flows" });
  const grid = sv("g", { stroke: "#1c3048", "stroke-width": 0.6, fill: "none" });
  for (let lon = -180; lon <= 180; lon += 30) grid.append(sv("line", { x1: proj(0, lon)[0], y1: 0, x2: proj(0, lon)[0], y2: H }));
  for (let lat = -60; lat <= 60; lat += 30) grid.append(sv("line", { x1: 0, y1: proj(lat, 0)[1], x2: W, y2: proj(lat, 0)[1] }));
  grid.append(sv("line", { x1: 0, y1: H / 2, x2: W, y2: H / 2, stroke: "#25405e" }));
  if (typeof LAND_PATH === "string") {
    svg.append(sv("path", { class: "land", d: LAND_PATH, transform: "scale(0.5)", fill: "#1a2d42", stroke: "#2f4b68", "stroke-width": 1.2 }));
  }
  svg.append(grid);

  const maxRegion = Math.max(1e-9, ...m.regions.map((r) => r.demand));
  const regions = sv("g", { class: "regions" });
  for (const r of m.regions) {
    const [x, y] = proj(r.lat, r.lon);
    const over = r.demand > 0 ? r.overflow / r.demand : 0;
    regions.append(sv("circle", {
      cx: x.toFixed(1), cy: y.toFixed(1), r: (1.2 + 9 * Math.sqrt(r.demand / maxRegion)).toFixed(1),
      fill: over > 0.001 ? "rgba(255,110,90,0.45)" : "rgba(120,160,210,0.35)",
    }, sv("title", {}, `${r.units} map units, demand ${fmt(r.demand)}, overflow ${pct(over)}`)));
  }
  svg.append(regions);

  const byId = new Map(m.clusters.map((c) => [c.id, c]));
  const maxFlow = Math.max(1e-9, ...m.flows.map((f) => f.amount));
  const flows = sv("g", { class: "flows", fill: "none" });
  for (const f of m.flows) {
    const r = m.regions[f.region], c = byId.get(f.cluster);
    if (!r || !c) continue;
    const [x1, y1] = proj(r.lat, r.lon), [x2, y2] = proj(c.lat, c.lon);
    const mx = (x1 + x2) / 2, my = (y1 + y2) / 2 - Math.hypot(x2 - x1, y2 - y1) * 0.15;
    const sel = state.selected === f.cluster;
    flows.append(sv("path", {
      d: `M${x1.toFixed(1)},${y1.toFixed(1)} Q${mx.toFixed(1)},${my.toFixed(1)} ${x2.toFixed(1)},${y2.toFixed(1)}`,
      stroke: sel ? "rgba(255,255,255,0.85)" : "rgba(79,179,255,0.45)",
      "stroke-width": (0.4 + 3.2 * Math.sqrt(f.amount / maxFlow)).toFixed(2),
      "data-cluster": f.cluster,
    }));
  }
  svg.append(flows);

  const maxDemand = Math.max(1e-9, ...m.clusters.map((c) => c.demand));
  const cl = sv("g", { class: "clusters" });
  for (const c of m.clusters) {
    const [x, y] = proj(c.lat, c.lon);
    const r = c.state === "up" ? 3 + 6 * Math.sqrt(c.demand / maxDemand) : 5;
    const attrs = {
      class: "cluster" + (state.selected === c.id ? " sel" : ""), cx: x.toFixed(1), cy: y.toFixed(1), r: r.toFixed(1),
      "data-id": c.id, "data-state": c.state, "data-util": c.utilization.toFixed(4),
    };
    if (c.state === "up") Object.assign(attrs, { fill: utilColor(c.utilization), stroke: "#0b0f14", "stroke-width": 1 });
    else if (c.state === "drained") Object.assign(attrs, { fill: "rgba(200,210,222,0.2)", stroke: "#e2e8f0", "stroke-width": 1.8, "stroke-dasharray": "2.5 1.5" });
    else Object.assign(attrs, { fill: "#222", stroke: "#ff5a5a", "stroke-width": 2 });
    const circle = sv("circle", attrs, sv("title", {}, `${c.id} (${c.state}): utilization ${pct(c.utilization)}, demand ${fmt(c.demand)}`));
    circle.addEventListener("click", () => select(c.id));
    cl.append(circle);
    if (c.state === "down") {
      cl.append(sv("path", { d: `M${x - r},${y - r} L${x + r},${y + r} M${x - r},${y + r} L${x + r},${y - r}`, stroke: "#ff5a5a", "stroke-width": 1.5, "pointer-events": "none" }));
    }
  }
  svg.append(cl);
  if (state.lookup) svg.append(lookupLayer(state.lookup, byId));
  if (state.preview) svg.append(previewLayer(state.preview.answer, byId));
  const note = document.getElementById("map-note");
  note.textContent = `${m.clusters.length} clusters · ${m.regions.length} client regions (${m.region_deg}° cells) · the ${m.flows.length} largest flows`;
  document.getElementById("map").replaceChildren(svg);
}

// The looked-up units: where they are, where their demand went (solid; a companion in blue),
// and the candidates they were passed over by (dashed).
function lookupLayer(units, byId) {
  const g = sv("g", { class: "lookup-layer", "pointer-events": "none" });
  for (const u of units) {
    const [x, y] = proj(u.lat, u.lon);
    for (const c of u.candidates) {
      const k = byId.get(c.cluster);
      if (!k || !["placed", "companion", "passed over"].includes(c.verdict)) continue;
      const [x2, y2] = proj(k.lat, k.lon);
      const held = c.verdict !== "passed over";
      g.append(sv("line", {
        x1: x, y1: y, x2, y2,
        stroke: { placed: "#ffd34d", companion: "#7fd4ff" }[c.verdict] || "#ff6b6b",
        "stroke-width": held ? (1.5 + 3 * c.share).toFixed(1) : 1.2,
        "stroke-dasharray": held ? null : "4 3",
      }));
    }
    g.append(sv("rect", { x: x - 4, y: y - 4, width: 8, height: 8, fill: "#ffd34d", stroke: "#000", transform: `rotate(45 ${x} ${y})` }));
  }
  return g;
}

function select(id) {
  state.selected = state.selected === id ? null : id;
  renderMap();
  renderTable();
  const row = document.querySelector(`#clusters tr[data-id="${CSS.escape(id)}"]`);
  if (row && state.selected) row.scrollIntoView({ block: "nearest" });
}

// --- charts ---------------------------------------------------------------------------------

// Every chart starts its y axis at 0 (all these figures are ≥ 0), so a dip of 1.1% looks like
// one; the x axis is the rounds' clock time.
const CHARTS = [
  { key: "solve_ms", label: "round time", unit: "ms", title: "wall time of the whole round (estimates, solve, index)" },
  { key: "churn", label: "churn", unit: "ratio", title: "share of the demand that moved since the round before" },
  { key: "overflow_share", label: "overflow", unit: "ratio", title: "share of the demand no candidate had room for" },
  { key: "mean_rtt_ms", label: "mean RTT", unit: "ms", title: "demand-weighted mean RTT of the placed demand" },
  { key: "demand", label: "demand", unit: "", title: "the demand the round mapped, in demand units" },
];
// What an axis names its unit.
const UNIT_NAME = { ms: "ms", ratio: "%", "": "demand units" };

function renderCharts() {
  const rounds = state.history;
  const box = document.getElementById("charts");
  // Drawn at the width of a column of #charts' grid (columns of at least CHART_MIN_PX), so
  // that text is drawn at its size, not scaled.
  const CHART_MIN_PX = 230, GAP = 8, PAD = 12;
  const total = box.clientWidth || 300;
  const cols = Math.max(1, Math.floor((total + GAP) / (CHART_MIN_PX + GAP)));
  const width = Math.max(200, Math.floor((total - GAP * (cols - 1)) / cols) - PAD);
  box.replaceChildren(...CHARTS.map((c) => chart(c, rounds, width)));
}

// "Nice" ticks from 0 to at least `hi`: 0, step, 2·step, … with step 1, 2 or 5 × 10^k.
function yTicks(hi, minTop) {
  const top = Math.max(hi, minTop);
  const raw = top / 4;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
  const n = Math.max(1, Math.ceil(top / step - 1e-9));
  return Array.from({ length: n + 1 }, (_, i) => i * step);
}

// Round clock times across [t0, t1] (Unix ms), at most `most` of them.
const TIME_STEPS_S = [10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
function xTicks(t0, t1, most) {
  const span = Math.max(1, (t1 - t0) / 1000);
  const step = (TIME_STEPS_S.find((s) => span / s <= most) || 7200) * 1000;
  const out = [];
  for (let t = Math.ceil(t0 / step) * step; t <= t1 && out.length < 64; t += step) out.push(t);
  return { ticks: out, step };
}

function clock(ms, seconds) {
  const d = new Date(ms), p = (n) => String(n).padStart(2, "0");
  return `${p(d.getHours())}:${p(d.getMinutes())}` + (seconds ? `:${p(d.getSeconds())}` : "");
}

function chart(c, rounds, cw) {
  const pts = rounds.map((r) => [r.at_unix_ms, r[c.key], r.version]).filter((p) => p[1] !== null && p[1] !== undefined);
  const ch = 118, left = 46, right = 8, top = 8, bottom = 20;
  const pw = cw - left - right, ph = ch - top - bottom;
  const svg = sv("svg", {
    viewBox: `0 0 ${cw} ${ch}`, width: cw, height: ch, role: "img",
    "aria-label": `${c.label} over the last ${pts.length} rounds`,
    "data-metric": c.key, "data-points": pts.length, "data-unit": UNIT_NAME[c.unit],
  });
  const last = pts.length ? pts[pts.length - 1][1] : null;
  const ys = pts.map((p) => p[1]);
  const hi = ys.length ? Math.max(...ys) : 0;
  // A ratio's axis shows at least 0–1%; others at least up to a small round figure.
  const yt = yTicks(hi, c.unit === "ratio" ? 0.01 : hi > 0 ? hi : 1);
  const yTop = yt[yt.length - 1];
  const now = pts.length ? pts[pts.length - 1][0] : Date.now();
  let t0 = pts.length ? pts[0][0] : now - 60000;
  if (now - t0 < 60000) t0 = now - 60000; // at least a minute wide
  const X = (t) => left + (pw * (t - t0)) / (now - t0);
  const Y = (v) => top + ph - (ph * v) / yTop;
  const axes = sv("g", { class: "axes" });
  for (const v of yt) {
    const y = Y(v).toFixed(1);
    axes.append(sv("line", { x1: left, x2: left + pw, y1: y, y2: y, class: v === 0 ? "base" : "grid" }));
    axes.append(sv("text", { x: left - 4, y: (Y(v) + 3).toFixed(1), class: "tick y", "text-anchor": "end" }, quantity(v, c.unit, yTop)));
  }
  const { ticks, step } = xTicks(t0, now, Math.max(2, Math.floor(pw / 70)));
  // A label is ~48 px wide: ticks too near an edge for it are left out.
  for (const t of ticks.filter((t) => X(t) - 24 >= left - 20 && X(t) + 24 <= cw)) {
    const x = X(t).toFixed(1);
    axes.append(sv("line", { x1: x, x2: x, y1: top + ph, y2: top + ph + 3, class: "base" }));
    axes.append(sv("text", { x, y: ch - 5, class: "tick x", "text-anchor": "middle" }, clock(t, step < 60000)));
  }
  axes.append(sv("line", { x1: left, x2: left, y1: top, y2: top + ph, class: "base" }));
  svg.append(axes);
  if (pts.length) {
    const xy = pts.map((p) => [X(p[0]), Y(p[1])]);
    const line = xy.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ");
    svg.append(sv("polygon", { points: `${xy[0][0].toFixed(1)},${Y(0).toFixed(1)} ${line} ${xy[xy.length - 1][0].toFixed(1)},${Y(0).toFixed(1)}`, fill: "rgba(79,179,255,0.12)" }));
    svg.append(sv("polyline", { points: line, fill: "none", stroke: "#4fb3ff", "stroke-width": 1.5 }));
    const [lx, ly] = xy[xy.length - 1];
    svg.append(sv("circle", { cx: lx.toFixed(1), cy: ly.toFixed(1), r: 2.5, fill: "#fff" }));
    // Hover: each round's value (a wide invisible target around each point).
    const hits = sv("g", { class: "hits" });
    pts.forEach((p, i) => hits.append(sv("circle", { cx: xy[i][0].toFixed(1), cy: xy[i][1].toFixed(1), r: 5, fill: "transparent" },
      sv("title", {}, `${c.label} ${quantity(p[1], c.unit)} · map v${p[2]} at ${clock(p[0], true)}`))));
    svg.append(hits);
  }
  const unitName = c.unit === "ms" && yTop >= 1000 ? "s" : UNIT_NAME[c.unit];
  return el("div", { class: "chart", title: `${c.title}; ${pts.length} rounds` },
    el("div", { class: "head" }, el("span", { class: "chart-title" }, `${c.label} (${unitName})`),
      el("b", { class: "last" }, last === null ? "—" : quantity(last, c.unit))),
    svg);
}

// --- the cluster table ----------------------------------------------------------------------

// Down first, then drained, then up: with "drained & down first" on (the default), the clusters
// an operator took out of service head the table whatever it is sorted by.
const STATE_ORDER = { down: 0, drained: 1, up: 2 };
// What each sortable column sorts by.
const SORT_KEYS = {
  id: (c) => c.id,
  state: (c) => STATE_ORDER[c.state],
  demand: (c) => c.demand,
  utilization: (c) => c.utilization,
  capacity: (c) => (c.nodes.length ? c.nodes[0].capacity : 0), // the root node's (the uplink)
  units: (c) => c.units,
  top: (c) => (c.top_units.length ? c.top_units[0].amount : 0),
};

function renderTable() {
  const q = document.getElementById("filter").value.trim().toLowerCase();
  const pin = document.getElementById("pin-out").checked;
  const { key, desc } = state.sort;
  const by = SORT_KEYS[key] || SORT_KEYS.demand;
  const rows = state.clusters.filter((c) => !q || c.id.toLowerCase().includes(q) || c.state.includes(q));
  rows.sort((a, b) => {
    if (pin && (a.state === "up") !== (b.state === "up")) return STATE_ORDER[a.state] - STATE_ORDER[b.state];
    const x = by(a), y = by(b);
    const r = x < y ? -1 : x > y ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    return desc ? -r : r;
  });
  document.querySelectorAll("#clusters th[data-sort]").forEach((th) => {
    const on = th.dataset.sort === key;
    th.classList.toggle("sorted", on);
    th.classList.toggle("desc", on && desc);
    th.setAttribute("aria-sort", on ? (desc ? "descending" : "ascending") : "none");
  });
  const out = state.clusters.filter((c) => c.state !== "up").length;
  document.getElementById("table-note").textContent =
    `${rows.length} of ${state.clusters.length} shown` + (out ? ` · ${out} out of service` : "");
  const tbody = document.querySelector("#clusters tbody");
  tbody.replaceChildren(...rows.map(row));
  renderMode();
}

function bar(u, label) {
  return el("div", { class: "bar", title: label },
    el("i", { style: `width:${Math.min(100, 100 * u).toFixed(1)}%;background:${utilColor(u)}` }),
    el("span", {}, label));
}

// A resource node's load and capacity in its unit (one prefix for both) and how full it is.
function nodeLabel(n) {
  return `${n.name} ${quantity(n.load, n.kind, n.capacity, true)} / ${quantity(n.capacity, n.kind)} · ${pct(n.utilization)}`;
}

// The actions of a cluster, labelled by what they do from its state: the one that takes a
// drained cluster back is "Undrain", a down one "Mark up" (both ask for the state "up").
function actions(c) {
  const up = c.state === "down" ? "Mark up" : "Undrain";
  return [["drain", "drained", "Drain"], ["undrain", "up", up], ["down", "down", "Mark down"]]
    .filter(([, target]) => target !== c.state)
    .map(([action, target, label]) => el("button", {
      "data-action": action, "data-cluster": c.id,
      title: `${label} ${c.id}: preview what the next round would do, then confirm (the map follows in the next round)`,
      onclick: () => previewAction(c.id, target, label),
    }, label));
}

function row(c) {
  const pending = c.map_state && c.map_state !== c.state ? el("span", { class: "pending" }, `map: ${c.map_state} until the next round`) : null;
  return el("tr", { "data-id": c.id, "data-state": c.state, "data-demand": c.demand, class: `st-${c.state}` + (state.selected === c.id ? " sel" : ""), onclick: (e) => { if (e.target.tagName !== "BUTTON") select(c.id); } },
    el("td", {}, c.id),
    el("td", { class: "state-cell" }, el("span", { class: `state ${c.state}` }, c.state), pending,
      c.capacity_factor < 1 ? el("span", { class: "derated", title: c.derated_because || "" }, `derated to ${pct(c.capacity_factor)}`) : null,
      c.health_down ? el("span", { class: "derated health-down", title: c.health_down }, "health checks: down") : null),
    el("td", { class: "actions" }, actions(c)),
    el("td", { class: "num" }, fmt(c.demand)),
    el("td", {}, bar(c.utilization, pct(c.utilization))),
    el("td", {}, el("div", { class: "nodes" }, c.nodes.map((n) => bar(n.utilization, nodeLabel(n))))),
    el("td", { class: "num" }, c.units),
    el("td", { class: "units" }, c.top_units.slice(0, 3).map((u) => el("div", { title: `${u.id} (${u.class}): ${fmt(u.amount)} demand units` }, `${u.id} `, el("b", {}, fmt(u.amount))))));
}

// An action is previewed first (POST /api/preview: the next round's map with the change, made by
// the rounds' own code) and applied only when confirmed; the confirmation sends what the
// operator saw, and the server applies it only if a preview made again then is still within
// that (409 otherwise: the page shows why and the new preview, and asks again).
async function previewAction(id, target, label) {
  const box = document.getElementById("confirm");
  box.hidden = false;
  box.replaceChildren(el("div", {}, `${label} ${id}: previewing the next round…`));
  try {
    const answer = await api("/api/preview", {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${token()}` },
      body: JSON.stringify({ changes: [{ cluster: id, state: target }] }),
    });
    state.preview = { id, target, label, answer };
    renderPreview();
  } catch (e) {
    state.preview = null;
    box.replaceChildren(el("div", { class: "error" }, `${label} ${id}: no preview: ${e.message}`),
      el("button", { onclick: closePreview }, "Close"));
  }
  renderMap();
}

// `why`: why the last confirmation was not applied; `guarded`: the guard refused it, so the
// way on is to force it with a reason (or cancel).
function renderPreview(why, guarded) {
  const p = state.preview, a = p.answer, b = a.before, f = a.after;
  const worse = f.overflow_share > b.overflow_share + 0.0005 || f.nodes_full > b.nodes_full;
  const rows = [
    ["overflow", pct(b.overflow_share), pct(f.overflow_share), f.overflow_share > b.overflow_share + 0.0005],
    ["resource nodes full", String(b.nodes_full), String(f.nodes_full), f.nodes_full > b.nodes_full],
    ["mean RTT", `${fmt(b.mean_rtt_ms, 1)} ms`, `${fmt(f.mean_rtt_ms, 1)} ms`, f.mean_rtt_ms > b.mean_rtt_ms + 0.05],
  ];
  document.getElementById("confirm").replaceChildren(
    why ? el("div", { class: "error" }, why) : "",
    el("div", { class: "confirm-headline", "data-moved": a.moved, "data-overflow-after": f.overflow_share, "data-based-on": a.based_on },
      `${p.label} ${p.id}? The next round would move `, el("b", {}, fmt(a.moved)), ` demand units (${pct(a.moved_share)} of the demand, `,
      `${a.units_changed} map units) · preview of map v${a.based_on}`),
    el("table", { class: "confirm-figures" },
      el("thead", {}, el("tr", {}, el("th", {}, ""), el("th", { class: "num" }, "now"), el("th", { class: "num" }, "after"))),
      el("tbody", {}, rows.map(([name, now, after, bad]) => el("tr", {},
        el("td", {}, name), el("td", { class: "num" }, now), el("td", { class: "num" + (bad ? " worse" : "") }, after))))),
    a.regions.length
      ? el("div", { class: "confirm-regions dim" }, "moved most from the clients around: ",
        a.regions.slice(0, 5).map((r) => `${fmt(r.lat, 1)}°, ${fmt(r.lon, 1)}° ${fmt(r.moved)} (${r.units} units)`).join(" · "))
      : "",
    a.changed_units.length
      ? el("div", { class: "confirm-units" }, "map units that move most (look one up: where it is now, and why): ",
        a.changed_units.map((u) => el("button", { class: "link", "data-unit": u.map_unit, onclick: () => lookup(u.map_unit) }, `${u.map_unit} ${fmt(u.moved)}`)))
      : "",
    a.flows.length
      ? el("table", { class: "diff-flows confirm-flows" },
        el("thead", {}, el("tr", {}, el("th", {}, "from"), el("th", {}, "to"), el("th", { class: "num" }, "demand"))),
        el("tbody", {}, a.flows.slice(0, 8).map((x) => el("tr", { "data-from": x.from, "data-to": x.to },
          el("td", {}, x.from), el("td", {}, x.to), el("td", { class: "num" }, fmt(x.demand))))))
      : el("div", { class: "dim" }, "nothing would move"),
    p.target === "drained"
      ? el("label", { class: "confirm-rounds", title: "ramped: the capacity stepped down over this many rounds (within the movement budget, if one is set), so the least attached demand moves first" },
        "over ", el("input", { id: "confirm-rounds", type: "number", min: "1", max: "1000", value: String(p.rounds || 1) }), " rounds (1: at once)")
      : "",
    el("div", { class: "confirm-buttons" },
      guarded
        ? el("button", { id: "confirm-force", class: "danger", title: "apply it past the guard: the reason typed above is required and logged", onclick: () => confirmAction(true) }, `Force: ${p.label} ${p.id}`)
        : el("button", { id: "confirm-apply", class: worse ? "danger" : "", onclick: () => confirmAction(false) }, `Confirm: ${p.label} ${p.id}`),
      el("button", { id: "confirm-cancel", onclick: closePreview }, "Cancel")));
}

function closePreview() {
  state.preview = null;
  const box = document.getElementById("confirm");
  box.hidden = true;
  box.replaceChildren();
  renderMap();
}

function actionHeaders() {
  return {
    "content-type": "application/json",
    authorization: `Bearer ${token()}`,
    "x-operator": document.getElementById("operator").value || "",
  };
}

// Applies the previewed action: at once, or (a drain over more than one round) as a ramp.
async function confirmAction(force) {
  const p = state.preview;
  if (!p) return;
  const roundsBox = document.getElementById("confirm-rounds");
  p.rounds = roundsBox ? Math.max(1, Math.round(Number(roundsBox.value) || 1)) : 1;
  const reason = document.getElementById("reason").value || "";
  const expect = { overflow_share: p.answer.after.overflow_share, moved: p.answer.moved };
  try {
    const at = `/api/clusters/${encodeURIComponent(p.id)}`;
    const body = p.rounds > 1
      ? { to: "drained", rounds: p.rounds, reason, expect, force }
      : { state: p.target, reason, expect, force };
    await api(p.rounds > 1 ? `${at}/ramp` : `${at}/state`, { method: "POST", headers: actionHeaders(), body: JSON.stringify(body) });
    closePreview();
  } catch (e) {
    // Not applied: the map moved past what was previewed (or another error). Preview again.
    const why = `${p.id} → ${p.target}: ${e.message}`;
    flash(why);
    await previewAction(p.id, p.target, p.label);
    if (state.preview) {
      state.preview.rounds = p.rounds;
      renderPreview(why, /guard/.test(e.message));
    }
  }
  await refresh(true);
}

// A preview's moves on the map: the client regions whose demand moves (area ∝ demand), cluster to
// cluster (width ∝ demand), and what would overflow as a red ring on the cluster it leaves.
function previewLayer(a, byId) {
  const g = sv("g", { class: "preview-layer", "pointer-events": "none" });
  const most = Math.max(1e-9, ...a.regions.map((r) => r.moved));
  for (const r of a.regions) {
    const [x, y] = proj(r.lat, r.lon);
    g.append(sv("circle", { class: "moved-region", cx: x.toFixed(1), cy: y.toFixed(1), r: (2 + 10 * Math.sqrt(r.moved / most)).toFixed(1), fill: "rgba(197,140,255,0.35)", stroke: "#c58cff" }));
  }
  const max = Math.max(1e-9, ...a.flows.map((x) => x.demand));
  for (const x of a.flows) {
    const from = byId.get(x.from), to = byId.get(x.to);
    if (!from) continue;
    const [x1, y1] = proj(from.lat, from.lon);
    const w = (1 + 4 * Math.sqrt(x.demand / max)).toFixed(1);
    if (!to) {
      g.append(sv("circle", { cx: x1.toFixed(1), cy: y1.toFixed(1), r: 9, fill: "none", stroke: "#ff5a5a", "stroke-width": w, "data-from": x.from, "data-to": x.to }));
      continue;
    }
    const [x2, y2] = proj(to.lat, to.lon);
    g.append(sv("line", { x1: x1.toFixed(1), y1: y1.toFixed(1), x2: x2.toFixed(1), y2: y2.toFixed(1), stroke: "#c58cff", "stroke-width": w, "data-from": x.from, "data-to": x.to }));
  }
  return g;
}

function flash(msg) {
  const b = document.getElementById("banner");
  b.textContent = msg;
  b.className = "banner";
  b.hidden = false;
  state.flashUntil = Date.now() + 8000;
}

// --- lookup and events ----------------------------------------------------------------------

async function lookup(q) {
  const box = document.getElementById("lookup");
  box.replaceChildren(el("div", {}, "looking up…"));
  try {
    const r = await api(`/api/lookup?q=${encodeURIComponent(q)}`);
    state.lookup = r.units;
    renderMap();
    box.replaceChildren(...r.units.map((u) => el("div", { class: "unit", "data-unit": u.id },
      el("div", {}, el("b", {}, u.id), ` · ${u.class} · demand ${fmt(u.demand)} · ${u.prefix_count} prefix(es)${u.matched_prefix_len !== null ? ` · matched /${u.matched_prefix_len}` : ""} · at ${u.lat.toFixed(1)}, ${u.lon.toFixed(1)}`),
      el("div", {}, "went to: ", u.placed.map((p) => `${p.cluster} ${pct(p.share)}`).join(", ") || "nowhere", u.companion ? ` · companion ${u.companion.cluster} ${pct(u.companion.share)} (named second in every answer)` : "", u.overflow > 0 ? ` · overflow ${pct(u.overflow_share)}` : "", " · answered: ", el("b", { class: `route ${u.route}` }, u.route)),
      el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "candidate"), el("th", { class: "num" }, "score"), el("th", {}, "from"), el("th", {}, "state"), el("th", { class: "num" }, "share"), el("th", {}, "verdict"), el("th", {}, "why"))),
        el("tbody", {}, shownCandidates(u.candidates).map((c) => c.more ? el("tr", {}, el("td", { colspan: 7, class: "why" }, `… and ${c.more} more candidates, less preferred than where all of the demand went`)) : el("tr", {},
          el("td", {}, c.cluster), el("td", { class: "num" }, fmt(c.score, 1)),
          el("td", { class: c.measured ? "score-measured" : "score-estimated", title: c.measured ? `measured RTT; the estimate was ${fmt(c.estimate, 1)}` : "estimated (no RTT measured)" }, c.measured ? "measured" : "estimated"),
          el("td", {}, el("span", { class: `state ${c.state}` }, c.state)),
          el("td", { class: "num" }, pct(c.share)), el("td", { class: { placed: "verdict-placed", companion: "verdict-placed", "passed over": "verdict-passed" }[c.verdict] || "" }, c.verdict),
          el("td", { class: "why" }, c.why))))))));
  } catch (e) {
    state.lookup = null;
    renderMap();
    box.replaceChildren(el("div", { class: "error" }, e.message));
  }
}

// Two stored map versions compared (GET /api/diff, with the admin token): how much demand moved,
// between which clusters, and the units that moved most.
async function compareVersions(from, to) {
  const box = document.getElementById("diff");
  box.replaceChildren(el("div", {}, "comparing…"));
  try {
    const d = await api(`/api/diff?from=${from}&to=${to || 0}&flows=20&units=20`, { headers: { authorization: `Bearer ${token()}` } });
    box.replaceChildren(
      el("div", { class: "diff-headline", "data-moved": d.moved, "data-to": d.to },
        `v${d.from} → v${d.to}: `, el("b", {}, fmt(d.moved)), ` of ${fmt(d.demand)} demand moved (${pct(d.moved_share)}) · `,
        `${d.units_changed} of ${d.units_compared} map units changed`,
        d.units_added || d.units_removed ? ` · ${d.units_added} added, ${d.units_removed} removed` : ""),
      d.flows.length
        ? el("table", { class: "diff-flows" },
          el("thead", {}, el("tr", {}, el("th", {}, "from"), el("th", {}, "to"), el("th", { class: "num" }, "demand"), el("th", { class: "num" }, "of the moved"))),
          el("tbody", {}, d.flows.map((f) => el("tr", { "data-from": f.from, "data-to": f.to, "data-demand": f.demand },
            el("td", {}, f.from), el("td", {}, f.to), el("td", { class: "num" }, fmt(f.demand)), el("td", { class: "num" }, pct(d.moved > 0 ? f.demand / d.moved : 0))))))
        : el("div", { class: "dim" }, "nothing moved"),
      d.flow_count > d.flows.length ? el("div", { class: "dim" }, `… and ${d.flow_count - d.flows.length} smaller flows`) : "",
      d.changed_units.length
        ? el("div", { class: "diff-units" }, "moved most: ", d.changed_units.map((u) => `${u.map_unit} ${fmt(u.moved)}`).join(", "))
        : "");
  } catch (e) {
    box.replaceChildren(el("div", { class: "error" }, e.message));
  }
}

// Every placed or passed-over candidate, and the first few of those not needed.
function shownCandidates(cands) {
  const NOT_NEEDED_SHOWN = 3;
  const out = [];
  let skipped = 0, notNeeded = 0;
  for (const c of cands) {
    if (c.verdict === "not needed" && ++notNeeded > NOT_NEEDED_SHOWN) { skipped++; continue; }
    out.push(c);
  }
  if (skipped) out.push({ more: skipped });
  return out;
}

function renderEstimator(e) {
  document.getElementById("estimator-note").textContent =
    !e.learning ? "learning off: configured coefficients" : e.confident ? "learned coefficients in use" : "learning; configured coefficients until confident";
  // Per demand unit: the Bps (shown in bits per second) and the Fps it costs, one per line.
  const per = (p) => [el("div", {}, quantity(p.bps, "bps")), el("div", {}, quantity(p.fps, "fps"))];
  const rows = e.coefficients.map((c) => el("tr", {}, el("td", {}, c.class), el("td", { class: "num" }, per(c.in_use)), el("td", { class: "num" }, per(c.learned)), el("td", { class: "num" }, per(c.configured))));
  const derated = e.derated.length
    ? e.derated.map((d) => el("div", { class: "derated-row", title: d.because || "" }, el("b", {}, d.cluster), ` capacity × ${fmt(d.capacity_factor, 2)}`, d.because ? ` — ${d.because}` : ""))
    : [el("div", { class: "dim" }, "no cluster derated")];
  document.getElementById("estimator").replaceChildren(
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "class: per demand unit"), el("th", { class: "num" }, "in use"), el("th", { class: "num" }, "learned"), el("th", { class: "num" }, "configured"))), el("tbody", {}, rows)),
    ...derated);
}

// The whole change history as a file (JSON lines): fetched with the token, saved by the browser.
async function exportHistory() {
  try {
    const r = await fetch("/api/events/export", { headers: { authorization: `Bearer ${token()}` } });
    if (!r.ok) throw new Error(((await r.json().catch(() => null)) || {}).error || `${r.status}`);
    const a = el("a", { href: URL.createObjectURL(await r.blob()), download: "cdnmap-history.jsonl" });
    document.body.append(a);
    a.click();
    a.remove();
  } catch (e) {
    flash(`export the history: ${e.message}`);
  }
}

function renderEvents(events) {
  const ul = document.getElementById("events");
  if (!events.length) { ul.replaceChildren(el("li", { class: "empty" }, "no actions yet")); return; }
  ul.replaceChildren(...events.map((e) => el("li", { class: e.ok ? "" : "failed", "data-seq": e.seq },
    el("time", {}, new Date(e.at_unix_ms).toISOString().replace("T", " ").slice(0, 19)),
    el("b", {}, e.who), ` (${e.remote}, ${e.via}) `, `${e.action} ${e.cluster}`,
    e.ok ? `: ${e.from_state} → ${e.to_state}` : `: failed: ${e.error}`,
    e.reason ? ` — “${e.reason}”` : "")));
}

// --- the loop -------------------------------------------------------------------------------

// The N-1 view: the single losses (a cluster, a site) that would hurt most, worst first, with
// what each would do; "exact" where the rounds' own code previewed it, "estimate" otherwise.
function renderN1(n) {
  const box = document.getElementById("n1");
  const note = document.getElementById("n1-note");
  if (!n.ready) {
    note.textContent = "the first sweep comes a minute after the start";
    box.replaceChildren();
    return;
  }
  note.textContent = `map v${n.version} · ${n.cluster_count} clusters, ${n.site_count} sites in ${fmt(n.sweep_ms + n.exact_ms, 0)} ms` +
    (n.complete ? "" : " · incomplete (past its time budget)") + ` · overflow now ${pct(n.overflow_share)}`;
  const table = (title, rows) => el("table", { class: "n1-table" },
    el("thead", {}, el("tr", {}, el("th", {}, title), el("th", { class: "num" }, "demand there"), el("th", { class: "num" }, "overflow after"),
      el("th", { class: "num" }, "nodes pushed full"), el("th", { class: "num" }, "RTT shift"), el("th", {}, ""))),
    el("tbody", {}, rows.map((r) => el("tr", { "data-name": r.name, "data-overflow": r.overflow_share },
      el("td", {}, r.name), el("td", { class: "num" }, fmt(r.demand)),
      el("td", { class: "num" + (r.overflow_share > n.overflow_share + 0.01 ? " worse" : "") }, pct(r.overflow_share)),
      el("td", { class: "num" + (r.nodes_full_added > 0 ? " worse" : "") }, String(r.nodes_full_added)),
      el("td", { class: "num" }, `${r.rtt_shift_ms >= 0 ? "+" : ""}${fmt(r.rtt_shift_ms, 2)} ms`),
      el("td", { class: "dim", title: r.exact ? "previewed with the rounds' own code" : "estimated: the room the map leaves, no evictions" }, r.exact ? "exact" : "estimate")))));
  box.replaceChildren(table("cluster lost", n.clusters), n.sites.length ? table("site lost", n.sites) : "");
}

// The ramps: a drain or a capacity cut over rounds, each step within the movement budget; the
// running ones first, each with its progress and a Cancel (the cluster written back as it was).
function renderRamps(r) {
  const box = document.getElementById("ramps");
  document.getElementById("ramps-note").textContent = r.budget == null
    ? "no movement budget (guard.max_moved_share_per_round)"
    : `movement budget ${pct(r.budget)} of the demand a round`;
  if (!r.ramps.length) {
    box.replaceChildren(el("div", { class: "dim" }, "none: ramp a drain from its preview (\"over N rounds\")"));
    return;
  }
  const goal = (g) => g.to === "drained" ? "drain" : `capacity to ${pct(g.scale)}`;
  box.replaceChildren(el("table", { class: "ramps-table" },
    el("thead", {}, el("tr", {}, ["cluster", "goal", "progress", "last step: estimated / observed move", "overflow at start → last round", "", ""].map((h) => el("th", {}, h)))),
    el("tbody", {}, r.ramps.slice(0, 10).map((x) => {
      const last = x.steps[x.steps.length - 1];
      const scale = last ? last.scale : 1;
      const progress = x.goal.to === "drained" ? 1 - scale : (1 - scale) / (1 - x.goal.scale);
      const seen = last && last.observed;
      return el("tr", { "data-cluster": x.cluster, "data-phase": x.phase },
        el("td", {}, x.cluster),
        el("td", { title: x.reason }, goal(x.goal)),
        el("td", {}, bar(progress, `step ${x.steps_written} (asked: ${x.rounds} rounds) · capacity ${pct(scale)}`)),
        el("td", { class: "num" }, last ? `${pct(last.estimated_moved_share)} / ${seen ? pct(seen.moved_share) : "…"}` : "—"),
        el("td", { class: "num" }, `${pct(x.baseline.overflow_share)} → ${seen ? pct(seen.overflow_share) : "…"}`),
        el("td", { class: x.phase === "rolled_back" || x.phase === "interrupted" ? "worse" : "", title: x.why || "" }, x.phase.replace("_", " ")),
        el("td", {}, x.phase === "running"
          ? el("button", { "data-cancel": x.cluster, title: "stop the ramp and write the cluster back as it was", onclick: () => cancelRamp(x.cluster) }, "Cancel")
          : ""));
    }))));
}

// The operator's policy (docs/policy.md): what it is, what it does to the map (cost beside mean
// RTT), and a JSON editor to preview a new one and apply it (held to the guard).
function renderPolicy(p) {
  const c = p.policy && p.policy.cost;
  document.getElementById("policy-note").textContent = c
    ? `map v${p.map_version}: cost ${fmt(p.cost)} at mean RTT ${fmt(p.mean_rtt_ms, 2)} ms`
    : "none: clusters are chosen by latency alone";
  document.getElementById("policy").replaceChildren(c
    ? el("div", { "data-weight": c.weight }, `cost: weight ${c.weight} ms per unit of price, guard ${c.guard_ms} ms, `,
      `${Object.keys(c.prices).length} clusters priced (others ${c.default_price})`)
    : "");
  const box = document.getElementById("policy-json");
  if (document.activeElement !== box && !box.dataset.edited) box.value = JSON.stringify(p.policy || {}, null, 1);
}

async function policyAction(preview) {
  const out = document.getElementById("policy-preview-out");
  let policy;
  try {
    policy = JSON.parse(document.getElementById("policy-json").value || "{}");
  } catch (e) {
    out.replaceChildren(el("div", { class: "error" }, `not JSON: ${e.message}`));
    return;
  }
  try {
    const a = await api("/api/policy", {
      method: "POST", headers: actionHeaders(),
      body: JSON.stringify({ policy, preview, reason: document.getElementById("reason").value || "" }),
    });
    if (preview) {
      const b = a.before, f = a.after;
      out.replaceChildren(el("div", { class: "policy-preview", "data-moved-share": a.moved_share },
        `would move ${pct(a.moved_share)} of the demand · overflow ${pct(b.overflow_share)} → ${pct(f.overflow_share)} · `,
        `mean RTT ${fmt(b.mean_rtt_ms, 2)} → ${fmt(f.mean_rtt_ms, 2)} ms · cost ${b.cost == null ? "—" : fmt(b.cost)} → ${f.cost == null ? "—" : fmt(f.cost)}`));
    } else {
      document.getElementById("policy-json").dataset.edited = "";
      out.replaceChildren(el("div", { class: "dim" }, "applied: the next round maps it"));
      renderPolicy(a);
    }
  } catch (e) {
    out.replaceChildren(el("div", { class: "error" }, e.message));
  }
}

async function cancelRamp(id) {
  try {
    await api(`/api/clusters/${encodeURIComponent(id)}/ramp/cancel`, {
      method: "POST", headers: actionHeaders(),
      body: JSON.stringify({ reason: document.getElementById("reason").value || "" }),
    });
  } catch (e) {
    flash(`cancel the ramp of ${id}: ${e.message}`);
  }
  await refresh(true);
}

async function refresh(force) {
  if (state.busy && !force) return;
  state.busy = true;
  try {
    const [s, ev] = await Promise.all([api("/api/status"), api("/api/events?limit=50")]);
    renderStatus(s);
    renderEvents(ev.events);
    if (!s.map_version) return; // no map yet: the banner says so
    const newest = ev.events.length ? ev.events[0].seq : 0;
    if (force || s.map_version !== state.version || newest !== state.lastEventSeq) {
      const [cl, m, h, est, n1, ramps, policy] = await Promise.all([api("/api/clusters?top=3"), api("/api/map"), api("/api/history"), api("/api/estimator"), api("/api/n1?limit=10"), api("/api/ramps"), api("/api/policy")]);
      state.clusters = cl.clusters;
      state.map = m;
      state.history = h.rounds;
      // The version of the data drawn (a round may land between the reads: then the next poll
      // sees a version it has not drawn and reads again).
      state.version = cl.map_version;
      state.lastEventSeq = newest;
      renderMap();
      renderTable();
      renderCharts();
      renderEstimator(est);
      renderN1(n1);
      renderRamps(ramps);
      renderPolicy(policy);
      document.body.dataset.version = String(cl.map_version);
      document.body.dataset.mapVersion = String(m.map_version);
      document.body.dataset.ready = "1";
    }
  } catch (e) {
    flash(`the dashboard could not reach the server: ${e.message}`);
  } finally {
    state.busy = false;
  }
}

function init() {
  const t = document.getElementById("token");
  t.value = token();
  t.addEventListener("input", () => { sessionStorage.setItem("cdnmap.token", t.value); renderMode(); });
  const op = document.getElementById("operator");
  op.value = sessionStorage.getItem("cdnmap.operator") || "";
  op.addEventListener("input", () => sessionStorage.setItem("cdnmap.operator", op.value));
  document.getElementById("filter").addEventListener("input", renderTable);
  document.getElementById("export-history").addEventListener("click", exportHistory);
  document.getElementById("policy-json").addEventListener("input", (e) => { e.target.dataset.edited = "1"; });
  document.getElementById("policy-preview").addEventListener("click", () => policyAction(true));
  document.getElementById("policy-apply").addEventListener("click", () => policyAction(false));
  document.getElementById("pin-out").addEventListener("change", renderTable);
  // A header sorts by its column: click, or Enter / Space when it has the focus; again reverses.
  document.querySelectorAll("#clusters th[data-sort]").forEach((th) => {
    const sortBy = () => {
      const k = th.dataset.sort;
      state.sort = { key: k, desc: state.sort.key === k ? !state.sort.desc : k !== "id" && k !== "state" };
      renderTable();
    };
    th.tabIndex = 0;
    th.addEventListener("click", sortBy);
    th.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(); } });
  });
  window.addEventListener("resize", () => { clearTimeout(state.resizeTimer); state.resizeTimer = setTimeout(renderCharts, 150); });
  document.getElementById("lookup-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = document.getElementById("lookup-q").value.trim();
    if (q) lookup(q);
  });
  document.getElementById("diff-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const from = document.getElementById("diff-from").value.trim();
    if (from) compareVersions(from, document.getElementById("diff-to").value.trim());
  });
  refresh(true);
  setInterval(() => refresh(false), POLL_MS);
}

init();
