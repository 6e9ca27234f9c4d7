// runcue dashboard: live updates without lying.
//
// - A heartbeat stream (pulse) proves the server is there; after about two
//   missed beats, or when the connection drops, the page says
//   "disconnected". EventSource reconnects by itself.
// - The event stream (stream?type=...) only marks the page dirty; at most
//   once a second a dirty page fetches its main block again (?partial=1)
//   and swaps it in. document.body.dataset.batches counts those refreshes.
// - The live tail appends events, flushed at most once a second.
// Streams start at the event position the page was read at (data-after),
// never replaying the event log; a reconnecting EventSource resumes after
// its last event (Last-Event-ID).
(function () {
  "use strict";
  var body = document.body;
  var hb = parseInt(body.dataset.heartbeat || "2000", 10);
  var conn = document.getElementById("conn");
  var lastBeat = 0;
  function setConn(state) {
    if (conn.dataset.state === state) return;
    conn.dataset.state = state;
    conn.textContent = state;
    conn.className = "conn " + state;
  }
  // Each heartbeat says whether the database answers: while it does not
  // (a restart, a failover, a lost connection), a banner says since when
  // and why; it goes when the database answers again.
  var banner = document.getElementById("banner");
  function setBanner(data) {
    var b;
    try { b = JSON.parse(data); } catch (e) { return; }
    if (!banner || typeof b !== "object" || b === null) return;
    if (b.ok) { banner.hidden = true; banner.textContent = ""; return; }
    var since = b.since ? new Date(b.since) : null;
    var msg = b.role === "failed" ? "The database failed: runcue stopped dispatching" :
      "The database is unavailable" + (since ? " since " + since.toLocaleTimeString() : "") + ": runcue retries and resumes by itself";
    if (b.error) msg += " (" + b.error + ")";
    banner.textContent = msg;
    banner.hidden = false;
  }
  var pulse = new EventSource("pulse");
  pulse.addEventListener("heartbeat", function (e) { lastBeat = Date.now(); setConn("live"); setBanner(e.data); });
  pulse.onerror = function () { setConn("disconnected"); };
  setInterval(function () {
    if (lastBeat && Date.now() - lastBeat > 2.5 * hb) setConn("disconnected");
  }, Math.max(250, hb / 4));

  var batches = 0;
  function batched() { batches++; body.dataset.batches = String(batches); }

  // Confirmation of actions.
  document.addEventListener("submit", function (e) {
    var msg = e.target.dataset && e.target.dataset.confirm;
    if (msg && !window.confirm(msg)) e.preventDefault();
  });

  var allTypes = ["work_queued", "work_started", "work_completed", "work_failed", "work_skipped",
    "work_cancelled", "work_retrying", "work_recovered", "work_requeued", "service_status",
    "service_changed", "task_changed", "queue_changed", "backpressure_active", "backpressure_cleared",
    "budget_exhausted", "gap"];

  var tail = document.getElementById("tail");
  if (tail) { followTail(); return; }

  var types = (body.dataset.stream || allTypes.join(",")).split(",");
  var dirty = false, busy = false;
  // From the event position the page was read at: nothing committed
  // since is missed, however late the stream connects.
  var stream = new EventSource("stream?type=" + encodeURIComponent(types.join(",")) + "&after=" + (body.dataset.after || "0"));
  types.forEach(function (t) { stream.addEventListener(t, function () { dirty = true; }); });
  setInterval(function () {
    if (!dirty || busy) return;
    dirty = false; busy = true;
    var u = new URL(window.location.href);
    u.searchParams.set("partial", "1");
    fetch(u, { headers: { "Accept": "text/html" } }).then(function (r) {
      if (!r.ok) throw new Error(r.status);
      return r.text();
    }).then(function (html) {
      var main = document.getElementById("main");
      // Keep an open <details> (a limits form being edited) as it is.
      if (main.querySelector("details[open]")) { dirty = true; return; }
      main.innerHTML = html;
      batched();
    }).catch(function () { dirty = true; }).finally(function () { busy = false; });
  }, 1000);

  function followTail() {
    var form = document.getElementById("tailfilter");
    var es = null, pending = [];
    function start() {
      if (es) es.close();
      var q = new URLSearchParams(new FormData(form));
      var t = q.get("type") || allTypes.join(",");
      var url = "stream?type=" + encodeURIComponent(t) + (q.get("task") ? "&task=" + encodeURIComponent(q.get("task")) : "") +
        "&after=" + (body.dataset.after || "0");
      es = new EventSource(url);
      t.split(",").forEach(function (ty) {
        es.addEventListener(ty.trim(), function (m) { pending.push(JSON.parse(m.data)); });
      });
    }
    form.addEventListener("submit", function (e) { e.preventDefault(); tail.innerHTML = ""; start(); });
    start();
    setInterval(function () {
      if (!pending.length) return;
      var frag = document.createDocumentFragment();
      pending.splice(0).reverse().forEach(function (ev) { // newest first, as the rows above
        var tr = document.createElement("tr");
        tr.className = "ev-" + ev.type;
        var detail = ev.error || ev.reason || (ev.service && ev.service.name ? ev.service.name + " " + (ev.service.circuit || "") : "") || "";
        [new Date(ev.time).toLocaleTimeString(), ev.type, ev.task || "", "", detail].forEach(function (text, i) {
          var td = document.createElement("td");
          if (i === 3 && ev.work_id) {
            var a = document.createElement("a");
            a.href = "work/" + encodeURIComponent(ev.work_id);
            a.textContent = ev.target || ev.work_id;
            td.appendChild(a);
          } else td.textContent = text;
          tr.appendChild(td);
        });
        frag.appendChild(tr);
      });
      tail.insertBefore(frag, tail.firstChild);
      while (tail.rows.length > 500) tail.deleteRow(tail.rows.length - 1);
      batched();
    }, 1000);
  }
})();
