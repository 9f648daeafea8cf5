// fiber dashboard: draws the views that `fiber dashboard` streams to this page
// (server-sent events on /events). Everything from the program is set as text, never
// as HTML; the plots are SVG drawn here (no library, nothing fetched from elsewhere).
"use strict";

const TOKEN = new URLSearchParams(location.search).get("token") || "";
const SVG = "http://www.w3.org/2000/svg";
const WORKER_STATES = ["pending", "starting", "running", "busy", "idle", "stopping", "lost",
                       "replaced"];
const GROUP_STATES = ["pending", "starting", "busy", "idle", "stopping"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v !== null && v !== undefined) node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function age(seconds) {
  seconds = Math.max(0, Math.floor(seconds));
  const h = Math.floor(seconds / 3600), m = Math.floor((seconds % 3600) / 60), s = seconds % 60;
  const two = (x) => String(x).padStart(2, "0");
  return h ? `${h}:${two(m)}:${two(s)}` : `${m}:${two(s)}`;
}

function secs(s) {
  if (s === null || s === undefined) return "-";
  if (s === 0) return "< 1 ms";
  if (s < 0.001) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1e3).toFixed(s < 0.01 ? 2 : 0)} ms`;
  if (s < 10) return `${s.toFixed(2)} s`;
  if (s < 60) return `${s.toFixed(1)} s`;
  return age(s);
}

function clock(t) {
  return new Date(t * 1000).toLocaleTimeString([], {hour12: false});
}

function nice(max) {
  if (max <= 0) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(max)));
  for (const m of [1, 2, 5, 10]) if (m * p >= max) return m * p;
  return 10 * p;
}

// a line chart of rows [t, ...] over the last minute, or as long as the rows go back
// (at most `most` seconds) before `now`
function lineChart(id, title, rows, series, now, most) {
  const span = Math.min(most, Math.max(60, rows.length ? Math.ceil(now - rows[0][0]) : 0));
  const W = 520, H = 170, L = 46, R = 10, T = 22, B = 24;
  const box = svg("svg", {id, viewBox: `0 0 ${W} ${H}`, class: "chart",
                          "data-points": String(rows.length), role: "img",
                          "aria-label": title});
  box.append(svg("text", {x: L, y: 14, class: "chart-title"}, title));
  let max = 0;
  for (const row of rows) for (const s of series) max = Math.max(max, row[s.index]);
  const top = nice(max);
  const x = (t) => L + (W - L - R) * (1 - (now - t) / span);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  for (const f of [0, 0.5, 1]) {
    const v = top * f;
    box.append(svg("line", {x1: L, x2: W - R, y1: y(v), y2: y(v), class: "grid"}));
    box.append(svg("text", {x: L - 4, y: y(v) + 4, class: "tick", "text-anchor": "end"},
                   Number.isInteger(v) ? v : v.toFixed(1)));
  }
  const step = span <= 120 ? 20 : span <= 300 ? 60 : 120;
  for (let back = 0; back <= span; back += step) {
    const label = back === 0 ? "now" : back < 60 ? `-${back} s`
      : `-${back % 60 ? (back / 60).toFixed(1) : back / 60} min`;
    box.append(svg("text", {x: x(now - back), y: H - 6, class: "tick",
                            "text-anchor": "middle"}, label));
  }
  let lx = W - R;
  for (const s of [...series].reverse()) {
    const label = svg("text", {x: lx, y: 14, class: `legend ${s.cls}`, "text-anchor": "end"},
                      s.name);
    box.append(label);
    lx -= 8 * s.name.length + 14;
  }
  for (const s of series) {
    const pts = rows.filter((r) => now - r[0] <= span)
      .map((r) => `${x(r[0]).toFixed(1)},${y(r[s.index]).toFixed(1)}`);
    if (pts.length) box.append(svg("polyline", {points: pts.join(" "), class: `line ${s.cls}`}));
  }
  return box;
}

// one function's task times: bars per power of two of seconds
function histogram(id, fn) {
  const W = 520, H = 150, L = 46, R = 10, T = 22, B = 30;
  const counts = fn.buckets;
  let lo = counts.findIndex((c) => c > 0), hi = counts.length - 1;
  while (hi > 0 && counts[hi] === 0) hi--;
  if (lo < 0) { lo = 0; hi = 0; }
  lo = Math.max(0, lo - 1); hi = Math.min(counts.length - 1, hi + 1);
  const shown = counts.slice(lo, hi + 1);
  const top = nice(Math.max(...shown));
  const box = svg("svg", {id, viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
                          "aria-label": `task times of ${fn.name}`});
  box.append(svg("text", {x: L, y: 14, class: "chart-title"},
                 `${fn.name}: ${fn.tasks} tasks, mean ${secs(fn.mean)}`));
  const bw = (W - L - R) / shown.length;
  shown.forEach((c, i) => {
    const h = (H - T - B) * c / top;
    const bar = svg("rect", {x: L + i * bw + 1, y: H - B - h, width: Math.max(1, bw - 2),
                             height: h, class: "bar"});
    bar.append(svg("title", {}, `${c} tasks from ${secs(Math.pow(2, lo + i + fn.first))}`));
    box.append(bar);
    if (shown.length <= 8 || i % 2 === 0) {
      box.append(svg("text", {x: L + i * bw + bw / 2, y: H - B + 14, class: "tick",
                              "text-anchor": "middle"},
                     secs(Math.pow(2, lo + i + fn.first))));
    }
  });
  box.append(svg("text", {x: L - 4, y: T + 4, class: "tick", "text-anchor": "end"}, top));
  box.append(svg("line", {x1: L, x2: W - R, y1: H - B, y2: H - B, class: "grid"}));
  return box;
}

function table(id, heads, rows) {
  const t = el("table", {id});
  t.append(el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const row of rows) body.append(row);
  t.append(body);
  return t;
}

function counts(pool) {
  const w = pool.workers, t = pool.tasks, p = `pool-${pool.id}`;
  const cell = (key, value, cls) => el("div", {class: `count ${cls || ""}`},
    el("span", {class: "n", id: `${p}-${key}`}, value), el("span", {class: "k"},
      key.replace(/^[wt]-/, "").replace("_", " ")));
  const workers = el("div", {class: "counts"}, el("span", {class: "label"}, "workers"),
    cell("w-processes", pool.processes),
    ...WORKER_STATES.map((s) => cell(`w-${s}`, w[s], w[s] && (s === "lost" || s === "pending")
                                     ? "warn" : "")));
  const tasks = el("div", {class: "counts"}, el("span", {class: "label"}, "tasks"),
    cell("t-queued", t.queued), cell("t-running", t.running),
    cell("t-held_ahead", Math.max(0, t.held - t.running)), cell("t-done", t.done),
    cell("t-failed", t.failed, t.failed ? "warn" : ""),
    cell("t-per_second", pool.throughput.toFixed(1)),
    cell("t-mean_time", secs(pool.task_seconds)));
  return [workers, tasks];
}

function groups(id, title, rows) {
  if (!rows.length) return null;
  return el("section", {}, el("h3", {}, title), table(id, [title.split(" ").pop(), "total",
    ...GROUP_STATES], rows.map((r) => el("tr", {}, el("td", {}, r.name), el("td", {}, r.total),
    ...GROUP_STATES.map((s) => el("td", {class: r[s] ? s : "zero"}, r[s]))))));
}

// the log shown under a pool's workers: {pool, worker, answer} (kept across redraws)
let shownLog = null;

function logButton(poolId, wid) {
  const button = el("button", {class: "log-button", "data-log": `${poolId}-${wid}`}, "log");
  button.addEventListener("click", () => {
    shownLog = {pool: poolId, worker: wid, answer: null};
    if (lastView) render(lastView);
    fetch(`api/log?token=${encodeURIComponent(TOKEN)}&pool=${poolId}&worker=${wid}`)
      .then((r) => r.json())
      .catch((e) => ({error: String(e)}))
      .then((answer) => {
        if (shownLog && shownLog.pool === poolId && shownLog.worker === wid) {
          shownLog.answer = answer;
          if (lastView) render(lastView);
        }
      });
  });
  return button;
}

function logPanel(pool) {
  if (!shownLog || shownLog.pool !== pool.id) return null;
  const a = shownLog.answer;
  let text;
  if (a === null) text = "asking the program…";
  else if (a.error) text = `could not get the log: ${a.error}`;
  else if (a.log === null) text = "this worker is no longer known to the pool";
  else if (!a.log) text = "the backend keeps no log of this job, or it is empty";
  else text = a.log;
  const close = el("button", {class: "log-button"}, "close");
  close.addEventListener("click", () => { shownLog = null; if (lastView) render(lastView); });
  return el("section", {id: `pool-${pool.id}-log`, class: "log"},
    el("h3", {}, `log of worker ${shownLog.worker}` + (a && a.job_id ? ` (job ${a.job_id})` : ""),
       " ", close),
    el("pre", {}, text));
}

function workerList(pool, now) {
  const p = `pool-${pool.id}`;
  const rows = pool.worker_list.map((w) => el("tr", {"data-worker": w.id, class: w.state},
    el("td", {}, w.id), el("td", {class: "state"}, w.state), el("td", {}, w.host || "-"),
    el("td", {class: "mono"}, w.job_id || "-"), el("td", {}, w.pid || "-"),
    el("td", {}, w.uptime === null ? "-" : age(w.uptime)), el("td", {}, w.done),
    el("td", {}, w.placement || "-"), el("td", {}, w.job_id ? logButton(pool.id, w.id) : "")));
  const more = pool.workers_hidden
    ? el("p", {class: "dim"}, `and ${pool.workers_hidden} more (counted by host above)`) : null;
  return el("section", {}, el("h3", {}, "workers"),
    table(`${p}-workers`, ["id", "state", "host", "job", "pid", "up", "tasks done",
                           "placement", ""], rows), more, logPanel(pool));
}

function poolCard(pool, now) {
  const p = `pool-${pool.id}`;
  const card = el("section", {class: "pool", id: p});
  card.append(el("h2", {}, `Pool ${pool.id} `, el("span", {class: "dim"}, `(${pool.state})`)));
  card.append(...counts(pool));
  const charts = el("div", {class: "charts"});
  charts.append(lineChart(`${p}-plot`, "tasks queued and running", pool.history,
    [{index: 1, name: "queued", cls: "s1"}, {index: 2, name: "running", cls: "s2"}], now, 600));
  charts.append(lineChart(`${p}-rate`, "throughput (tasks/s, over 10 s)", pool.history,
    [{index: 3, name: "tasks/s", cls: "s3"}], now, 600));
  pool.functions.forEach((fn, i) => charts.append(histogram(`${p}-hist-${i}`, fn)));
  card.append(charts);
  if (pool.adapt) {
    const a = pool.adapt;
    const box = el("section", {id: `${p}-adapt`}, el("h3", {}, "adaptation"),
      el("p", {}, `between ${a.minimum} and ${a.maximum} workers, idle timeout ` +
                  `${a.idle_timeout} s, growth ${a.growth}: wants ${a.wanted}`));
    for (const place of a.placements || []) {
      box.append(el("p", {class: "dim"}, `placement ${place.name} (max ${place.maximum}): ` +
        `wanted ${place.wanted}, pending ${place.pending}, starting ${place.starting}, ` +
        `busy ${place.busy}, idle ${place.idle}` +
        (place.skipped ? `, skipped for ${place.skipped} s` : "")));
    }
    const list = el("ul", {class: "decisions"});
    for (const [when, reason] of a.decisions.slice(-10).reverse()) {
      list.append(el("li", {}, el("span", {class: "time"}, clock(when)), " ", reason));
    }
    box.append(list);
    card.append(box);
  }
  const side = el("div", {class: "columns"});
  side.append(groups(`${p}-by-host`, "workers by host", pool.by_host) || "");
  side.append(groups(`${p}-by-placement`, "workers by placement", pool.by_placement) || "");
  card.append(side);
  if (pool.slowest.length) {
    card.append(el("section", {}, el("h3", {}, "slowest running tasks"),
      table(`${p}-slowest`, ["worker", "running for", "task"], pool.slowest.map((s) =>
        el("tr", {}, el("td", {}, s.worker), el("td", {}, secs(s.seconds)),
           el("td", {class: "mono"}, s.task))))));
  }
  const errors = el("section", {id: `${p}-errors`}, el("h3", {}, "last errors"));
  if (!pool.errors.length) errors.append(el("p", {class: "dim"}, "none"));
  for (const e of [...pool.errors].reverse()) {
    errors.append(el("div", {class: "error"},
      el("div", {}, el("span", {class: "time"}, clock(e.time)), " ",
         el("strong", {}, e.error), el("span", {class: "dim"}, `  (${e.task})`)),
      e.traceback ? el("pre", {}, e.traceback) : null));
  }
  card.append(errors);
  const lost = el("section", {id: `${p}-lost`}, el("h3", {}, "lost workers"));
  if (!pool.lost_list.length) lost.append(el("p", {class: "dim"}, "none"));
  else {
    lost.append(table(`${p}-lost-table`, ["when", "worker", "host", "job", ""],
      [...pool.lost_list].reverse().map((l) => el("tr", {"data-worker": l.worker},
        el("td", {}, clock(l.time)), el("td", {}, l.worker), el("td", {}, l.host || "-"),
        el("td", {class: "mono"}, l.job_id || "-"),
        el("td", {}, l.job_id ? logButton(pool.id, l.worker) : "")))));
  }
  card.append(lost);
  card.append(workerList(pool, now));
  return card;
}

let lastView = null;

function render(view) {
  if (view.pools) lastView = view;
  const link = document.getElementById("link");
  if (view.ended) {
    link.textContent = `program ${view.pid} has ended`;
    link.className = "link ended";
    document.body.dataset.state = "ended";
    return;
  }
  if (view.error) {
    link.textContent = view.error;
    link.className = "link error";
    if (view.failed) document.body.dataset.state = "failed";  // the dashboard stopped
    return;
  }
  const prog = view.program;
  link.textContent = `live, ${clock(view.time)}`;
  link.className = "link live";
  const head = document.getElementById("program");
  head.replaceChildren(
    el("span", {}, `pid ${prog.pid}`), el("span", {}, `run ${prog.run}`),
    el("span", {}, `backend ${prog.backend}`), el("span", {}, `up ${age(view.time - prog.since)}`),
    el("span", {}, `fiber ${prog.fiber}`),
    el("div", {class: "argv mono"}, prog.argv.join(" ")),
    view.others.length ? el("div", {class: "dim"},
      `other programs: ${view.others.join(", ")} (fiber dashboard --pid PID)`) : "");
  const pools = document.getElementById("pools");
  // a reader selecting text (a traceback to copy) keeps it: this redraw waits
  const selection = window.getSelection();
  if (selection && !selection.isCollapsed && pools.contains(selection.anchorNode)) return;
  // scrolled boxes (a log, a long traceback) stay where the reader left them
  const scrolled = new Map();
  pools.querySelectorAll("pre").forEach((pre, i) => {
    if (pre.scrollTop) scrolled.set(pre.closest("[id]")?.id + ":" + i, pre.scrollTop);
  });
  if (!view.pools.length) {
    pools.replaceChildren(el("p", {class: "dim"}, "no pool (they were closed and collected)"));
  } else {
    pools.replaceChildren(...view.pools.map((p) => poolCard(p, view.time)));
  }
  pools.querySelectorAll("pre").forEach((pre, i) => {
    const top = scrolled.get(pre.closest("[id]")?.id + ":" + i);
    if (top) pre.scrollTop = top;
  });
  document.body.dataset.updated = String(view.time);
}

function connect() {
  const source = new EventSource(`events?token=${encodeURIComponent(TOKEN)}`);
  source.onmessage = (event) => {
    const view = JSON.parse(event.data);
    render(view);
    if (view.ended || view.failed) source.close();
  };
  source.onerror = () => {
    const link = document.getElementById("link");
    if (!document.body.dataset.state) {
      link.textContent = "reconnecting…";
      link.className = "link error";
    }
  };
}

connect();
