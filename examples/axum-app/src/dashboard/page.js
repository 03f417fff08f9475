// The operator dashboard's script, served at /admin/dashboard/app.js.
"use strict";
const TOKEN = "tollgate-admin-token";
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);

// Every value is set as text, never as markup: keys and policy names
// come from clients and configuration.
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}
const fmt = (n) => Number(n).toLocaleString("en-US");
// A number read from /metrics: the metric and labels it is the sum of.
function num(value, metric, labels, cls) {
  const node = el("span", { class: "n" + (cls ? " " + cls : "") }, fmt(value));
  node.dataset.metric = metric;
  node.dataset.labels = JSON.stringify(labels || {});
  return node;
}
function table(head, rows, empty) {
  if (rows.length === 0) return el("div", { class: "empty" }, empty);
  const tr = (cells, th) => el("tr", {}, ...cells.map((c, i) => el(th ? "th" : "td", i > 0 ? { class: "r" } : {}, c)));
  return el("table", {}, el("thead", {}, tr(head, true)), el("tbody", {}, ...rows.map((r) => tr(r))));
}

function chart(times, rates) {
  const w = 360, h = 90, pad = 2;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  svg.setAttribute("role", "img");
  const series = [["allowed", "#1a7f37"], ["limited", "#cf222e"], ["shadow_limited", "#bf8700"]];
  const max = Math.max(1, ...series.flatMap(([k]) => (rates && rates[k]) || []));
  const frame = document.createElementNS(SVG, "rect");
  Object.entries({ x: 0, y: 0, width: w, height: h, fill: "#fbfcfd", stroke: "#eaeef2" }).forEach(([k, v]) => frame.setAttribute(k, v));
  svg.append(frame);
  const label = document.createElementNS(SVG, "text");
  Object.entries({ x: 4, y: 12, "font-size": 10, fill: "#57606a" }).forEach(([k, v]) => label.setAttribute(k, v));
  label.textContent = `${fmt(max)}/s`;
  svg.append(label);
  const n = times.length;
  for (const [key, color] of series) {
    const values = (rates && rates[key]) || [];
    if (values.length < 2) continue;
    const points = values.map((v, i) => {
      const x = pad + (w - 2 * pad) * (i + 300 - n) / 299;
      const y = h - pad - (h - 2 * pad - 14) * v / max;
      return `${x.toFixed(1)},${y.toFixed(1)}`;
    });
    const line = document.createElementNS(SVG, "polyline");
    line.setAttribute("points", points.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", color);
    line.setAttribute("stroke-width", "1.5");
    line.dataset.series = key;
    svg.append(line);
  }
  return svg;
}

function keys(top, ranking) {
  const part = top && top[ranking];
  if (!part) return el("div");
  if (part.error) return el("div", { class: "empty" }, "unavailable: " + part.error);
  const rows = part.keys.map((k) => [k.label, el("span", { class: "n" }, fmt(k.count)), k.error ? "±" + fmt(k.error) : ""]);
  const t = table([ranking === "limited" ? "most limited" : "most active", "count", ""], rows, "no " + ranking + " keys");
  t.dataset.ranking = ranking;
  return t;
}

function policy(p, times) {
  const total = (label, value, outcome, cls) =>
    el("div", {}, el("span", { class: "l" }, label), num(value, "tollgate_decisions_total", { policy: p.name, outcome }, cls));
  const card = el("div", { class: "card" },
    el("h3", {}, p.name),
    el("div", { class: "totals" },
      total("admitted", p.allowed, "allowed", "allowed"),
      total("limited", p.limited, "limited", "limited"),
      total("shadow", p.shadow_limited, "shadow_limited", "shadow"),
      el("div", {}, el("span", { class: "l" }, "near limit"), num(p.near_limit, "tollgate_near_limit_total", { policy: p.name }))),
    chart(times, p.rates),
    el("div", { class: "legend" }, el("span", {}, el("i", { style: "background:#1a7f37" }), "admitted/s"),
      el("span", {}, el("i", { style: "background:#cf222e" }), "limited/s"), el("span", {}, el("i", { style: "background:#bf8700" }), "shadow/s")),
    el("div", { class: "keys" }, keys(p.top, "limited"), keys(p.top, "active")));
  card.dataset.policy = p.name;
  return card;
}

function health(s) {
  const rows = [
    ["breakers open or probing", num(s.circuits_open, "tollgate_circuits_open", {})],
    ["deny-cache answers", num(s.deny_cache_hits, "tollgate_deny_cache_hits_total", {})],
    ["memory store keys", num(s.memory_keys, "tollgate_memory_store_keys", {})],
    ...Object.entries(s.errors).map(([kind, n]) => ["store errors: " + kind, num(n, "tollgate_store_errors_total", { outcome: kind })]),
    ...Object.entries(s.fallbacks).map(([o, n]) => ["failure policy: " + o, num(n, "tollgate_fallback_decisions_total", { outcome: o })]),
  ];
  return table(["", "total"], rows, "");
}

function latency(l) {
  if (!l.count) return el("div", { class: "empty" }, "no store calls timed (the memory store answers in process)");
  let previous = 0;
  const bars = l.buckets.map((b) => { const n = b.count - previous; previous = b.count; return [b.le, n, b.count]; });
  const max = Math.max(1, ...bars.map((b) => b[1]));
  const w = 360, h = 110, bw = w / bars.length;
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h}`);
  bars.forEach(([le, n], i) => {
    const r = document.createElementNS(SVG, "rect");
    const bh = (h - 24) * n / max;
    Object.entries({ x: i * bw + 2, y: h - 14 - bh, width: bw - 4, height: bh, fill: "#0969da" }).forEach(([k, v]) => r.setAttribute(k, v));
    svg.append(r);
    if (i % 3 !== 0 && le !== "+Inf") return;
    const t = document.createElementNS(SVG, "text");
    Object.entries({ x: i * bw + bw / 2, y: h - 3, "font-size": 8, "text-anchor": "middle", fill: "#57606a" }).forEach(([k, v]) => t.setAttribute(k, v));
    t.textContent = le === "+Inf" ? "more" : (Number(le) * 1000) + "ms";
    svg.append(t);
  });
  const rows = bars.map(([le, , cumulative]) => ["≤ " + (le === "+Inf" ? "∞" : Number(le) * 1000 + " ms"), num(cumulative, "tollgate_store_latency_seconds_bucket", { le })]);
  return el("div", {},
    el("div", { class: "totals" },
      el("div", {}, el("span", { class: "l" }, "calls"), num(l.count, "tollgate_store_latency_seconds_count", {})),
      el("div", {}, el("span", { class: "l" }, "mean"), el("span", { class: "n" }, (1000 * l.sum / l.count).toFixed(2) + " ms"))),
    svg, table(["latency", "calls"], rows, ""));
}

function capacity(d) {
  const l = d.leases;
  const leases = table(["leases", ""], [
    ["held now", num(l.held, "tollgate_leases_held", {})],
    ["units held unspent", num(l.units, "tollgate_lease_units_outstanding", {})],
    ["granted", num(l.grants, "tollgate_lease_grants_total", {})],
    ["decided without a lease", num(l.direct, "tollgate_lease_direct_decisions_total", {})],
    ["returned", num(l.returns, "tollgate_lease_returns_total", {})],
    ["until_ready waits admitted", num(d.waits.admitted, "tollgate_waits_total", { outcome: "admitted" })],
    ["until_ready waits given up", num(d.waits.gave_up, "tollgate_waits_total", { outcome: "gave_up" })],
  ], "");
  const slots = table(["in-flight limit", "slots held", "turned away"],
    d.in_flight.map((r) => [r.policy, num(r.slots, "tollgate_inflight_slots", { policy: r.policy }), num(r.rejected, "tollgate_inflight_rejected_total", { policy: r.policy })]),
    "no in-flight limits");
  return el("div", {}, leases, el("br"), slots);
}

function adaptive(rows) {
  return table(["policy", "limit", "running", "queued", "shed critical", "shed default", "shed sheddable"],
    rows.map((r) => [r.policy,
      num(r.limit, "tollgate_adaptive_limit", { policy: r.policy }),
      num(r.in_flight, "tollgate_adaptive_in_flight", { policy: r.policy }),
      num(r.queued, "tollgate_adaptive_queued", { policy: r.policy }),
      ...["critical", "default", "sheddable"].map((c) => num(r.shed[c], "tollgate_adaptive_shed_total", { policy: r.policy, priority: c }))]),
    "no adaptive limits");
}

function render(d) {
  $("store").textContent = "store: " + d.store.kind;
  const open = d.store.circuits_open > 0;
  $("breaker").textContent = open ? "breaker open" : "store healthy";
  $("breaker").className = "badge " + (open ? "bad" : "ok");
  const updated = $("updated");
  updated.textContent = new Date(d.at).toLocaleTimeString();
  updated.dataset.at = d.at;
  $("policies").replaceChildren(...d.policies.map((p) => policy(p, d.times || [])));
  $("health").replaceChildren(health(d.store));
  $("latency").replaceChildren(latency(d.store.latency));
  $("capacity").replaceChildren(capacity(d));
  $("adaptive").replaceChildren(adaptive(d.adaptive));
  $("overrides").replaceChildren(table(["key", "policy", "rule", "expires in"],
    d.overrides.map((o) => [o.key, o.policy, o.rule, o.expires_in_s === null ? "never" : fmt(o.expires_in_s) + " s"]), "no overrides"));
  $("usage").replaceChildren(table(["user", "policy", "units this month"],
    d.usage.map((u) => [u.user, u.policy, typeof u.month === "number" ? fmt(u.month) : "unavailable"]), "no usage yet"));
}

function login(message) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
}

async function refresh() {
  const token = sessionStorage.getItem(TOKEN);
  if (!token) return login();
  let response;
  try {
    response = await fetch("/admin/dashboard/data", { headers: { Authorization: "Bearer " + token }, cache: "no-store" });
  } catch (e) {
    $("updated").textContent = "the demo is not answering";
    return;
  }
  if (response.status === 401 || response.status === 403) {
    sessionStorage.removeItem(TOKEN);
    return login("That token was refused.");
  }
  if (!response.ok) return;
  const data = await response.json();
  if (!data.at) return;
  $("login").hidden = true;
  $("main").hidden = false;
  render(data);
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN, $("token").value);
  $("token").value = "";
  refresh();
});
refresh();
setInterval(refresh, 1000);
