// The omnibus console's page: it renders the state the server pushes
// (server-sent events at /api/events) and calls the API for a dead
// letter's view and for replays. Plain DOM, no build step.
"use strict";

const ui = {
  state: null,
  open: new Set(),        // groups whose lanes are shown: "source/topic/group"
  selected: null,         // {source, topic, id}: the dead letter shown
  view: null,             // its view from /api/deadletter
  format: "auto",
  checked: new Set(),     // dead letters ticked for replay: "source/topic/id"
  token: "",
  notice: "",
};

// h makes an element: h("td", {class: "x"}, "text", child...).
function h(tag, attrs, ...children) {
  const ns = ["svg", "path", "line", "text", "polyline", "rect"].includes(tag) ? "http://www.w3.org/2000/svg" : null;
  const el = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function age(s) {
  if (s === null || s === undefined) return "?";
  if (s < 1) return Math.round(s * 1000) + " ms";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return Math.floor(s / 60) + " m " + Math.round(s % 60) + " s";
  return Math.floor(s / 3600) + " h " + Math.round((s % 3600) / 60) + " m";
}

function num(n) { return n === null || n === undefined ? "?" : n.toLocaleString("en"); }

function when(t) {
  if (!t) return "?";
  const d = new Date(t);
  return d.toLocaleTimeString() + (Date.now() - d > 86400e3 ? " " + d.toLocaleDateString() : "");
}

// chart draws the total lag over the history as an SVG line.
function chart(history, w, ht, big) {
  const pts = history.filter(p => p[1] !== null);
  const svg = h("svg", {width: w, height: ht, viewBox: `0 0 ${w} ${ht}`, class: "chart", role: "img",
    "aria-label": "lag over the last minutes"});
  if (pts.length === 0) {
    svg.append(h("text", {x: 4, y: ht / 2 + 4, class: "axis"}, "no lag known yet"));
    return svg;
  }
  const t0 = history[0][0], t1 = Math.max(history[history.length - 1][0], t0 + 1);
  const top = Math.max(1, ...pts.map(p => p[1]));
  const pad = big ? 30 : 2, bottom = big ? 16 : 2;
  const x = t => pad + (t - t0) / (t1 - t0) * (w - pad - 4);
  const y = v => 4 + (1 - v / top) * (ht - 4 - bottom);
  svg.append(h("line", {x1: pad, y1: y(0), x2: w - 4, y2: y(0), class: "base"}));
  svg.append(h("polyline", {points: pts.map(p => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "), class: "line"}));
  if (big) {
    svg.append(h("text", {x: 2, y: 12, class: "axis"}, num(top)));
    svg.append(h("text", {x: 2, y: y(0), class: "axis"}, "0"));
    svg.append(h("text", {x: pad, y: ht - 2, class: "axis"}, "-" + age((t1 - t0) / 1000)));
    svg.append(h("text", {x: w - 30, y: ht - 2, class: "axis"}, "now"));
  }
  return svg;
}

async function api(path, body) {
  const headers = {"Content-Type": "application/json"};
  if (ui.token) headers["Authorization"] = "Bearer " + ui.token;
  const r = await fetch(path, {method: body ? "POST" : "GET", headers, body: body ? JSON.stringify(body) : undefined});
  const j = await r.json().catch(() => ({error: r.statusText}));
  if (!r.ok) throw new Error(j.error || r.statusText);
  return j;
}

async function showDeadLetter(source, topic, id) {
  ui.selected = {source, topic, id};
  try {
    ui.view = await api(`/api/deadletter?source=${source}&topic=${encodeURIComponent(topic)}&id=${encodeURIComponent(id)}&format=${ui.format}`);
  } catch (e) {
    ui.view = {error: e.message};
  }
  render();
}

async function act(action, source, topic, ids, to) {
  if (ui.state.token_required && !ui.token) {
    ui.token = prompt("This console asks for a token to " + action + ":") || "";
  }
  const what = ids ? ids.length + " dead letter(s)" : "every dead letter of " + topic;
  if (!confirm(`${action === "replay" ? "Replay" : "Delete"} ${what}${to ? " to " + to : ""}?`)) return;
  try {
    const r = await api("/api/" + action, {source, topic, ids: ids || [], all: !ids, to: to || ""});
    ui.notice = `${action} started (job ${r.job})`;
    ui.checked.clear();
  } catch (e) {
    ui.notice = `${action} refused: ${e.message}`;
  }
  render();
}

async function stop(source, job) {
  try { await api("/api/stop", {source, job}); } catch (e) { ui.notice = "stop: " + e.message; }
}

function groupKey(s, g) { return `${s.id}/${g.topic}/${g.group}`; }

function groupRow(s, g) {
  const key = groupKey(s, g);
  const lagging = g.known && g.total > 0;
  const d = g.decision;
  const cls = g.error ? "bad" : !g.known ? "unknown" : lagging ? (d && d.stalled && d.stalled.length ? "bad" : "warn") : "ok";
  const row = h("tr", {class: "group " + cls, "data-test": "group", "data-topic": g.topic, "data-group": g.group,
      onclick: () => { ui.open.has(key) ? ui.open.delete(key) : ui.open.add(key); render(); }},
    h("td", {}, h("span", {class: "caret"}, ui.open.has(key) ? "▾" : "▸"), g.topic),
    h("td", {}, g.group),
    h("td", {class: "n", "data-test": "lag"}, g.error ? "error" : g.known ? num(g.total) : "?"),
    h("td", {class: "n", "data-test": "age"}, age(g.max_age)),
    h("td", {class: "n"}, g.members < 0 ? "?" : g.members),
    h("td", {}, chart(g.history, 160, 32, false)),
    h("td", {class: "decision"}, d ? h("span", {title: d.reason}, h("b", {}, d.action), ` → ${d.desired} member${d.desired === 1 ? "" : "s"}`,
      d.stalled && d.stalled.length ? h("span", {class: "tag bad"}, "stalled: " + d.stalled.join(", ")) : null) : "—"));
  const rows = [row];
  if (g.error) rows.push(h("tr", {class: "detail"}, h("td", {colspan: 7, class: "error"}, g.error)));
  if (ui.open.has(key)) {
    rows.push(h("tr", {class: "detail"}, h("td", {colspan: 7},
      h("div", {class: "lanes"},
        h("table", {class: "small"},
          h("thead", {}, h("tr", {}, ["lane", "owner", "position", "lag", "oldest"].map(c => h("th", {}, c)))),
          h("tbody", {}, g.lanes.map(l => h("tr", {"data-test": "lane"},
            h("td", {}, l.lane), h("td", {}, l.owner || "—"), h("td", {class: "n"}, l.committed || s.lag_kind === "records" ? num(l.committed) : "—"),
            h("td", {class: "n"}, l.known ? num(l.lag) : "?"), h("td", {class: "n"}, age(l.age)))))),
        h("div", {}, chart(g.history, 520, 150, true),
          d ? h("p", {class: "muted"}, `Autoscaler (${ui.state.policy}): ${d.action}, ${d.current} → ${d.desired}; ${d.reason}`) : null)))));
  }
  return rows;
}

function deadLetters(s, dt) {
  const count = dt.count !== null ? dt.count : dt.total;
  const items = [];
  items.push(h("h3", {}, dt.topic, " ", h("span", {class: "tag " + (count > 0 ? "bad" : "ok"), "data-test": "dlq-count"},
    count === 1 ? "1 dead letter" : num(count) + " dead letters"),
    dt.listed_at ? h("span", {class: "muted"}, " listed " + when(dt.listed_at)) : null));
  if (dt.error) items.push(h("p", {class: "error"}, dt.error));
  if (dt.messages.length === 0) {
    items.push(h("p", {class: "muted"}, dt.listed_at ? "None." : "Not listed yet."));
    return items;
  }
  const all = ui.state.allow_replay;
  const checked = dt.messages.filter(m => ui.checked.has(`${s.id}/${dt.topic}/${m.id}`)).map(m => m.id);
  if (all) {
    items.push(h("div", {class: "actions"},
      h("button", {disabled: checked.length === 0, onclick: () => act("replay", s.id, dt.topic, checked)}, `Replay ${checked.length} selected`),
      h("button", {onclick: () => act("replay", s.id, dt.topic, null)}, "Replay all"),
      h("button", {class: "danger", disabled: checked.length === 0, onclick: () => act("delete", s.id, dt.topic, checked)}, "Delete selected")));
  }
  items.push(h("table", {"data-test": "dead-letters"},
    h("thead", {}, h("tr", {}, all ? h("th", {}) : null, ["ID", "failed", "attempts", "group", "reason", "body"].map(c => h("th", {}, c)))),
    h("tbody", {}, dt.messages.map(m => {
      const key = `${s.id}/${dt.topic}/${m.id}`;
      const sel = ui.selected && ui.selected.source === s.id && ui.selected.topic === dt.topic && ui.selected.id === m.id;
      return h("tr", {class: "dead" + (sel ? " selected" : ""), "data-test": "dead-letter", "data-id": m.id,
          onclick: () => showDeadLetter(s.id, dt.topic, m.id)},
        all ? h("td", {}, h("input", {type: "checkbox", checked: ui.checked.has(key),
          onclick: e => { e.stopPropagation(); e.target.checked ? ui.checked.add(key) : ui.checked.delete(key); render(); }})) : null,
        h("td", {class: "mono"}, m.id), h("td", {}, when(m.last_failure)), h("td", {class: "n"}, m.attempts),
        h("td", {}, m.group), h("td", {class: "reason"}, m.reason),
        h("td", {class: "mono body"}, m.body_base64 ? "(binary, " + num(m.body_bytes) + " bytes)" : m.body + (m.body_truncated ? "…" : "")));
    }))));
  if (ui.selected && ui.selected.source === s.id && ui.selected.topic === dt.topic) items.push(detail(s, dt));
  return items;
}

function detail(s, dt) {
  const v = ui.view;
  if (!v) return h("div", {class: "panel"}, "Loading…");
  if (v.error) return h("div", {class: "panel error"}, v.error);
  const rows = [["ID", v.id], ["reason", v.reason], ["attempts", v.attempts], ["topic", v.topic], ["group", v.group],
    ["from", v.origin_lane ? `lane ${v.origin_lane} position ${v.origin_position}` : ""],
    ["first failure", v.first_failure ? new Date(v.first_failure).toISOString() : ""],
    ["last failure", v.last_failure ? new Date(v.last_failure).toISOString() : ""],
    ["key", v.key], ["type", v.type], ["source", v.source], ["content type", v.content_type], ["replays", v.replays || ""]];
  const to = h("input", {type: "text", placeholder: v.topic || "topic", "aria-label": "replay to topic", size: 18});
  return h("div", {class: "panel", "data-test": "detail"},
    h("div", {class: "panel-head"}, h("b", {}, "Dead letter ", h("span", {class: "mono"}, v.id)),
      h("button", {onclick: () => { ui.selected = null; ui.view = null; render(); }}, "Close")),
    h("table", {class: "small kv"}, h("tbody", {}, rows.filter(r => r[1] !== "" && r[1] !== undefined).map(r => h("tr", {}, h("th", {}, r[0]), h("td", {}, String(r[1])))))),
    h("h4", {}, "Headers"),
    h("table", {class: "small kv mono"}, h("tbody", {}, Object.keys(v.headers).sort().map(k => h("tr", {}, h("th", {}, k), h("td", {}, v.headers[k]))))),
    h("h4", {}, "Body ", h("span", {class: "muted"}, num(v.body_bytes) + " bytes"), " ",
      ["auto", "text", "json", "hex"].map(f => h("button", {class: "fmt" + (ui.format === f ? " on" : ""),
        onclick: () => { ui.format = f; showDeadLetter(ui.selected.source, ui.selected.topic, ui.selected.id); }}, f))),
    v.format_error ? h("p", {class: "muted"}, "Not JSON (" + v.format_error + "): shown as text.") : null,
    h("pre", {class: "body", "data-test": "body"}, v.formatted),
    v.cut ? h("p", {class: "muted", "data-test": "cut"}, `Cut: the page shows the first part of ${num(v.body_bytes)} bytes; a replay publishes the whole body.`) : null,
    ui.state.allow_replay ? h("div", {class: "actions"},
      h("button", {"data-test": "replay", onclick: () => act("replay", s.id, dt.topic, [v.id], to.value.trim())}, "Replay"), " to ", to,
      h("button", {class: "danger", onclick: () => act("delete", s.id, dt.topic, [v.id])}, "Delete"))
      : h("p", {class: "muted"}, "Read-only: start the console with --allow-replay to replay or delete."));
}

function jobs(s) {
  if (s.jobs.length === 0) return null;
  return h("div", {class: "jobs"}, s.jobs.slice().reverse().slice(0, 5).map(j => {
    const p = j.progress, n = j.action === "replay" ? p.Replayed : p.Deleted;
    return h("div", {class: "job " + j.state, "data-test": "job", "data-state": j.state},
      `${j.action} ${j.selected} of ${j.topic}${j.to ? " to " + j.to : ""}: ${j.state}, ${num(n)} of ${num(p.Selected)} selected (${num(p.Read)} read)`,
      p.Moved ? `, ${num(p.Moved)} moved` : "", j.error ? h("span", {class: "error"}, " " + j.error) : null,
      j.state === "running" ? h("button", {onclick: () => stop(s.id, j.id)}, "Stop") : null);
  }));
}

function sourceSection(s) {
  const groups = s.groups.slice().sort((a, b) => (b.known ? b.total : -1) - (a.known ? a.total : -1));
  return h("section", {class: "source", "data-test": "source"},
    h("h2", {}, s.name, " ", h("span", {class: "tag " + (s.status === "ok" ? "ok" : "bad"), "data-test": "status"}, s.status)),
    s.status === "unreachable" ? h("div", {class: "banner", "data-test": "unreachable"},
      `Cannot reach ${s.name}: ${s.error}. Retrying`, s.retry_at ? ` in ${Math.max(0, Math.round((new Date(s.retry_at) - Date.now()) / 1000))} s` : " now", "…") : null,
    h("h3", {}, "Consumer groups ", h("span", {class: "muted"}, `lag in ${s.lag_kind === "depth" ? "messages pending" : "records"}; click a group for its lanes`)),
    groups.length === 0 ? h("p", {class: "muted"}, "No group named: start the console with --topic and --group.") :
      h("table", {"data-test": "groups"},
        h("thead", {}, h("tr", {}, ["topic", "group", "lag", "oldest", "members", "last minutes", "autoscaler"].map(c => h("th", {}, c)))),
        h("tbody", {}, groups.map(g => groupRow(s, g)))),
    h("h3", {}, "Dead letters"),
    jobs(s),
    s.dead_letters.map(dt => deadLetters(s, dt)));
}

function render() {
  const st = ui.state;
  if (!st) return;
  document.getElementById("interval").textContent = st.interval_ms / 1000;
  const lagging = [], dead = [];
  for (const s of st.sources) {
    for (const g of s.groups) if (g.known && g.total > 0) lagging.push(`${g.topic}/${g.group} (${num(g.total)})`);
    for (const d of s.dead_letters) { const c = d.count !== null ? d.count : d.total; if (c > 0) dead.push(`${d.topic} (${num(c)})`); }
  }
  const sum = document.getElementById("summary");
  sum.replaceChildren(
    h("span", {class: "tag " + (lagging.length ? "warn" : "ok")}, lagging.length ? "lagging: " + lagging.join(", ") : "no group lags"),
    " ", h("span", {class: "tag " + (dead.length ? "bad" : "ok")}, dead.length ? "dead letters: " + dead.join(", ") : "no dead letters"),
    st.allow_replay ? h("span", {class: "tag warn"}, "replay allowed") : h("span", {class: "tag"}, "read-only"));
  const scrollY = window.scrollY;
  document.getElementById("app").replaceChildren(
    ...[ui.notice ? h("p", {class: "notice", "data-test": "notice"}, ui.notice) : null, ...st.sources.map(sourceSection)].filter(Boolean));
  window.scrollTo(0, scrollY);
}

function connect() {
  const live = document.getElementById("live");
  const es = new EventSource("/api/events");
  es.addEventListener("state", e => {
    ui.state = JSON.parse(e.data);
    live.textContent = "live";
    live.className = "live on";
    if (document.activeElement && document.activeElement.tagName === "INPUT" && document.activeElement.type === "text") return;
    render();
  });
  es.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
}

connect();
