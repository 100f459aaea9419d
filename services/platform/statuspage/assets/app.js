// The status page: renders the cluster view the server pushes over SSE
// (/__ursula/ui/events). No framework, no build step, no other origin.

const maxSamples = 600;
// lagNoticeable is the applied lag (entries) the groups table highlights.
const lagNoticeable = 100;
let samples = [];
let version = 0;

const charts = [
  { key: "appends_per_sec", title: "appends / s", fmt: fmtRate },
  { key: "append_bytes_per_sec", title: "bytes in / s", fmt: fmtBytes },
  { key: "reads_per_sec", title: "reads / s", fmt: fmtRate },
  { key: "append_ms", title: "mean append latency", fmt: fmtMs },
  { key: "read_ms", title: "mean read latency", fmt: fmtMs },
];

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function fmtRate(v) {
  if (v >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (v >= 1e3) return (v / 1e3).toFixed(1) + "k";
  return v >= 10 ? v.toFixed(0) : v.toFixed(1);
}

function fmtCount(v) {
  return v >= 1e4 ? fmtRate(v) : String(Math.round(v));
}

function fmtBytes(v) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 || v >= 100 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
}

function fmtMs(v) {
  if (v === 0) return "–";
  return v >= 10 ? v.toFixed(0) + " ms" : v.toFixed(2) + " ms";
}

function fmtAgo(ms, now) {
  if (!ms) return "never";
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 2) return "now";
  if (s < 120) return s + " s ago";
  return Math.round(s / 60) + " min ago";
}

function pill(cls, text) { return el("span", { class: "pill " + cls }, text); }

// setupCharts builds one card per chart, once.
function setupCharts() {
  const box = $("charts");
  for (const c of charts) {
    const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
    svg.setAttribute("viewBox", "0 0 300 56");
    svg.setAttribute("preserveAspectRatio", "none");
    const area = document.createElementNS(svg.namespaceURI, "path");
    area.setAttribute("class", "area");
    const line = document.createElementNS(svg.namespaceURI, "path");
    line.setAttribute("class", "line");
    svg.append(area, line);
    c.now = el("span", { class: "now" }, "–");
    c.max = el("span", {}, "");
    c.span = el("span", {}, "");
    c.area = area;
    c.line = line;
    box.append(el("div", { class: "chart", "data-chart": c.key },
      el("div", { class: "head" }, el("span", { class: "label" }, c.title), c.now),
      svg,
      el("div", { class: "foot" }, c.span, c.max)));
  }
}

// drawCharts draws every chart over the samples' time span.
function drawCharts() {
  if (samples.length === 0) return;
  const t1 = samples[samples.length - 1].at;
  const t0 = Math.min(samples[0].at, t1 - 60000);
  const W = 300, H = 56, pad = 3;
  for (const c of charts) {
    const vals = samples.map((s) => s[c.key] || 0);
    const top = Math.max(...vals) || 1;
    const x = (t) => ((t - t0) / (t1 - t0 || 1)) * W;
    const y = (v) => H - pad - (v / top) * (H - 2 * pad);
    let d = "";
    samples.forEach((s, i) => {
      d += (i === 0 ? "M" : "L") + x(s.at).toFixed(1) + " " + y(vals[i]).toFixed(1);
    });
    c.line.setAttribute("d", d);
    c.area.setAttribute("d", d + "L" + x(t1).toFixed(1) + " " + H + "L" + x(samples[0].at).toFixed(1) + " " + H + "Z");
    c.now.textContent = c.fmt(vals[vals.length - 1]);
    c.max.textContent = "max " + c.fmt(Math.max(...vals));
    c.span.textContent = "last " + Math.max(1, Math.round((t1 - t0) / 60000)) + " min";
  }
}

function nodeState(n) {
  if (!n.reachable) return "unreachable";
  if (n.shed_state && n.shed_state !== "normal") return "draining";
  return n.ready ? "ready" : "not-ready";
}

