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

  // Live parts are merged into the page, not swapped in: an element that is
  // still there keeps its DOM node, so a button under the pointer, a link
  // being followed and the element with keyboard focus survive every
  // update. Only attributes and text that changed are written.
  //
  // morph makes node `cur` look like `next` (a parsed copy of the part).
  // Children are matched by id where they have one, else by position among
  // siblings of the same tag without an id; an element whose tag or id
  // differs is replaced, since it is another thing.
  function sameKind(a, b) {
    if (a.nodeType !== b.nodeType) return false;
    if (a.nodeType !== 1) return true;
    return a.tagName === b.tagName && a.id === b.id;
  }

  function morphAttrs(cur, next) {
    var i, a;
    for (i = cur.attributes.length - 1; i >= 0; i--) {
      a = cur.attributes[i].name;
      if (!next.hasAttribute(a)) cur.removeAttribute(a);
    }
    for (i = 0; i < next.attributes.length; i++) {
      a = next.attributes[i];
      if (cur.getAttribute(a.name) !== a.value) cur.setAttribute(a.name, a.value);
    }
  }

  function morph(cur, next) {
    if (cur.nodeType !== 1) {
      if (cur.nodeValue !== next.nodeValue) cur.nodeValue = next.nodeValue;
      return;
    }
    morphAttrs(cur, next);
    // What the user is typing into stays as typed.
    if ((cur.tagName === "INPUT" || cur.tagName === "TEXTAREA" || cur.tagName === "SELECT") && cur === document.activeElement) return;
    var byId = {};
    var pool = [];
    var c;
    for (c = cur.firstChild; c; c = c.nextSibling) {
      if (c.nodeType === 1 && c.id) byId[c.id] = c;
      else pool.push(c);
    }
    var want = Array.prototype.slice.call(next.childNodes);
    var at = cur.firstChild; // where the next matched child must sit
    for (var i = 0; i < want.length; i++) {
      var w = want[i];
      var match = null;
      if (w.nodeType === 1 && w.id) {
        match = byId[w.id] || null;
        if (match) delete byId[w.id];
      } else {
        for (var j = 0; j < pool.length; j++) {
          if (pool[j] && sameKind(pool[j], w)) {
            match = pool[j];
            pool[j] = null;
            break;
          }
        }
      }
      if (match) {
        morph(match, w);
        if (match !== at) cur.insertBefore(match, at);
        else at = at.nextSibling;
      } else {
        cur.insertBefore(document.importNode(w, true), at);
      }
    }
    // Whatever was not matched is gone from the part.
    for (var id in byId) byId[id].remove();
    for (var k = 0; k < pool.length; k++) if (pool[k]) pool[k].remove();
  }

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
      if (!el) continue;
      var tpl = document.createElement("template");
      tpl.innerHTML = parts[id];
      var next = tpl.content.firstElementChild;
      if (next && next.id === id) morph(el, next);
    }
    tick();
    body.dataset.updates = String(Number(body.dataset.updates || 0) + 1);
    if (status) status.textContent = "Live updates: connected, last " + new Date().toLocaleTimeString();
  });
})();
