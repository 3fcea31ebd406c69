/* The mtserve dashboard's script (inlined into index.html at build time): reads a bearer token
 * from ?token= once into sessionStorage, polls GET /api/v1/dashboard/state every 1.5 s and
 * renders it with DOM calls only (every server string is set as text, never parsed as HTML). */
"use strict";
(function () {
  const STATE_URL = "/api/v1/dashboard/state";
  const POLL_MS = 1500;
  const TOKEN_KEY = "mtserve.dashboard.token";
  const SVG_NS = "http://www.w3.org/2000/svg";

  /* For tests and the curious: the last state and how many polls were rendered. */
  const dash = window.mtsDashboard = { polls: 0, errors: 0, state: null };

  /* ---- token: ?token= once, then sessionStorage; removed from the address bar ---- */
  (function takeToken() {
    const params = new URLSearchParams(window.location.search);
    const t = params.get("token");
    if (t) {
      sessionStorage.setItem(TOKEN_KEY, t);
      params.delete("token");
      const q = params.toString();
      history.replaceState(null, "", window.location.pathname + (q ? "?" + q : "") + window.location.hash);
    }
  })();

  function token() { return sessionStorage.getItem(TOKEN_KEY); }

  /* ---- formatting ---- */
  function fmtBytes(n) {
    if (n === null || n === undefined) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = n;
    while (Math.abs(v) >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + " " + u[i];
  }
  function fmtNum(v, digits) {
    if (v === null || v === undefined) return "–";
    if (digits === undefined) digits = Math.abs(v) < 10 ? 2 : (Math.abs(v) < 100 ? 1 : 0);
    return Number(v).toFixed(digits);
  }
  function fmtInt(v) { return v === null || v === undefined ? "–" : String(v); }
  function fmtUptime(s) {
    s = Math.floor(s);
    const d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600), m = Math.floor(s % 3600 / 60);
    if (d) return d + "d " + h + "h";
    if (h) return h + "h " + m + "m";
    return m + "m " + (s % 60) + "s";
  }
  function fmtTime(ms) {
    const d = new Date(ms);
    const p = (x) => String(x).padStart(2, "0");
    return p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
  }

  /* ---- DOM helpers ---- */
  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    if (attrs) for (const k in attrs) {
      if (k === "text") e.textContent = attrs[k];
      else if (k === "cls") e.className = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    if (children) for (const c of children) if (c) e.appendChild(c);
    return e;
  }
  function td(text, cls, field) {
    const a = { text: text };
    if (cls) a.cls = cls;
    if (field) a["data-field"] = field;
    return el("td", a);
  }
  function setText(id, text) { document.getElementById(id).textContent = text; }
  function fillBody(table, rows, cols, emptyText) {
    const tb = document.querySelector("#" + table + " tbody");
    tb.replaceChildren();
    if (!rows.length) {
      tb.appendChild(el("tr", { cls: "empty" }, [el("td", { text: emptyText, colspan: String(cols) })]));
      return;
    }
    for (const r of rows) tb.appendChild(r);
  }
  function meter(used, budget) {
    const frac = budget > 0 ? Math.min(1, used / budget) : 0;
    const bar = el("span");
    bar.style.width = (frac * 100).toFixed(1) + "%";
    const wrap = el("span", {}, [el("span", { cls: "meter" }, [bar]),
      el("span", { cls: "meter-text", text: fmtBytes(used) + " / " + fmtBytes(budget) + " (" + (frac * 100).toFixed(0) + "%)" })]);
    return wrap;
  }
  function svg(tag, attrs) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    return e;
  }
  function sparkline(req, err) {
    const w = 120, h = 24, n = req.length;
    const max = Math.max(1, ...req);
    const s = svg("svg", { width: w, height: h, class: "spark", viewBox: "0 0 " + w + " " + h });
    const pts = (a) => a.map((v, i) => ((i / Math.max(1, n - 1)) * (w - 2) + 1).toFixed(1) + "," +
      (h - 1 - (v / max) * (h - 2)).toFixed(1)).join(" ");
    if (err.some((v) => v > 0)) s.appendChild(svg("polyline", { points: pts(err), class: "spark-err" }));
    s.appendChild(svg("polyline", { points: pts(req), class: "spark-req" })); /* on top */
    const t = svg("title", {});
    t.textContent = "requests per second, last " + n + " s (max " + max + ")";
    s.appendChild(t);
    return s;
  }
  function histogram(bs) {
    const w = 120, h = 24, n = bs.counts.length, bw = w / n;
    const max = Math.max(1, ...bs.counts);
    const s = svg("svg", { width: w, height: h, class: "hist", viewBox: "0 0 " + w + " " + h });
    s.appendChild(svg("line", { x1: 0, y1: h - 0.5, x2: w, y2: h - 0.5, class: "hist-axis" }));
    const parts = [];
    bs.counts.forEach((c, i) => {
      const bh = c ? Math.max(1, (c / max) * (h - 2)) : 0;
      s.appendChild(svg("rect", { x: (i * bw + 1).toFixed(1), y: (h - 1 - bh).toFixed(1), width: (bw - 2).toFixed(1),
        height: bh.toFixed(1), class: "hist-bar" }));
      if (c) parts.push("≤" + bs.le[i] + ": " + c);
    });
    const t = svg("title", {});
    t.textContent = parts.length ? "batches by size: " + parts.join(", ") : "no batches in the window";
    s.appendChild(t);
    return s;
  }

  /* ---- rendering ---- */
  function render(st) {
    const srv = st.server;
    let rps = 0, eps = 0;
    for (const m of st.models) { rps += m.rates.requests_per_s; eps += m.rates.errors_per_s; }
    setText("c-uptime", fmtUptime(srv.uptime_s));
    setText("c-rps", fmtNum(rps));
    setText("c-eps", fmtNum(eps));
    setText("c-completed", fmtInt(srv.completed));
    setText("c-failed", fmtInt(srv.failed));
    setText("c-queue", fmtInt(srv.queue_depth));
    setText("c-resident", fmtInt(srv.resident_models) + " / " + st.models.length);
    const hasLipsync = st.models.some((m) => m.lipsync);
    setText("c-users", hasLipsync ? fmtNum(st.capacity.users, 1) : "–");

    fillBody("devices", st.devices.map((d) => el("tr", { "data-device": d.name }, [
      td(d.name), el("td", {}, [meter(d.used_bytes, d.budget_bytes)]), td(fmtInt(d.models), "num"),
      td(d.busy_workers + " / " + d.workers, "num"), td(fmtInt(d.threads), "num"), td(fmtInt(d.queue_depth), "num"),
    ])), 6, "no devices");

    fillBody("models", st.models.map((m) => {
      const state = el("td", {}, [el("span", { cls: "badge " + m.state, text: m.state, "data-field": "state" })]);
      if (m.reason) state.appendChild(el("div", { cls: "muted why", text: m.reason, title: m.reason }));
      return el("tr", { "data-model": m.name }, [
        td(m.name + (m.pinned ? " (pinned)" : ""), null, "name"), state, td(m.device || "–", null, "device"),
        el("td", { text: m.precision, "data-field": "precision", title: m.precision_reason || "" }), td(fmtBytes(m.memory_bytes), "num", "memory"),
        td(fmtInt(m.queue_depth), "num", "queue"), td(fmtNum(m.rates.requests_per_s), "num", "rps"),
        td(fmtNum(m.rates.errors_per_s), "num", "eps"), td(fmtNum(m.latency_ms.p50), "num", "p50"),
        td(fmtNum(m.latency_ms.p99), "num", "p99"),
        el("td", {}, [sparkline(m.series.requests, m.series.errors)]), el("td", {}, [histogram(m.batch_sizes)]),
        td(fmtInt(m.success_total), "num", "success"), td(fmtInt(m.fail_total), "num", "failed"),
      ]);
    }), 14, "no models configured");

    const lip = st.models.filter((m) => m.lipsync);
    fillBody("lipsync", lip.map((m) => {
      const b = m.bgcache, l = m.lipsync;
      return el("tr", { "data-model": m.name }, [
        td(m.name), td(b ? fmtNum(b.hit_rate * 100, 1) + " %" : "–", "num", "hit_rate"),
        td(b ? fmtInt(b.frames_cached) : "–", "num"), td(b ? fmtBytes(b.bytes) + " / " + fmtBytes(b.capacity_bytes) : "–", "num"),
        td(fmtNum(l.ms_per_frame), "num"), td(fmtNum(l.fps), "num", "fps"), td(fmtNum(l.throughput_fps), "num"),
        td(fmtNum(l.users, 1), "num", "users"), td(l.fps_source, "muted"),
      ]);
    }), 9, "no lip-sync models (models with a background_dir) configured");

    fillBody("events", st.events.map((e) => el("tr", { "data-seq": String(e.seq) }, [
      td(fmtTime(e.time_ms)), el("td", {}, [el("span", { cls: "badge " + e.kind, text: e.kind })]), td(e.model),
      td(e.device || "–"), td(e.reason, "reason"),
    ])), 5, "no events yet");

    setText("updated", "Updated " + fmtTime(st.now_ms) + ".");
  }

  /* ---- polling ---- */
  function setConn(state, text) {
    const c = document.getElementById("conn");
    c.dataset.state = state;
    setText("conn-text", text);
  }
  function showAuth(msg) {
    document.getElementById("auth").hidden = false;
    setText("auth-msg", msg);
  }
  document.getElementById("auth-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const v = document.getElementById("auth-token").value.trim();
    if (v) sessionStorage.setItem(TOKEN_KEY, v);
    document.getElementById("auth").hidden = true;
    poll();
  });

  let timer = null;
  async function poll() {
    if (timer) { clearTimeout(timer); timer = null; }
    const headers = { "Accept": "application/json" };
    const t = token();
    if (t) headers["Authorization"] = "Bearer " + t;
    let wait = POLL_MS;
    try {
      const r = await fetch(STATE_URL, { headers: headers, cache: "no-store", credentials: "omit" });
      if (r.status === 401 || r.status === 403) {
        setConn("error", r.status === 401 ? "token needed" : "token lacks the infer scope");
        showAuth(r.status === 401 ? "Open this page as /dashboard?token=<token>, or enter the token here."
                                  : "The token was refused for this endpoint.");
        dash.errors++;
        return; /* waits for a token from the form */
      }
      if (!r.ok) throw new Error("HTTP " + r.status);
      const st = await r.json();
      dash.state = st;
      render(st);
      dash.polls++;
      setConn(st.server.shutting_down ? "error" : "ok", st.server.shutting_down ? "shutting down" : "live");
    } catch (e) {
      dash.errors++;
      setConn("error", "no answer from the server (" + (e && e.message ? e.message : e) + "); retrying");
      wait = POLL_MS * 2;
    }
    timer = setTimeout(poll, wait);
  }
  poll();
})();
