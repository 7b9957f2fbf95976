// The etcdq dashboard: polls api/overview and draws it. No framework, no build
// step, nothing loaded from elsewhere. Values from etcd are only ever set as
// text (textContent), never as HTML.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg"; // a namespace name, not a download
  const TOKEN_KEY = "etcdq-dashboard-token";
  const csrf = document.querySelector('meta[name="csrf-token"]').content;
  let token = sessionStorage.getItem(TOKEN_KEY) || "";
  let timer = null;
  let period = 2000;

  const $ = (selector) => document.querySelector(selector);

  // "#token=..." in the URL (what `etcdq dashboard` prints): kept for this tab
  // only, and removed from the address bar and history.
  function takeTokenFromHash() {
    const match = /^#token=(.+)$/.exec(location.hash);
    if (match) {
      token = decodeURIComponent(match[1]);
      sessionStorage.setItem(TOKEN_KEY, token);
      history.replaceState(null, "", location.pathname + location.search);
    }
  }

  function headers(extra) {
    const all = Object.assign({}, extra);
    if (token) all.Authorization = "Bearer " + token;
    return all;
  }

  async function poll() {
    clearTimeout(timer);
    try {
      const response = await fetch("api/overview", {headers: headers(), cache: "no-store"});
      if (response.status === 401) {
        showLogin(token ? "That token was refused." : "");
        return; // no more polling until signed in
      }
      const overview = await response.json();
      render(overview);
      period = Math.max(500, (overview.interval || 2) * 1000);
      setStatus(overview.error ? "etcd: " + overview.error : "", Boolean(overview.error));
    } catch (error) {
      setStatus("dashboard unreachable: " + error.message, true);
    }
    timer = setTimeout(poll, period);
  }

  function showLogin(message) {
    $("#main").hidden = true;
    $("#login").hidden = false;
    $("#login-error").textContent = message;
    $("#token").focus();
  }

  function setStatus(message, bad) {
    const status = $("#status");
    status.textContent = message;
    status.className = bad ? "error" : "";
  }

  function flash(message, bad) {
    const line = $("#flash");
    line.textContent = message;
    line.className = bad ? "error" : "ok";
  }

  // -- rendering ---------------------------------------------------------------
  function render(overview) {
    $("#login").hidden = true;
    $("#main").hidden = false;
    document.body.classList.toggle("actions", Boolean(overview.actions));
    $("#prefix").textContent = overview.prefix || "";
    if (overview.generated) {
      $("#updated").textContent = "updated " + clock(overview.generated);
    }
    const queues = overview.queues || [];
    renderQueues(queues, overview.prefix);
    if (overview.throughput) renderThroughput(overview.throughput);
    renderRunning(queues);
    renderDead(queues);
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (className) td.className = className;
    return td;
  }

  // A traceback under its reason, folded; kept open across polls once opened.
  const openTracebacks = new Set();
  function traceback(text, key) {
    const details = document.createElement("details");
    details.className = "traceback";
    const summary = document.createElement("summary");
    summary.textContent = "traceback";
    const pre = document.createElement("pre");
    pre.textContent = text;
    details.append(summary, pre);
    details.open = openTracebacks.has(key);
    details.addEventListener("toggle", () => {
      if (details.open) openTracebacks.add(key); else openTracebacks.delete(key);
    });
    return details;
  }

  function button(label, action, data) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    b.dataset.action = action;
    Object.assign(b.dataset, data);
    return b;
  }

  function fill(tbody, rows, empty, columns) {
    tbody.textContent = "";
    if (rows.length === 0) {
      const tr = document.createElement("tr");
      const td = cell(empty, "empty");
      td.colSpan = columns;
      tr.appendChild(td);
      tbody.appendChild(tr);
    }
    rows.forEach((row) => tbody.appendChild(row));
  }

  function renderQueues(queues, prefix) {
    const rows = queues.map((queue) => {
      const tr = document.createElement("tr");
      tr.dataset.queue = queue.name;
      tr.appendChild(cell(queue.name, "name"));
      for (const state of ["pending", "running", "completed", "failed"]) {
        const td = cell(queue.counts[state], "num " + state);
        td.dataset.count = state;
        tr.appendChild(td);
      }
      const actions = cell("", "action");
      actions.appendChild(button("purge completed", "purge", {queue: queue.name, kind: "completed"}));
      actions.appendChild(button("purge dead letters", "purge", {queue: queue.name, kind: "failed"}));
      tr.appendChild(actions);
      return tr;
    });
    fill($("#queues tbody"), rows, "No queues under " + (prefix || "the prefix") + " yet.", 6);
  }

  function renderRunning(queues) {
    const rows = [];
    for (const queue of queues) {
      for (const item of queue.running) {
        const tr = document.createElement("tr");
        tr.dataset.queue = queue.name;
        tr.dataset.item = item.id;
        tr.appendChild(cell(queue.name));
        tr.appendChild(cell(item.id, "id"));
        tr.appendChild(cell(item.node, "node"));
        tr.appendChild(cell(item.attempt, "num"));
        tr.appendChild(cell((item.age_is_minimum ? "\u2265 " : "") + duration(item.age), "num"));
        tr.appendChild(cell(item.lock_ttl ? duration(item.lock_ttl) : "", "num"));
        rows.push(tr);
      }
    }
    $("#running-count").textContent = "(" + rows.length + ")";
    fill($("#running tbody"), rows, "Nothing is running.", 6);
  }

  function renderDead(queues) {
    const rows = [];
    let total = 0;
    for (const queue of queues) {
      total += queue.counts.failed;
      for (const dead of queue.dead_letters) {
        const tr = document.createElement("tr");
        tr.dataset.queue = queue.name;
        tr.dataset.item = dead.id;
        tr.appendChild(cell(queue.name));
        tr.appendChild(cell(dead.id, "id"));
        const reason = cell(dead.reason, "reason");
        if (dead.traceback) reason.appendChild(traceback(dead.traceback, queue.name + "/" + dead.id));
        tr.appendChild(reason);
        tr.appendChild(cell(dead.attempts, "num"));
        tr.appendChild(cell(dead.node, "node"));
        tr.appendChild(cell(dead.finished ? clock(dead.finished) : "", "time"));
        tr.appendChild(cell(dead.payload, "payload"));
        const actions = cell("", "action");
        actions.appendChild(button("requeue", "requeue", {queue: queue.name, id: dead.id}));
        tr.appendChild(actions);
        rows.push(tr);
      }
    }
    const shown = rows.length < total ? rows.length + " newest of " + total : String(total);
    $("#dead-count").textContent = "(" + shown + ")";
    fill($("#dead tbody"), rows, "No dead letters.", 8);
  }

  // -- the plot: stacked bars per bucket, in items per minute ----------------------
  const PLOT = {width: 1100, height: 200, left: 48, right: 8, top: 10, bottom: 24};

  function svg(name, attributes, text) {
    const element = document.createElementNS(SVG, name);
    for (const key of Object.keys(attributes)) element.setAttribute(key, attributes[key]);
    if (text !== undefined) element.textContent = text;
    return element;
  }

  function renderThroughput(throughput) {
    const plot = $("#plot");
    plot.textContent = "";
    const perMinute = 60 / throughput.bucket;
    const done = throughput.completed.map((n) => n * perMinute);
    const failed = throughput.failed.map((n) => n * perMinute);
    const top = niceCeiling(Math.max(1, ...done.map((n, i) => n + failed[i])));
    const inner = {w: PLOT.width - PLOT.left - PLOT.right, h: PLOT.height - PLOT.top - PLOT.bottom};
    const y = (value) => PLOT.top + inner.h - (value / top) * inner.h;
    for (const value of [0, top / 2, top]) {
      plot.appendChild(svg("line", {x1: PLOT.left, x2: PLOT.width - PLOT.right, y1: y(value), y2: y(value), class: "grid"}));
      plot.appendChild(svg("text", {x: PLOT.left - 6, y: y(value) + 4, class: "axis", "text-anchor": "end"}, formatRate(value)));
    }
    const step = inner.w / done.length;
    done.forEach((value, i) => {
      const x = PLOT.left + i * step;
      const at = throughput.start + i * throughput.bucket;
      const group = svg("g", {});
      group.appendChild(svg("title", {}, clock(at) + ": " + throughput.completed[i] + " completed, " + throughput.failed[i] + " dead-lettered"));
      group.appendChild(svg("rect", {x: x + 0.5, width: Math.max(step - 1, 1), y: y(value), height: y(0) - y(value), class: "bar completed"}));
      group.appendChild(svg("rect", {x: x + 0.5, width: Math.max(step - 1, 1), y: y(value + failed[i]), height: y(value) - y(value + failed[i]), class: "bar failed"}));
      plot.appendChild(group);
    });
    const span = done.length * throughput.bucket;
    for (const [fraction, anchor] of [[0, "start"], [0.5, "middle"], [1, "end"]]) {
      const ago = span * (1 - fraction);
      plot.appendChild(svg("text", {x: PLOT.left + fraction * inner.w, y: PLOT.height - 6, class: "axis", "text-anchor": anchor},
        ago ? "\u2212" + duration(ago) : "now"));
    }
    const completed = throughput.completed.reduce((a, b) => a + b, 0);
    const dead = throughput.failed.reduce((a, b) => a + b, 0);
    $("#throughput-summary").textContent = "(last " + duration(span) + ": " + completed +
      " completed, " + dead + " dead-lettered; items per minute)";
  }

  function niceCeiling(value) {
    const magnitude = Math.pow(10, Math.floor(Math.log10(value)));
    for (const factor of [1, 2, 5, 10]) {
      if (value <= factor * magnitude) return factor * magnitude;
    }
    return 10 * magnitude;
  }

  function formatRate(value) {
    return value >= 100 ? Math.round(value).toString() : String(Math.round(value * 10) / 10);
  }

  function duration(seconds) {
    seconds = Math.max(0, Math.round(seconds));
    if (seconds < 60) return seconds + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min" + (seconds % 60 ? " " + (seconds % 60) + " s" : "");
    return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
  }

  function clock(epochSeconds) {
    return new Date(epochSeconds * 1000).toLocaleTimeString();
  }

  // -- actions -----------------------------------------------------------------
  async function act(path, body) {
    const response = await fetch(path, {
      method: "POST",
      headers: headers({"Content-Type": "application/json", "X-CSRF-Token": csrf}),
      body: JSON.stringify(body),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error || "HTTP " + response.status);
    return answer;
  }

  async function onAction(b) {
    const data = b.dataset;
    let what, path, body;
    if (data.action === "requeue") {
      [what, path, body] = ["requeue " + data.id, "api/requeue", {queue: data.queue, id: data.id}];
    } else {
      what = "purge the " + (data.kind === "failed" ? "dead letters" : "completion records") + " of " + data.queue;
      if (!window.confirm(what[0].toUpperCase() + what.slice(1) + "?")) return;
      [path, body] = ["api/purge", {queue: data.queue, kind: data.kind}];
    }
    b.disabled = true;
    try {
      const answer = await act(path, body);
      flash(data.action === "requeue" ? "Requeued " + data.id + " as " + answer.new_id + "."
        : "Removed " + answer.removed + " records of " + data.queue + ".", false);
    } catch (error) {
      flash("Could not " + what + ": " + error.message, true);
      b.disabled = false;
    }
    poll();
  }

  document.addEventListener("click", (event) => {
    const b = event.target.closest("button[data-action]");
    if (b) onAction(b);
  });

  // -- one item, looked up by id: a requeued dead letter is followed ------------
  function renderItem(item) {
    const out = $("#item-found");
    out.replaceChildren();
    if (item.requeued_from && item.requeued_from.length) {
      const note = document.createElement("p");
      note.className = "muted";
      note.textContent = item.requeued_from.join(" \u2192 ") + " \u2192 " + item.id +
        ": a requeued dead letter, followed to the item its requeue made.";
      out.appendChild(note);
    }
    const list = document.createElement("dl");
    const times = {created: 1, finished: 1, due: 1};
    for (const name of ["id", "state", "attempts", "node", "reason", "due", "created",
                        "finished", "payload", "result"]) {
      const value = item[name];
      if (value === null || value === undefined) continue;
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = times[name] ? clock(value) : String(value);
      list.append(dt, dd);
    }
    out.appendChild(list);
    if (item.traceback) out.appendChild(traceback(item.traceback, "item"));
  }

  $("#find").addEventListener("submit", async (event) => {
    event.preventDefault();
    const query = "queue=" + encodeURIComponent($("#find-queue").value.trim()) +
      "&id=" + encodeURIComponent($("#find-id").value.trim());
    try {
      const response = await fetch("api/item?" + query, {headers: headers({})});
      const answer = await response.json().catch(() => ({}));
      if (!response.ok) throw new Error(answer.error || "HTTP " + response.status);
      renderItem(answer);
    } catch (error) {
      $("#item-found").replaceChildren();
      flash("Could not find the item: " + error.message, true);
    }
  });

  $("#login").addEventListener("submit", (event) => {
    event.preventDefault();
    token = $("#token").value.trim();
    sessionStorage.setItem(TOKEN_KEY, token);
    $("#token").value = "";
    poll();
  });

  takeTokenFromHash();
  poll();
})();
