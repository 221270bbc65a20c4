// dpxe dashboard: live lease countdowns and server-sent-event updates.
// Every page works without this script; it only keeps them fresh.
(function () {
  "use strict";
  var body = document.body;
  var offset = 0; // server clock minus browser clock, in ms
  if (body.dataset.now) offset = Number(body.dataset.now) - Date.now();

  function span(ms) {
    var s = Math.floor(ms / 1000);
    if (s < 60) return s + " s";
    if (s < 3600) return Math.floor(s / 60) + " min";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  function tick() {
    var now = Date.now() + offset;
    var ago = document.querySelectorAll("time.ago");
    for (var j = 0; j < ago.length; j++) {
      var d = now - Date.parse(ago[j].getAttribute("datetime"));
      ago[j].textContent = d < 1000 ? "just now" : span(d) + " ago";
    }
    var els = document.querySelectorAll("time.countdown");
    for (var i = 0; i < els.length; i++) {
      var left = Date.parse(els[i].getAttribute("datetime")) - now;
      els[i].textContent = left <= 0 ? "expired" : "in " + span(left);
      els[i].classList.toggle("urgent", left < 10000);
    }
  }
  setInterval(tick, 1000);
  tick();

  // Shard-map cells carry no per-cell text (thousands of them); name the
  // shard range under the pointer in the cell's title on demand.
  document.addEventListener("mouseover", function (e) {
    var cell = e.target;
    if (cell.tagName !== "I" || !cell.parentNode.classList.contains("cells") || cell.title) return;
    var grid = cell.parentNode;
    var block = Number(document.getElementById("shardmap").dataset.block || 1);
    var idx = Array.prototype.indexOf.call(grid.children, cell);
    var lo = Number(grid.dataset.start) + idx * block;
    cell.title = (block > 1 ? "shards " + lo + "–" + (lo + block - 1) : "shard " + lo) + ": " + cell.textContent;
  });

  var status = document.getElementById("live-status");
  var url = body.dataset.live;
  if (!url || !window.EventSource) return;
  var es = new EventSource(url);
  if (status) status.textContent = "Live updates: connecting…";
  es.addEventListener("open", function () {
    if (status) status.textContent = "Live updates: connected";
  });
  es.addEventListener("error", function () {
    if (status) status.textContent = "Live updates: reconnecting…";
  });
  es.addEventListener("update", function (e) {
    var msg = JSON.parse(e.data);
    if (msg.now) offset = msg.now - Date.now();
    var parts = msg.parts || {};
    for (var id in parts) {
      var el = document.getElementById(id);
      if (el) el.outerHTML = parts[id];
    }
    tick();
    body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
    if (status) status.textContent = "Live updates: connected, last " + new Date().toLocaleTimeString();
  });
})();
