// The Airlock console's page. Every byte of data (a job's, a caller's or
// a repository's) reaches the document as text: textContent and
// createTextNode only, never parsed as HTML; links are built from ids the
// authority made, under "#/". The server has already escaped control,
// bidirectional and invisible characters between the marks ⟦ ⟧; this
// script shows each such escape highlighted.
"use strict";

(function () {
  const csrf = document.querySelector('meta[name="airlock-csrf"]').content;
  const main = document.getElementById("main");
  const errorBox = document.getElementById("error");
  const OPEN = "\u27e6", CLOSE = "\u27e7";
  const VIRTUAL_FROM = 300; // a text of more lines renders only its visible rows

  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    }
    return e;
  }

  function showError(msg) {
    errorBox.textContent = msg;
    errorBox.hidden = false;
  }
  function clearError() {
    errorBox.textContent = "";
    errorBox.hidden = true;
  }

  async function api(path, opts) {
    const r = await fetch(path, Object.assign({ credentials: "same-origin", cache: "no-store" }, opts || {}));
    let body = null;
    try { body = await r.json(); } catch (e) { body = null; }
    if (!r.ok) {
      const msg = body && body.error ? body.error : "HTTP " + r.status;
      throw new Error(msg);
    }
    return body;
  }

  // escaped appends text to parent, each ⟦escape⟧ as a highlighted span.
  function escaped(parent, s) {
    let i = 0;
    while (i < s.length) {
      const o = s.indexOf(OPEN, i);
      if (o < 0) { parent.appendChild(document.createTextNode(s.slice(i))); break; }
      const c = s.indexOf(CLOSE, o + 1);
      if (c < 0) { parent.appendChild(document.createTextNode(s.slice(i))); break; }
      if (o > i) parent.appendChild(document.createTextNode(s.slice(i, o)));
      const span = el("span", { class: "esc", title: "shown escaped" });
      span.textContent = s.slice(o + 1, c);
      parent.appendChild(span);
      i = c + 1;
    }
    return parent;
  }
  function textCell(tag, s, cls) { return escaped(el(tag, cls ? { class: cls } : {}), s || ""); }

  function row(line) {
    let cls = "row";
    if (line.startsWith("| +") && !line.startsWith("| +++")) cls += " add";
    else if (line.startsWith("| -") && !line.startsWith("| ---")) cls += " del";
    else if (line.startsWith("| @@")) cls += " hunk";
    else if (line.startsWith("---") || line.startsWith("  ---")) cls += " ours";
    return escaped(el("div", { class: cls }), line);
  }

  // textBlock shows a text line by line; a long one is virtualized: only
  // the rows in view exist in the document.
  function textBlock(text) {
    const lines = text.replace(/\n$/, "").split("\n");
    if (lines.length < VIRTUAL_FROM) {
      const box = el("div", { class: "text small" });
      for (const l of lines) box.appendChild(row(l));
      return box;
    }
    const box = el("div", { class: "text virtual", "data-lines": String(lines.length) });
    const spacer = el("div", { class: "spacer" });
    box.appendChild(spacer);
    let lineHeight = 18;
    let first = -1, last = -1;
    function paint() {
      const top = box.scrollTop, h = box.clientHeight || 600;
      const from = Math.max(0, Math.floor(top / lineHeight) - 20);
      const to = Math.min(lines.length, Math.ceil((top + h) / lineHeight) + 20);
      if (from === first && to === last) return;
      first = from; last = to;
      spacer.replaceChildren();
      for (let i = from; i < to; i++) {
        const r = row(lines[i]);
        r.style.top = (i * lineHeight) + "px";
        spacer.appendChild(r);
      }
    }
    box.addEventListener("scroll", paint, { passive: true });
    requestAnimationFrame(function () {
      const probe = row("x");
      spacer.appendChild(probe);
      lineHeight = probe.getBoundingClientRect().height || 18;
      spacer.removeChild(probe);
      spacer.style.height = (lines.length * lineHeight) + "px";
      paint();
    });
    spacer.style.height = (lines.length * lineHeight) + "px";
    paint();
    return box;
  }

  function section(s) {
    const frag = el("section", { class: "section" });
    frag.appendChild(el("h2", { text: s.title }));
    if (s.verdict) frag.appendChild(textCell("p", s.verdict, s.failed ? "verdict-bad" : "verdict-good"));
    frag.appendChild(textBlock(s.text || ""));
    return frag;
  }

  async function listPage() {
    document.title = "Pending approvals · Airlock console";
    const data = await api("/api/approvals");
    const page = el("div", {}, el("h1", { text: "Pending approvals" }));
    if (data.approvals.length === 0) {
      page.appendChild(el("p", { class: "note", text: "Nothing is waiting for an approval." }));
    } else {
      const t = el("table", { id: "approvals" }, el("tr", {},
        el("th", { text: "Approval" }), el("th", { text: "What" }), el("th", { text: "Requester" }),
        el("th", { text: "Job" }), el("th", { text: "Votes" }), el("th", { text: "State" }), el("th", { text: "Expires" })));
      for (const a of data.approvals) {
        const link = el("a", { href: "#/approval/" + encodeURIComponent(a.id), class: "approval-link mono" });
        link.textContent = a.id;
        const job = el("a", { href: "#/audit/" + encodeURIComponent(a.job_id), class: "mono" });
        job.textContent = a.job_id;
        t.appendChild(el("tr", { "data-approval": a.id }, el("td", {}, link), textCell("td", a.what),
          textCell("td", a.requester, "mono"), el("td", {}, job), el("td", { text: a.votes }),
          el("td", { class: "state", text: a.state }), el("td", { text: a.expires })));
      }
      page.appendChild(t);
    }
    main.replaceChildren(page);
  }

  async function reviewPage(id) {
    document.title = "Review " + id + " · Airlock console";
    const rv = await api("/api/approvals/" + encodeURIComponent(id));
    const a = rv.approval;
    const page = el("div", {});
    page.appendChild(el("h1", {}, "Approval ", el("span", { class: "mono", text: a.id })));
    const audit = el("a", { href: "#/audit/" + encodeURIComponent(a.job_id), id: "audit-link" });
    audit.textContent = "audit trail of job " + a.job_id;
    page.appendChild(el("p", {}, el("span", { class: "state", id: "state", text: a.state }), " · ",
      textCell("span", a.what), " · ", audit));
    const result = el("div", { id: "result" });
    page.appendChild(result);
    if (a.pending) page.appendChild(decideForm(a, result));
    for (const s of rv.sections) page.appendChild(section(s));
    if (rv.has_bundle) {
      const holder = el("div", { id: "full" });
      const b = el("button", { id: "full-review", type: "button", text: "Stream the full review from the bundle and verify it" });
      b.addEventListener("click", async function () {
        b.disabled = true;
        clearError();
        try {
          const s = await api("/api/approvals/" + encodeURIComponent(a.id) + "/full");
          holder.replaceChildren(section(s));
        } catch (e) {
          showError(e.message);
          b.disabled = false;
        }
      });
      holder.appendChild(b);
      page.append(el("h2", { text: "Full review and provenance" }), holder);
    }
    main.replaceChildren(page);
  }

  function decideForm(a, result) {
    const comment = el("textarea", { id: "comment", placeholder: "Comment (required to deny)", maxlength: "4000" });
    const approve = el("button", { id: "approve", class: "approve", type: "button", text: "Approve" });
    const deny = el("button", { id: "deny", class: "deny", type: "button", text: "Deny" });
    const form = el("form", { class: "decide", id: "decide" },
      el("label", { for: "comment", text: "Decide this request for bundle " }), el("span", { class: "mono", text: a.digest }),
      comment, approve, deny);
    async function decide(decision) {
      clearError();
      result.replaceChildren();
      approve.disabled = deny.disabled = true;
      try {
        const out = await api("/api/approvals/" + encodeURIComponent(a.id) + "/decide", {
          method: "POST",
          headers: { "Content-Type": "application/json", "X-Airlock-CSRF": csrf },
          body: JSON.stringify({ decision: decision, comment: comment.value, digest: a.digest }),
        });
        // The page anew, so everything on it is after the decision.
        await reviewPage(a.id);
        document.getElementById("result").appendChild(el("div", { class: "ok", id: "decided", text: decision + "d: the request is now " + out.state + " (" + out.votes + " approvals)" }));
      } catch (e) {
        showError(e.message);
      } finally {
        approve.disabled = deny.disabled = false;
      }
    }
    approve.addEventListener("click", function () { decide("approve"); });
    deny.addEventListener("click", function () { decide("deny"); });
    form.addEventListener("submit", function (e) { e.preventDefault(); });
    return form;
  }

  async function auditPage(job) {
    document.title = "Audit of " + job + " · Airlock console";
    const data = await api("/api/audit?job=" + encodeURIComponent(job));
    const page = el("div", {}, el("h1", {}, "Audit trail of job ", el("span", { class: "mono", text: job })));
    const t = el("table", { id: "audit" }, el("tr", {},
      el("th", { text: "Seq" }), el("th", { text: "Time" }), el("th", { text: "Kind" }), el("th", { text: "Outcome" }),
      el("th", { text: "Caller" }), el("th", { text: "Subject" }), el("th", { text: "Reason" })));
    for (const e of data.events) {
      t.appendChild(el("tr", {}, el("td", { text: String(e.seq) }), el("td", { class: "nowrap", text: e.time }), textCell("td", e.kind),
        el("td", { text: e.outcome }), textCell("td", e.caller, "mono"), textCell("td", e.subject, "mono"), textCell("td", e.reason, "wrap")));
    }
    page.appendChild(t);
    page.appendChild(el("p", { class: "note", text: data.events.length + " events, oldest first." }));
    main.replaceChildren(page);
  }

  async function route() {
    clearError();
    const h = location.hash.replace(/^#/, "") || "/";
    const parts = h.split("/");
    document.body.removeAttribute("data-page");
    try {
      if (parts[1] === "approval" && parts[2]) await reviewPage(decodeURIComponent(parts[2]));
      else if (parts[1] === "audit" && parts[2]) await auditPage(decodeURIComponent(parts[2]));
      else await listPage();
      document.body.setAttribute("data-page", parts[1] || "list");
    } catch (e) {
      main.replaceChildren();
      showError(e.message);
      document.body.setAttribute("data-page", "error");
    }
  }
  window.addEventListener("hashchange", route);
  route();
})();
