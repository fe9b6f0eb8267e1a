// The meshnet status page: follows /v1/status/stream and redraws. No framework, no build step.
// An API key given once as /?key=... (or typed into the key form the page shows when the gateway
// answers 401) is kept in sessionStorage (this tab only), sent as a Bearer header to this gateway
// alone, and removed from the address bar so it stays out of history and referrers.
"use strict";

const KEY_SLOT = "meshnet-api-key";

function takeKey() {
  const url = new URL(window.location.href);
  const given = url.searchParams.get("key");
  if (given) {
    sessionStorage.setItem(KEY_SLOT, given);
    url.searchParams.delete("key");
    window.history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
  return sessionStorage.getItem(KEY_SLOT);
}

let apiKey = takeKey();
const HISTORY_EVERY_MS = 1000;
let historyAt = 0;

class KeyNeeded extends Error {}

function authHeaders() {
  return apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
}

// Resolves once the operator entered a key in the form (shown only while one is needed).
function askForKey(reason) {
  const form = document.getElementById("key-form");
  form.hidden = false;
  showDisconnected(reason);
  return new Promise((resolve) => {
    form.onsubmit = (event) => {
      event.preventDefault();
      const given = document.getElementById("key-input").value.trim();
      if (!given) return;
      apiKey = given;
      sessionStorage.setItem(KEY_SLOT, given);
      form.hidden = true;
      resolve();
    };
  });
}

async function refreshHistory() {
  const now = Date.now();
  if (now - historyAt < HISTORY_EVERY_MS) return;
  historyAt = now;
  try {
    const response = await fetch("/v1/status/history", { headers: authHeaders(), cache: "no-store" });
    if (response.ok) drawCharts(await response.json());
  } catch (error) {
    historyAt = 0; // the stream reports the disconnection; the next frame tries again
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function bytes(n) {
  if (!n) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(n >= 100 || i === 0 ? 0 : 1)} ${units[i]}`;
}

function rate(x) { return x ? x.toFixed(1) : "–"; }
function seconds(x) { return x === null || x === undefined ? "–" : `${x.toFixed(1)} s`; }
function cell(text, cls, testid) { return el("td", { class: cls, "data-testid": testid }, text); }
function badge(text) { return el("span", { class: `badge ${text}` }, text); }

function replaceRows(id, rows) {
  document.getElementById(id).replaceChildren(...rows);
}

function drawHeader(doc) {
  document.getElementById("model").textContent = doc.model;
  const health = document.getElementById("health");
  health.textContent = doc.health.status;
  health.className = `badge ${doc.health.status}`;
  document.getElementById("health-reason").textContent = doc.health.reason;
  document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
}

function drawCoverage(doc) {
  const rows = doc.coverage.map((c) => {
    const layers = c.counts.map((count, i) =>
      el("div", { class: `layer c${Math.min(count, 3)}`, title: `layer ${i}: ${count} node(s)`,
        "data-testid": "layer", "data-count": count }, count));
    const gaps = c.gaps.length ? `gaps: ${c.gaps.map((g) => `${g[0]}:${g[1]}`).join(", ")}` : "complete";
    return el("div", { class: "coverage-row", "data-testid": "coverage-row", "data-complete": c.complete },
      el("strong", {}, `${c.model} (${c.n_layers} layers)`),
      el("div", { class: "coverage-bar" }, ...layers),
      el("span", { class: c.complete ? "muted" : "badge no_route", "data-testid": "gaps" }, gaps));
  });
  if (!rows.length) rows.push(el("p", { class: "muted" }, "no certified node serves any model"));
  document.getElementById("coverage").replaceChildren(...rows);
}

function drawNodes(doc) {
  document.getElementById("node-count").textContent = `(${doc.nodes.length})`;
  replaceRows("nodes", doc.nodes.map((n) => el("tr",
    { "data-testid": "node", "data-address": n.address, "data-health": n.health },
    cell(n.address),
    el("td", { "data-testid": "node-reachability", "data-reachability": n.reachability }, n.reachable),
    cell(`${n.layers[0]}:${n.layers[1]} of ${n.n_layers}`),
    el("td", { "data-testid": "node-health" }, badge(n.health)),
    cell(n.health === "lost" ? "gone" : seconds(n.seconds_since_heartbeat) + " ago", "num"),
    cell(`${n.cpu_count} CPU, ${bytes(n.memory_bytes)}`),
    cell(n.device === "cpu" ? "cpu" : `${n.device} ${n.device_name}: ${bytes(n.device_memory_used)} / ${bytes(n.device_memory_total)}`),
    cell(`${bytes(n.memory_used_bytes)} / ${bytes(n.memory_budget_bytes)}`, "num"),
    cell(`${(100 * n.kv_used_fraction).toFixed(0)} %`, "num"),
    cell(`${n.active_sessions} / ${n.max_sessions}`, "num"),
    cell(n.queue_depth, "num"),
    cell(rate(n.live_prefill_tokens_per_s), "num", "live-prefill"),
    cell(rate(n.live_decode_tokens_per_s), "num", "live-decode"),
    cell(`${rate(n.prefill_tokens_per_s)} / ${rate(n.decode_tokens_per_s)}`, "num"),
    el("td", { class: "num", "data-testid": "prefix" }, prefixStore(n)))));
}

function prefixStore(n) {
  if (n.prefix_budget_bytes === null || n.prefix_budget_bytes === undefined) return "–";
  const looked = n.prefix_hits + n.prefix_misses;
  return `${bytes(n.prefix_bytes)} / ${bytes(n.prefix_budget_bytes)} (${n.prefix_hits} / ${looked})`;
}

function prefillCell(r) {
  const total = r.prompt_tokens || 0;
  const done = Math.min(r.prefill_done_tokens || 0, total);
  const share = total ? done / total : 0;
  const eta = r.prefill_eta_seconds ? `, ETA ${seconds(r.prefill_eta_seconds)}` : "";
  const label = total ? `${done} / ${total}${r.replaying ? " replay" : ""}${eta}` : "–";
  return el("td", { "data-testid": "prefill", "data-done": done, "data-total": total },
    el("span", { class: "progress" }, el("span", { style: `width: ${(100 * share).toFixed(1)}%` })),
    " ", label);
}

function drawRequests(doc) {
  replaceRows("requests", doc.requests.map((r) => el("tr", { "data-testid": "request", "data-id": r.request_id },
    cell(r.request_id.slice(0, 14)),
    cell(r.phase, "", "phase"),
    prefillCell(r),
    cell(r.generated_tokens, "num", "tokens"),
    cell(rate(r.tokens_per_second), "num"),
    cell(r.route.join(" → ")),
    cell(r.failovers, "num", "failovers"),
    cell(seconds(r.age_seconds), "num"))));
  replaceRows("recent", doc.recent_requests.slice(0, 10).map((r) => el("tr", { "data-testid": "recent-request" },
    cell(r.request_id.slice(0, 14)),
    cell(r.error ? `failed: ${r.error.code || "error"}` : r.finish_reason || r.phase),
    cell(r.prompt_tokens ?? "–", "num"),
    cell(r.generated_tokens, "num"),
    cell(r.failovers, "num"),
    cell(seconds(r.age_seconds), "num"))));
}

function drawTotals(doc) {
  const errors = doc.errors.map((e) =>
    el("li", {}, `${e.request_id.slice(0, 14)} [${e.code || "error"}] ${e.message || ""}`));
  if (!doc.tracker.reachable) errors.unshift(el("li", {}, `tracker unreachable: ${doc.tracker.error}`));
  document.getElementById("errors").replaceChildren(...(errors.length ? errors : [el("li", { class: "muted" }, "none")]));
  const figures = { ...doc.gateway, ...doc.billing };
  replaceRows("totals", Object.entries(figures).map(([name, value]) =>
    el("tr", {}, el("th", {}, name.replaceAll("_", " ")), cell(Number(value).toLocaleString(), "num"))));
}

function draw(doc) {
  drawHeader(doc);
  drawCoverage(doc);
  drawNodes(doc);
  drawRequests(doc);
  drawTotals(doc);
}

function showDisconnected(reason) {
  const health = document.getElementById("health");
  health.textContent = "disconnected";
  health.className = "badge no_route";
  document.getElementById("health-reason").textContent = reason;
}

async function follow() {
  // fetch rather than EventSource: EventSource cannot send an Authorization header.
  const response = await fetch("/v1/status/stream", { headers: authHeaders(), cache: "no-store" });
  if (response.status === 401) throw new KeyNeeded(apiKey ? "the API key was refused" : "an API key is needed");
  if (!response.ok) throw new Error(`the gateway answered ${response.status}`);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) throw new Error("the stream ended");
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (data) {
        draw(JSON.parse(data));
        refreshHistory();
      }
    }
  }
}

async function run() {
  for (;;) {
    try {
      await follow();
    } catch (error) {
      if (error instanceof KeyNeeded) {
        await askForKey(error.message);
        continue;
      }
      showDisconnected(String(error.message || error));
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

run();
