// The page's script: frames from /events (server-sent events) placed into the page, and,
// with --http-control, the buttons. Every HTML string in a frame was escaped by the server
// (supervisor.web.html_text); what this script writes itself goes in as text.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const control = document.body.dataset.control === "1";
  const rows = new Map(); // row key -> <tr>, kept across frames (a click lands on one button)
  let columnsKey = "";
  let token = "";

  if (control) {
    const given = /(?:^#|&)token=([A-Za-z0-9_-]+)/.exec(location.hash);
    if (given) {
      token = given[1];
      sessionStorage.setItem("qw-token", token);
      history.replaceState(null, "", location.pathname); // not left on a projected screen
    } else {
      token = sessionStorage.getItem("qw-token") || "";
    }
    $("token").addEventListener("input", (e) => { token = e.target.value.trim(); });
    $("token-box").hidden = token !== "";
  }

  function put(element, html) {
    if (element._html !== html) {
      element.innerHTML = html;
      element._html = html;
    }
  }

  function items(lines, empty) {
    return lines.length ? lines.map((l) => "<li>" + l + "</li>").join("") : empty;
  }

  function button(kind, slot, label) {
    const b = document.createElement("button");
    b.className = "act " + kind;
    b.dataset.act = kind;
    b.dataset.slot = String(slot);
    b.textContent = label;
    return b;
  }

  function table(frame) {
    const key = JSON.stringify(frame.columns);
    const head = $("table").tHead;
    const body = $("table").tBodies[0];
    if (key !== columnsKey) {
      columnsKey = key;
      const cells = frame.columns.map(
        (c) => '<th class="' + (c.justify === "right" ? "right" : "") + '">' + c.name + "</th>");
      if (control) cells.push("<th></th>");
      head.innerHTML = "<tr>" + cells.join("") + "</tr>";
      rows.clear();
      body.replaceChildren();
    }
    const seen = new Set();
    frame.rows.forEach((r, i) => {
      let tr = rows.get(r.key);
      if (!tr) {
        tr = document.createElement("tr");
        tr.dataset.key = r.key;
        frame.columns.forEach((c) => {
          const td = tr.insertCell();
          if (c.justify === "right") td.className = "right";
        });
        if (control) {
          const td = tr.insertCell();
          td.className = "actions";
          if (!r.departed) {
            td.append(button("kill", r.slot, "kill -9"), button("pause", r.slot, "pause"));
          }
        }
        rows.set(r.key, tr);
      }
      r.cells.forEach((html, j) => put(tr.cells[j], html));
      tr.className = (r.departed ? "departed " : "") + "state-" + r.state;
      tr.dataset.slot = String(r.slot);
      tr.dataset.pid = r.pid === null ? "" : String(r.pid);
      for (const b of tr.querySelectorAll("button")) {
        b.disabled = !r.alive || frame.draining;
        if (b.dataset.act === "pause") b.textContent = r.paused ? "resume" : "pause";
      }
      if (body.children[i] !== tr) body.insertBefore(tr, body.children[i] || null);
      seen.add(r.key);
    });
    for (const [k, tr] of rows) {
      if (!seen.has(k)) {
        tr.remove();
        rows.delete(k);
      }
    }
  }

  // Columns are dropped whole when the table is wider than the page, as in the terminal:
  // the highest `drop` first; 0 is never dropped (slot, worker, state, task).
  function fit(columns) {
    const wrap = $("table").parentElement;
    const hide = (gone) => {
      for (const row of $("table").rows) {
        columns.forEach((c, i) => {
          if (row.cells[i]) row.cells[i].classList.toggle("gone", gone.has(i));
        });
      }
    };
    const gone = new Set();
    hide(gone);
    const order = columns.map((c, i) => [c.drop, i]).filter(([d]) => d > 0);
    order.sort((a, b) => b[0] - a[0]);
    for (const [, i] of order) {
      if (wrap.scrollWidth <= wrap.clientWidth) break;
      gone.add(i);
      hide(gone);
    }
  }

  let last = null;
  window.addEventListener("resize", () => { if (last) fit(last.columns); });

  function render(frame) {
    last = frame;
    put($("head-left"), frame.header.left);
    put($("head-right"), frame.header.right);
    table(frame);
    fit(frame.columns);
    $("orphans").hidden = frame.orphans.lines.length === 0;
    put($("orphans-title"), frame.orphans.title);
    put($("orphan-lines"), items(frame.orphans.lines, ""));
    put($("event-lines"), items(frame.events, '<li class="dim">no events yet</li>'));
    put($("queue-counts"), frame.queue);
    put($("throughput"), frame.throughput);
    put($("log"), frame.log);
    $("partitions").hidden = frame.partitions.length === 0;
    put($("partition-lines"), frame.partitions.join("\n"));
    const conn = $("conn");
    conn.textContent = "live · " + frame.now;
    conn.className = "conn";
    if (control) $("kill-holder").disabled = frame.draining;
  }

  function say(text, bad) {
    const said = $("said");
    said.textContent = text;
    said.className = bad ? "bad" : "";
  }

  async function act(kind, slot) {
    if (!token) {
      $("token-box").hidden = false;
      $("token").focus();
      say("enter the control token qw up printed", true);
      return;
    }
    const form = new URLSearchParams();
    if (slot !== undefined) form.set("slot", slot);
    try {
      const answer = await fetch("/control/" + kind, {
        method: "POST", headers: { "X-QW-Token": token }, body: form,
      });
      const body = await answer.json();
      say(answer.ok ? body.done : body.error, !answer.ok);
      if (answer.status === 403) $("token-box").hidden = false;
    } catch (err) {
      say("no answer from qw up: " + err, true);
    }
  }

  if (control) {
    document.addEventListener("click", (e) => {
      const b = e.target.closest("button[data-act]");
      if (b && !b.disabled) act(b.dataset.act, b.dataset.slot);
    });
  }

  const events = new EventSource("/events");
  events.onmessage = (e) => render(JSON.parse(e.data));
  events.onerror = () => {
    const conn = $("conn");
    conn.textContent = "no connection to qw up (has it ended?) · retrying";
    conn.className = "conn lost";
  };
})();