function renderNodes(snap) {
  const body = $("nodes").tBodies[0];
  const rows = snap.nodes.map((n) => {
    const state = nodeState(n);
    const stateCell = {
      unreachable: pill("bad", "unreachable"),
      draining: pill("warn", "draining"),
      ready: pill("ok", "up"),
      "not-ready": pill("warn", "up"),
    }[state];
    const readiness = !n.reachable
      ? el("span", { title: n.error || "" }, n.error ? "no answer: " + n.error : "no answer")
      : n.ready ? pill("ok", "ready") : pill("warn", n.reason || "not ready");
    const drain = !n.reachable ? "–" : (n.shed_state === "normal" || !n.shed_state)
      ? "normal" : pill("warn", n.shed_state);
    const gates = !n.reachable ? "–" : n.recovery_gates_stalled > 0
      ? pill("bad", n.recovery_gates_stalled + " stalled")
      : n.recovery_gates_closed > 0 ? pill("warn", n.recovery_gates_closed + " closed") : "open";
    const refusals = !n.reachable ? "–" : n.peer_refusals > 0 || n.peer_mismatches.length > 0
      ? el("span", { title: n.peer_mismatches.join("\n") }, pill("bad", String(n.peer_refusals)), " ", n.peer_mismatches[0] || "")
      : "0";
    return el("tr", { "data-node": String(n.id), "data-state": state },
      el("td", { class: "leader" }, n.id ? String(n.id) : "?"),
      el("td", {}, el("code", {}, n.address)),
      el("td", { "data-field": "state" }, stateCell),
      el("td", { class: "wrap", "data-field": "readiness" }, readiness),
      el("td", { "data-field": "drain" }, drain),
      el("td", { class: "num", "data-field": "leads" }, n.reachable ? String(n.leads) : "–"),
      el("td", { class: "num" }, n.reachable ? fmtCount(n.streams) : "–"),
      el("td", { class: "num" }, n.reachable ? fmtBytes(n.hot_bytes) : "–"),
      el("td", { class: "num" }, n.reachable ? fmtBytes(n.cold_bytes) : "–"),
      el("td", { class: "num" }, n.reachable ? fmtBytes(n.cold_upload_bytes) : "–"),
      el("td", {}, gates),
      el("td", { class: "wrap" }, refusals),
      el("td", {}, fmtAgo(n.last_seen, snap.at)));
  });
  body.replaceChildren(...rows);

  const reachable = snap.nodes.filter((n) => n.reachable);
  const ready = snap.nodes.filter((n) => n.reachable && n.ready).length;
  const draining = snap.nodes.filter((n) => nodeState(n) === "draining").length;
  const down = snap.nodes.length - reachable.length;
  setValue("sum-ready", ready + " / " + snap.nodes.length, ready < snap.nodes.length ? "warn" : "");
  setValue("sum-drain", String(draining), draining > 0 ? "warn" : "");
  setValue("sum-down", String(down), down > 0 ? "bad" : "");
}

function setValue(id, text, cls) {
  const e = $(id);
  e.textContent = text;
  e.className = "value" + (cls ? " " + cls : "");
}

function renderGroups(snap) {
  const body = $("groups").tBodies[0];
  const rows = snap.groups.map((g) => {
    const lag = el("span", {});
    for (const r of g.lag) {
      // The replicas are read a few milliseconds apart: a handful of
      // entries behind is the read, not a lagging replica.
      lag.append(el("span", { class: "lag" + (r.lag > lagNoticeable ? " behind" : "") }, "n" + r.node + " " + r.lag));
    }
    const gate = g.recovery_gate === "open" ? "open"
      : pill(g.recovery_gate.startsWith("stalled") ? "bad" : "warn", g.recovery_gate);
    return el("tr", { "data-group": String(g.id), "data-leader": String(g.leader) },
      el("td", { class: "num" }, String(g.id)),
      el("td", { class: "num" + (g.leader ? " leader" : " none"), "data-field": "leader" }, g.leader ? String(g.leader) : "none"),
      el("td", { class: "num" }, String(g.term)),
      el("td", {}, g.voters.join(", ") || "–"),
      el("td", {}, g.learners.join(", ") || "–"),
      el("td", { class: "num" }, String(g.commit)),
      el("td", {}, lag),
      el("td", { class: "num" }, fmtCount(g.streams)),
      el("td", { class: "num" }, fmtBytes(g.hot_bytes)),
      el("td", { class: "num" }, fmtBytes(g.cold_bytes)),
      el("td", {}, gate));
  });
  body.replaceChildren(...rows);
  const led = snap.groups.length - snap.groups_without_leader.length;
  setValue("sum-led", led + " / " + snap.groups.length, led < snap.groups.length ? "bad" : "");
  $("leaderless").textContent = snap.groups_without_leader.length
    ? "— without a leader: " + snap.groups_without_leader.join(", ") : "";
}

function render(snap) {
  if (snap.history) samples = snap.history.slice(-maxSamples);
  else if (snap.sample) {
    samples.push(snap.sample);
    if (samples.length > maxSamples) samples.splice(0, samples.length - maxSamples);
  }
  $("cluster").textContent = snap.cluster_id || "–";
  $("source").textContent = snap.source || "–";
  renderNodes(snap);
  renderGroups(snap);
  drawCharts();
  version++;
  const upd = $("updated");
  upd.textContent = new Date(snap.at).toLocaleTimeString();
  upd.setAttribute("data-version", String(version));
}

function setConn(state, text) {
  const c = $("conn");
  c.setAttribute("data-state", state);
  c.textContent = text;
  document.body.setAttribute("data-live", state === "live" ? "true" : "false");
}

// connect opens the live connection. EventSource reconnects by itself
// (after the server's retry hint) when a connection drops; when the server
// refuses one (too many viewers), it gives up, so the page tries again.
function connect() {
  const es = new EventSource("events");
  es.addEventListener("open", () => setConn("live", "live"));
  es.addEventListener("error", () => {
    setConn("lost", "reconnecting…");
    if (es.readyState === EventSource.CLOSED) setTimeout(connect, 5000);
  });
  es.addEventListener("snapshot", (ev) => {
    setConn("live", "live");
    render(JSON.parse(ev.data));
  });
}

setupCharts();
connect();
