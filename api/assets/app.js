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
  const a = Math.abs(x);
  if (digits !== undefined) return x.toFixed(digits);
  if (a >= 1e6) return (x / 1e6).toFixed(2) + "M";
  if (a >= 1e4) return (x / 1e3).toFixed(1) + "k";
  if (a >= 100) return x.toFixed(0);
  if (a >= 1) return x.toFixed(1);
  return x.toFixed(3);
}
const pct = (x) => (x === null || x === undefined ? "—" : (100 * x).toFixed(x < 0.01 ? 2 : 1) + "%");
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
    el("span", {}, "demand ", el("b", {}, fmt(s.demand))),
    el("span", {}, "overflow ", el("b", {}, pct(s.overflow_share))),
    el("span", {}, "churn ", el("b", {}, pct(s.churn))),
    el("span", {}, "mean RTT ", el("b", {}, s.mean_rtt_ms === null ? "—" : fmt(s.mean_rtt_ms, 1) + " ms")),
    el("span", {}, "solve ", el("b", {}, fmt(s.last_round.solve_ms, 0) + " ms")),
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
  document.querySelectorAll("#clusters button[data-action]").forEach((btn) => { btn.disabled = !can || btn.dataset.same === "1"; });
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
  const note = document.getElementById("map-note");
  note.textContent = `${m.clusters.length} clusters · ${m.regions.length} client regions (${m.region_deg}° cells) · the ${m.flows.length} largest flows`;
  document.getElementById("map").replaceChildren(svg);
}

