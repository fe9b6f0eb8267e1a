// The status page's charts: small inline-SVG line charts of /v1/status/history, drawn by hand
// (no library, nothing fetched from outside). Each chart is one metric, one line per label.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const COLOURS = ["#2f6fdf", "#d9480f", "#2b8a3e", "#ae3ec9", "#e8590c", "#1098ad"];
const CHARTS = [
  { id: "chart-decode", metric: "decode_tokens_per_s", title: "decode tok/s of the routes through each node", value: (p) => p.mean },
  { id: "chart-prefill", metric: "prefill_tokens_per_s", title: "prefill tok/s of the routes through each node", value: (p) => p.mean },
  { id: "chart-itl", metric: "inter_token_seconds", title: "inter-token latency of the routes through each node (ms)", value: (p) => 1000 * p.mean },
  { id: "chart-hop", metric: "hop_seconds", title: "decode step per hop, by node (ms)", value: (p) => 1000 * p.mean },
  { id: "chart-ttft", metric: "ttft_seconds", title: "time to first token (s)", value: (p) => p.mean },
  { id: "chart-rate", metric: "requests", title: "requests / s", value: (p, h) => p.count / h.bucket_seconds },
  { id: "chart-errors", metric: "errors", title: "errors / s", value: (p, h) => p.count / h.bucket_seconds },
  { id: "chart-queue", metric: "queued", title: "queue depth (max)", value: (p) => p.max },
  { id: "chart-flight", metric: "in_flight", title: "requests in flight (max)", value: (p) => p.max },
];
const WIDTH = 320;
const HEIGHT = 120;
const PAD = 22;

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  return node;
}

function shortLabel(label) {
  return label ? label.slice(0, 12) : "gateway";
}

function drawChart(chart, history) {
  const lines = Object.entries((history.series || {})[chart.metric] || {});
  const box = svg("svg", { width: WIDTH, height: HEIGHT, viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    "data-testid": "chart", "data-metric": chart.metric });
  // From the oldest point kept (a young gateway's charts fill the width) to the current bucket.
  const end = (Math.floor(history.now / history.bucket_seconds) + 1) * history.bucket_seconds; // the current bucket's end
  let oldest = end;
  for (const [, points] of lines) for (const p of points) oldest = Math.min(oldest, p.at);
  const start = Math.max(end - history.window_seconds, Math.min(oldest, end - 4 * history.bucket_seconds));
  let top = 0;
  for (const [, points] of lines) for (const p of points) top = Math.max(top, chart.value(p, history));
  top = top > 0 ? top * 1.1 : 1;
  const x = (at) => PAD + ((at - start) / (end - start)) * (WIDTH - PAD - 4);
  const y = (v) => HEIGHT - PAD + 4 - (v / top) * (HEIGHT - PAD - 8);
  box.append(svg("line", { x1: PAD, y1: y(0), x2: WIDTH - 4, y2: y(0), class: "axis" }));
  const scale = svg("text", { x: 2, y: 12, class: "scale" });
  scale.textContent = top >= 10 ? top.toFixed(0) : top.toPrecision(2);
  box.append(scale);
  lines.forEach(([label, points], i) => {
    const colour = COLOURS[i % COLOURS.length];
    // A step per bucket (its value held across its width), so even one bucket draws a line.
    const coords = points.flatMap((p) => {
      const level = y(chart.value(p, history)).toFixed(1);
      return [`${x(p.at).toFixed(1)},${level}`, `${x(p.at + history.bucket_seconds).toFixed(1)},${level}`];
    });
    box.append(svg("polyline", { points: coords.join(" "), stroke: colour, fill: "none", "stroke-width": 2,
      "data-testid": "chart-line", "data-label": label, "data-points": points.length }));
    const name = svg("text", { x: PAD + 4 + 80 * i, y: HEIGHT - 4, fill: colour, class: "legend" });
    name.textContent = shortLabel(label);
    box.append(name);
  });
  const span = svg("text", { x: WIDTH - 4, y: 12, class: "scale", "text-anchor": "end" });
  span.textContent = `last ${Math.round(end - start)} s`;
  box.append(span);
  const figure = document.getElementById(chart.id);
  figure.replaceChildren(el("figcaption", {}, chart.title), box);
}

function drawCharts(history) {
  for (const chart of CHARTS) drawChart(chart, history);
}
