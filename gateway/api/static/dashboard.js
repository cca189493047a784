// Switchyard cost dashboard: reads the admin API and draws SVG charts (no libraries, no CDN).
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#3b6fd8", "#e0803a", "#3aa57a", "#c4456a", "#7d5bc9", "#9a8a3a", "#3a9ab0", "#b0603a"];

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

// Amounts as currency: cents from a cent up ($1,234.56), three significant digits below
// ($0.000000100), never an exponent.
const CENTS = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", minimumFractionDigits: 2, maximumFractionDigits: 2 });
const SMALL = new Intl.NumberFormat("en-US", { style: "currency", currency: "USD", minimumSignificantDigits: 3, maximumSignificantDigits: 3 });

function usd(value) {
  const n = Number(value);
  if (n === 0) return "$0";
  return Math.abs(n) < 0.01 ? SMALL.format(n) : CENTS.format(n);
}

async function api(path) {
  // location.origin, not the page's URL: a page opened as http://admin:KEY@host/dashboard has
  // credentials in its URL, and fetch refuses URLs that carry them. The session cookie set
  // with the page authenticates these calls.
  const url = new URL(path, window.location.origin);
  const response = await fetch(url, { credentials: "same-origin", headers: { accept: "application/json" } });
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

function empty(container, chartId) {
  container.replaceChildren();
  const svg = el("svg", { width: 440, height: 40, "data-chart": chartId, "data-points": 0 }, container);
  const text = el("text", { x: 8, y: 24, class: "empty" }, svg);
  text.textContent = "no data in this window";
}

// Vertical bars: one per time bucket.
function columnChart(container, chartId, points) {
  if (!points.length) return empty(container, chartId);
  container.replaceChildren();
  const width = 440, height = 220, left = 60, bottom = 40, top = 10;
  const max = Math.max(...points.map((p) => p.value), 1e-12);
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, "data-chart": chartId, "data-points": points.length }, container);
  el("line", { x1: left, y1: top, x2: left, y2: height - bottom, class: "axis" }, svg);
  el("line", { x1: left, y1: height - bottom, x2: width - 8, y2: height - bottom, class: "axis" }, svg);
  const maxLabel = el("text", { x: 4, y: top + 10 }, svg);
  maxLabel.textContent = usd(max);
  const slot = (width - left - 8) / points.length;
  points.forEach((p, i) => {
    const h = ((height - bottom - top) * p.value) / max;
    const x = left + i * slot + slot * 0.15;
    const bar = el("rect", {
      x, y: height - bottom - h, width: Math.max(1, slot * 0.7), height: Math.max(0, h),
      fill: COLORS[0], "data-label": p.label, "data-value": p.value,
    }, svg);
    el("title", {}, bar).textContent = `${p.label}: ${usd(p.value)}`;
    if (points.length <= 12 || i % Math.ceil(points.length / 12) === 0) {
      const t = el("text", { x: x, y: height - bottom + 14 }, svg);
      t.textContent = p.label.length > 10 ? p.label.slice(5) : p.label;
    }
  });
}

function percent(value) {
  return (Number(value) * 100).toFixed(1) + "%";
}

// Horizontal bars: one per group (model, tenant, cause); `format` writes a value.
function barChart(container, chartId, points, format = usd, fixedMax = null) {
  if (!points.length) return empty(container, chartId);
  container.replaceChildren();
  const rowH = 26, left = 130, width = 440;
  const height = points.length * rowH + 10;
  const max = fixedMax || Math.max(...points.map((p) => Math.abs(p.value)), 1e-12);
  const svg = el("svg", { width, height, viewBox: `0 0 ${width} ${height}`, "data-chart": chartId, "data-points": points.length }, container);
  points.forEach((p, i) => {
    const y = 5 + i * rowH;
    const label = el("text", { x: 4, y: y + 15 }, svg);
    label.textContent = p.label.length > 18 ? p.label.slice(0, 17) + "…" : p.label;
    const w = ((width - left - 80) * Math.abs(p.value)) / max;
    const bar = el("rect", {
      x: left, y, width: Math.max(1, w), height: rowH - 8, fill: COLORS[i % COLORS.length],
      "data-label": p.label, "data-value": p.value,
    }, svg);
    el("title", {}, bar).textContent = `${p.label}: ${format(p.value)}`;
    const v = el("text", { x: left + w + 6, y: y + 15 }, svg);
    v.textContent = format(p.value);
  });
}

// Cached share of input tokens per group: cached / input over the window's rows.
function cachedShares(rows) {
  const sums = new Map();
  for (const r of rows) {
    const k = r.group === null || r.group === undefined ? "(none)" : String(r.group);
    const s = sums.get(k) || { cached: 0, input: 0 };
    s.cached += r.cached_tokens;
    s.input += r.input_tokens;
    sums.set(k, s);
  }
  return [...sums.entries()].filter(([, s]) => s.input > 0).map(([label, s]) => ({ label, value: s.cached / s.input }));
}

// A table of ``rows``: ``headers``, then per row the cells ``cells(r)`` gives; ``mark(tr, r)``
// sets the row's data attributes (what the tests read). ``emptyText`` when there are none.
function dataTable(container, emptyText, headers, rows, cells, mark = () => {}) {
  container.replaceChildren();
  if (!rows.length) {
    container.textContent = emptyText;
    container.className = "empty";
    return;
  }
  container.className = "";
  const table = document.createElement("table");
  const head = table.insertRow();
  for (const h of headers) {
    const th = document.createElement("th");
    th.textContent = h;
    head.appendChild(th);
  }
  for (const r of rows) {
    const tr = table.insertRow();
    mark(tr, r);
    for (const v of cells(r)) tr.insertCell().textContent = v;
  }
  container.appendChild(table);
}