// The looked-up units: where they are, where their demand went (solid), and the candidates
// they were passed over by (dashed).
function lookupLayer(units, byId) {
  const g = sv("g", { class: "lookup-layer", "pointer-events": "none" });
  for (const u of units) {
    const [x, y] = proj(u.lat, u.lon);
    for (const c of u.candidates) {
      const k = byId.get(c.cluster);
      if (!k || (c.verdict !== "placed" && c.verdict !== "passed over")) continue;
      const [x2, y2] = proj(k.lat, k.lon);
      g.append(sv("line", {
        x1: x, y1: y, x2, y2,
        stroke: c.verdict === "placed" ? "#ffd34d" : "#ff6b6b",
        "stroke-width": c.verdict === "placed" ? (1.5 + 3 * c.share).toFixed(1) : 1.2,
        "stroke-dasharray": c.verdict === "placed" ? null : "4 3",
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

const CHARTS = [
  { key: "solve_ms", label: "solve time", unit: "ms", f: (x) => fmt(x, 0) + " ms" },
  { key: "churn", label: "churn", f: pct },
  { key: "overflow_share", label: "overflow", f: pct },
  { key: "mean_rtt_ms", label: "demand-weighted mean RTT", f: (x) => fmt(x, 1) + " ms" },
  { key: "demand", label: "total demand", f: fmt },
];

function renderCharts() {
  const rounds = state.history;
  const box = document.getElementById("charts");
  box.replaceChildren(...CHARTS.map((c) => chart(c, rounds)));
}

function chart(c, rounds) {
  const pts = rounds.map((r) => [r.version, r[c.key]]).filter((p) => p[1] !== null && p[1] !== undefined);
  const cw = 300, ch = 64, pad = 3;
  const svg = sv("svg", { viewBox: `0 0 ${cw} ${ch}`, preserveAspectRatio: "none", "data-metric": c.key, "data-points": pts.length });
  const last = pts.length ? pts[pts.length - 1][1] : null;
  if (pts.length) {
    const ys = pts.map((p) => p[1]);
    let lo = Math.min(...ys), hi = Math.max(...ys);
    if (c.key !== "demand" && c.key !== "mean_rtt_ms") lo = Math.min(0, lo);
    if (hi - lo < 1e-12) { hi = lo + (Math.abs(lo) || 1) * 0.1; lo = lo - (hi - lo); }
    const n = Math.max(1, pts.length - 1);
    const xy = pts.map((p, i) => [pad + ((cw - 2 * pad) * (pts.length === 1 ? 0.5 : i / n)), ch - pad - ((ch - 2 * pad) * (p[1] - lo)) / (hi - lo)]);
    const line = xy.map((p) => p[0].toFixed(1) + "," + p[1].toFixed(1)).join(" ");
    svg.append(sv("polygon", { points: `${xy[0][0].toFixed(1)},${ch} ${line} ${xy[xy.length - 1][0].toFixed(1)},${ch}`, fill: "rgba(79,179,255,0.12)" }));
    svg.append(sv("polyline", { points: line, fill: "none", stroke: "#4fb3ff", "stroke-width": 1.5, "vector-effect": "non-scaling-stroke" }));
    const [lx, ly] = xy[xy.length - 1];
    svg.append(sv("circle", { cx: lx, cy: ly, r: 2.5, fill: "#fff" }));
    svg.append(sv("title", {}, `${c.label}: min ${c.f(Math.min(...ys))}, max ${c.f(Math.max(...ys))} over ${pts.length} rounds (v${pts[0][0]}–v${pts[pts.length - 1][0]})`));
  }
  return el("div", { class: "chart" },
    el("div", { class: "head" }, el("span", {}, c.label, ` · ${pts.length} rounds`), el("b", {}, last === null ? "—" : c.f(last))),
    svg);
}

// --- the cluster table ----------------------------------------------------------------------

const STATE_ORDER = { up: 0, drained: 1, down: 2 };

function renderTable() {
  const q = document.getElementById("filter").value.trim().toLowerCase();
  const { key, desc } = state.sort;
  const rows = state.clusters.filter((c) => !q || c.id.toLowerCase().includes(q));
  rows.sort((a, b) => {
    let x, y;
    if (key === "state") { x = STATE_ORDER[a.state]; y = STATE_ORDER[b.state]; }
    else { x = a[key]; y = b[key]; }
    const r = x < y ? -1 : x > y ? 1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    return desc ? -r : r;
  });
  document.querySelectorAll("#clusters th[data-sort]").forEach((th) => {
    th.classList.toggle("sorted", th.dataset.sort === key);
    th.classList.toggle("desc", th.dataset.sort === key && desc);
  });
  const tbody = document.querySelector("#clusters tbody");
  tbody.replaceChildren(...rows.map(row));
  renderMode();
}

function bar(u, label) {
  return el("div", { class: "bar", title: label },
    el("i", { style: `width:${Math.min(100, 100 * u).toFixed(1)}%;background:${utilColor(u)}` }),
    el("span", {}, label));
}

function row(c) {
  const pending = c.map_state && c.map_state !== c.state ? el("span", { class: "pending" }, `map: ${c.map_state} until the next round`) : null;
  const actions = [["drain", "drained", "Drain"], ["undrain", "up", "Undrain"], ["down", "down", "Mark down"]].map(([action, target, label]) =>
    el("button", {
      "data-action": action, "data-cluster": c.id, "data-same": c.state === target ? "1" : "0",
      title: `${label} ${c.id}`, onclick: () => act(c.id, target),
    }, label));
  return el("tr", { "data-id": c.id, "data-state": c.state, "data-demand": c.demand, class: state.selected === c.id ? "sel" : "", onclick: (e) => { if (e.target.tagName !== "BUTTON") select(c.id); } },
    el("td", {}, c.id),
    el("td", { class: "state-cell" }, el("span", { class: `state ${c.state}` }, c.state), pending,
      c.capacity_factor < 1 ? el("span", { class: "derated", title: c.derated_because || "" }, `derated to ${pct(c.capacity_factor)}`) : null,
      c.health_down ? el("span", { class: "derated health-down", title: c.health_down }, "health checks: down") : null),
    el("td", { class: "num" }, fmt(c.demand)),
    el("td", {}, bar(c.utilization, pct(c.utilization))),
    el("td", {}, el("div", { class: "nodes" }, c.nodes.map((n) => bar(n.utilization, `${n.name} (${n.kind}) ${fmt(n.load)} / ${fmt(n.capacity)}`)))),
    el("td", { class: "num" }, c.units),
    el("td", { class: "units" }, c.top_units.slice(0, 3).map((u) => el("div", { title: `${u.id} (${u.class}): ${fmt(u.amount)}` }, `${u.id} `, el("b", {}, fmt(u.amount))))),
    el("td", { class: "actions" }, actions));
}

async function act(id, target) {
  const t = token();
  try {
    await api(`/api/clusters/${encodeURIComponent(id)}/state`, {
      method: "POST",
      headers: {
        "content-type": "application/json",
        authorization: `Bearer ${t}`,
        "x-operator": document.getElementById("operator").value || "",
      },
      body: JSON.stringify({ state: target, reason: document.getElementById("reason").value || "" }),
    });
  } catch (e) {
    flash(`${id} → ${target}: ${e.message}`);
  }
  await refresh(true);
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
      el("div", {}, "went to: ", u.placed.map((p) => `${p.cluster} ${pct(p.share)}`).join(", ") || "nowhere", u.overflow > 0 ? ` · overflow ${pct(u.overflow_share)}` : "", " · answered: ", el("b", { class: `route ${u.route}` }, u.route)),
      el("table", {},
        el("thead", {}, el("tr", {}, el("th", {}, "candidate"), el("th", { class: "num" }, "score"), el("th", {}, "from"), el("th", {}, "state"), el("th", { class: "num" }, "share"), el("th", {}, "verdict"), el("th", {}, "why"))),
        el("tbody", {}, shownCandidates(u.candidates).map((c) => c.more ? el("tr", {}, el("td", { colspan: 7, class: "why" }, `… and ${c.more} more candidates, less preferred than where all of the demand went`)) : el("tr", {},
          el("td", {}, c.cluster), el("td", { class: "num" }, fmt(c.score, 1)),
          el("td", { class: c.measured ? "score-measured" : "score-estimated", title: c.measured ? `measured RTT; the estimate was ${fmt(c.estimate, 1)}` : "estimated (no RTT measured)" }, c.measured ? "measured" : "estimated"),
          el("td", {}, el("span", { class: `state ${c.state}` }, c.state)),
          el("td", { class: "num" }, pct(c.share)), el("td", { class: c.verdict === "placed" ? "verdict-placed" : c.verdict === "passed over" ? "verdict-passed" : "" }, c.verdict),
          el("td", { class: "why" }, c.why))))))));
  } catch (e) {
    state.lookup = null;
    renderMap();
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
  const per = (p) => `${fmt(p.bps)} / ${fmt(p.fps)}`;
  const rows = e.coefficients.map((c) => el("tr", {}, el("td", {}, c.class), el("td", { class: "num" }, per(c.in_use)), el("td", { class: "num" }, per(c.learned)), el("td", { class: "num" }, per(c.configured))));
  const derated = e.derated.length
    ? e.derated.map((d) => el("div", { class: "derated-row", title: d.because || "" }, el("b", {}, d.cluster), ` capacity × ${fmt(d.capacity_factor, 2)}`, d.because ? ` — ${d.because}` : ""))
    : [el("div", { class: "dim" }, "no cluster derated")];
  document.getElementById("estimator").replaceChildren(
    el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "class: bps / fps per unit"), el("th", { class: "num" }, "in use"), el("th", { class: "num" }, "learned"), el("th", { class: "num" }, "configured"))), el("tbody", {}, rows)),
    ...derated);
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
      const [cl, m, h, est] = await Promise.all([api("/api/clusters?top=3"), api("/api/map"), api("/api/history"), api("/api/estimator")]);
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
  document.querySelectorAll("#clusters th[data-sort]").forEach((th) => th.addEventListener("click", () => {
    const k = th.dataset.sort;
    state.sort = { key: k, desc: state.sort.key === k ? !state.sort.desc : k !== "id" && k !== "state" };
    renderTable();
  }));
  document.getElementById("lookup-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = document.getElementById("lookup-q").value.trim();
    if (q) lookup(q);
  });
  refresh(true);
  setInterval(() => refresh(false), POLL_MS);
}

init();