function conversationsTable(container, rows) {
  const ordered = [...rows].sort((a, b) => Number(b.cost_usd) - Number(a.cost_usd));
  const share = (r) => (r.input_tokens ? r.cached_tokens / r.input_tokens : null);
  dataTable(
    container, "no conversations in this window",
    ["conversation", "requests", "spend", "input tokens", "cached share"], ordered,
    (r) => [r.group, String(r.requests), usd(r.cost_usd), String(r.input_tokens), share(r) === null ? "-" : percent(share(r))],
    (tr, r) => {
      tr.dataset.conversation = r.group;
      tr.dataset.cost = r.cost_usd;
      tr.dataset.cachedShare = share(r) === null ? "" : String(share(r));
    },
  );
}

function tasksTable(container, rows) {
  dataTable(
    container, "no tasks in this window", ["task", "requests", "spend", "rated", "quality"], rows,
    (r) => [r.group, String(r.requests), usd(r.cost_usd), String(r.rated), r.quality === null ? "-" : r.quality.toFixed(2)],
    (tr, r) => {
      tr.dataset.task = r.group;
      tr.dataset.quality = r.quality === null ? "" : String(r.quality);
    },
  );
}

// Mean feedback score per group, over the groups with rated requests.
function qualities(rows) {
  return rows.filter((r) => r.rated > 0 && r.group !== null).map((r) => ({ label: String(r.group), value: r.quality }));
}

function sumBy(rows, key, field) {
  const totals = new Map();
  for (const r of rows) {
    const k = r[key] === null || r[key] === undefined ? "(none)" : String(r[key]);
    totals.set(k, (totals.get(k) || 0) + Number(r[field]));
  }
  return [...totals.entries()].map(([label, value]) => ({ label, value }));
}

function budgetsTable(container, rows) {
  dataTable(
    container, "no budgets configured", ["scope", "name", "period", "limit", "spent", "remaining"], rows,
    (r) => [r.scope, r.name, r.period, usd(r.limit_usd), usd(r.spent_usd), usd(r.remaining_usd)],
  );
}

async function refresh() {
  const since = document.getElementById("since").value;
  const bucket = document.getElementById("bucket").value;
  const status = document.getElementById("status");
  status.textContent = "loading…";
  try {
    const q = (p) => `${p}&since=${encodeURIComponent(since)}`;
    const [time, byModel, byTenant, savings, budgets, byRoute, conversations, qualityModel, tasks] = await Promise.all([
      api(q(`/admin/spend?group_by=none&bucket=${bucket}`)),
      api(q("/admin/spend?group_by=model&bucket=none")),
      api(q("/admin/spend?group_by=tenant&bucket=none")),
      api(q("/admin/savings?bucket=none")),
      api("/admin/budgets"),
      api(q("/admin/spend?group_by=route&bucket=none")),
      api(q("/admin/spend?group_by=conversation&bucket=none&limit=10")),
      api(q("/admin/quality?group_by=model")),
      api(q("/admin/quality?group_by=task&limit=10")),
    ]);
    columnChart(document.getElementById("chart-spend-time"), "spend-time", sumBy(time.spend, "bucket", "cost_usd"));
    barChart(document.getElementById("chart-spend-model"), "spend-model", sumBy(byModel.spend, "group", "cost_usd"));
    barChart(document.getElementById("chart-spend-tenant"), "spend-tenant", sumBy(byTenant.spend, "group", "cost_usd"));
    barChart(document.getElementById("chart-savings-cause"), "savings-cause", sumBy(savings.savings, "cause", "savings_usd"));
    budgetsTable(document.getElementById("budgets"), budgets.budgets);
    barChart(document.getElementById("chart-cached-route"), "cached-route", cachedShares(byRoute.spend), percent, 1);
    conversationsTable(document.getElementById("conversations"), conversations.spend);
    barChart(document.getElementById("chart-quality-model"), "quality-model", qualities(qualityModel.quality), (v) => v.toFixed(2), 1);
    tasksTable(document.getElementById("tasks"), tasks.quality.filter((r) => r.group !== null));
    const total = byModel.spend.reduce((a, r) => a + Number(r.cost_usd), 0);
    const saved = savings.savings.reduce((a, r) => a + Number(r.savings_usd), 0);
    const requests = byModel.spend.reduce((a, r) => a + r.requests, 0);
    const totals = document.getElementById("totals");
    totals.replaceChildren();
    for (const [label, value] of [["spend", usd(total)], ["saved", usd(saved)], ["requests", String(requests)]]) {
      const box = document.createElement("div");
      box.textContent = label;
      const b = document.createElement("b");
      b.textContent = value;
      box.prepend(b);
      totals.appendChild(box);
    }
    status.textContent = "updated " + new Date().toISOString();
    document.body.dataset.ready = "true";
  } catch (err) {
    status.textContent = "error: " + err.message;
    document.body.dataset.ready = "error";
  }
}

document.getElementById("controls").addEventListener("submit", (e) => { e.preventDefault(); refresh(); });
for (const id of ["since", "bucket"]) document.getElementById(id).addEventListener("change", refresh);
refresh();
