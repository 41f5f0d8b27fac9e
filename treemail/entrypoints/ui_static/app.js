// treemail ui: the delegation trees, a session's mailbox at any position, a message's lifecycle and causal
// chain, open obligations; live over server-sent events. Plain script, no build step, reads JSON only.
"use strict";

const STATES = ["pending", "claimed", "consumed", "returned", "parked"];
const view = { session: null, at: null, follow: true, timeline: null, message: null, writable: false,
               opened: new Set() };
const $ = (id) => document.getElementById(id);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "onclick") node.addEventListener("click", value);
    else if (value !== null && value !== undefined) node.setAttribute(key, value);
  }
  for (const child of children.flat(Infinity)) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

async function getJSON(url, options) {
  const response = await fetch(url, options);
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? `${data.error.code}: ${data.error.message}` : response.statusText);
  return data;
}

const short = (id) => (id || "").slice(-8);
// A body in a list: its first `length` characters, and the whole of a longer one a click away (an operator
// approves only what it has read whole). One opened stays open when the list is drawn again (`key`).
function clipped(body, length, key) {
  if (body.length <= length) return el("span", { class: "dim" }, body);
  const details = el("details", { class: "clipped", open: view.opened.has(key) ? "" : null },
    el("summary", { class: "dim" }, body.slice(0, length) + "…"), el("span", { class: "body" }, body));
  details.addEventListener("toggle", () => (details.open ? view.opened.add(key) : view.opened.delete(key)));
  return details;
}
const when = (at) => (at ? new Date(at * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "");

// ---- trees, obligations, approvals ---------------------------------------------------------------------

async function loadTrees() {
  const data = await getJSON("/api/trees");
  view.writable = data.writable;
  $("access").textContent = data.writable ? "write actions need the operator's token" : "read-only";
  $("token").hidden = !data.writable;
  const node = (s) => el("li", {},
    el("span", { class: "session" + (s.session_id === view.session ? " selected" : ""), "data-session-id": s.session_id,
                 title: s.session_id, onclick: () => { view.linkMessage = false; select(s.session_id); } },
       s.handle || s.session_id, " ", el("span", { class: "status" }, `${s.disposal || s.status}${s.pending ? ", " + s.pending + " pending" : ""}`)),
    s.children.length ? el("ul", {}, s.children.map(node)) : "");
  $("trees").replaceChildren(data.trees.length ? el("ul", {}, data.trees.map(node)) : el("p", { class: "dim" }, "no sessions yet"));
  // The page lists the newest sessions only: it says how many older ones (and their open mail) it leaves out.
  if (data.not_listed) {
    $("trees").append(el("p", { class: "dim", id: "not-listed", "data-count": data.not_listed },
      `${data.not_listed} older session${data.not_listed === 1 ? "" : "s"} not listed: the page lists the newest ` +
      `${data.max_sessions} (treemail ui --sessions lists more)`));
  }
  const open = data.obligations.filter((o) => o.state !== "consumed");
  $("obligations").replaceChildren(open.length ? el("ul", { "data-count": open.length }, open.map((o) =>
    el("li", { "data-message-id": o.message_id, "data-state": o.state },
       el("a", { href: "#", onclick: (e) => { e.preventDefault(); select(o.session_id).then(() => showMessage(o.message_id)); } },
          `${o.handle || short(o.session_id)} ${short(o.message_id)}`),
       ` ${o.state}${o.attempts ? `, ${o.attempts} attempts` : ""}${o.reason ? ` (${o.reason})` : ""}`,
       o.state === "parked" && view.writable ? el("button", { onclick: () => write(`/api/messages/${o.message_id}/retry`) }, "retry") : "")))
    : el("p", { class: "dim" }, "none pending or parked"));
  $("approvals").replaceChildren(data.approvals.length ? el("ul", {}, data.approvals.map((a) =>
    el("li", { "data-request-id": a.request_id }, `${a.sender_handle} → ${a.recipient_handle} (${a.label}): `,
       clipped(a.body, 60, a.request_id),
       view.writable ? [" ", el("button", { onclick: () => write(`/api/approvals/${a.request_id}/approve`) }, "approve"),
                        el("button", { onclick: () => write(`/api/approvals/${a.request_id}/deny`) }, "deny")] : "")))
    : el("p", { class: "dim" }, "none"));
}

async function write(url) {
  try {
    await getJSON(url, { method: "POST", headers: { Authorization: "Bearer " + $("token").value } });
  } catch (error) {
    alert(error.message);
  }
  await refresh();
}

// ---- a session's mailbox through time ------------------------------------------------------------------

async function select(sessionId, at = null, how = "push") {
  if (view.session !== sessionId) Object.assign(view, { session: sessionId, follow: true, at: null, message: null });
  if (at !== null) Object.assign(view, { follow: false, at });
  await loadTimeline();
  setAddress(how);
  await loadTrees();
}

// ---- deep links: /s/<session>?at=<position> and /m/<message> ------------------------------------------

// The address always says what the page shows, so it can be copied and opened directly: the session and the
// position scrubbed to (none while following live), or the message last opened.
function setAddress(how = "replace") {
  let url = "/";
  if (view.message && view.linkMessage) url = `/m/${encodeURIComponent(view.message)}`;
  else if (view.session) url = `/s/${encodeURIComponent(view.session)}` + (view.follow ? "" : `?at=${view.at}`);
  if (url === location.pathname + location.search) return;
  if (how === "push") history.pushState(null, "", url);
  else history.replaceState(null, "", url);
}

// Open what the address names; false when it names nothing (the root: the first session is opened).
async function openLink() {
  const [, kind, id] = location.pathname.split("/");
  if (kind === "s" && id) {
    const at = new URLSearchParams(location.search).get("at");
    view.linkMessage = false;
    await select(decodeURIComponent(id), at === null ? null : Number(at), "replace");
    return true;
  }
  if (kind === "m" && id) {
    const messageId = decodeURIComponent(id);
    try {
      const found = await getJSON(`/api/messages/${encodeURIComponent(messageId)}`);
      await select(found.session_id, null, "replace");
      await showMessage(messageId, true, "replace");
    } catch (error) {
      $("message").replaceChildren(el("p", { class: "error" }, error.message));
    }
    return true;
  }
  return false;
}
window.addEventListener("popstate", () => { openLink(); });

// Each load is numbered: an answer to an older one (a live refresh sent before a scrub or a session switch and
// answered after it) is dropped, so it cannot put back a position or a mailbox the reader has left. A scrub
// supersedes the loads in flight at once, not when its own load starts after the pause: an answer arriving within
// that pause would otherwise set the position the scrub's load then asks for.
let timelineLoads = 0;

async function loadTimeline() {
  if (!view.session) return;
  const load = ++timelineLoads;
  const query = view.follow ? "" : `?at=${view.at}`;
  const t = await getJSON(`/api/sessions/${view.session}/timeline${query}`);
  if (load !== timelineLoads) return;
  view.timeline = t;
  view.at = t.at;
  renderTimeline(t);
}

function renderTimeline(t) {
  $("session-title").textContent = `${t.handle || t.session_id}`;
  $("session-title").title = t.session_id;
  $("scrub").hidden = false;
  const scrubber = $("scrubber");
  scrubber.max = t.last;
  scrubber.value = t.at;
  const here = t.positions.filter((p) => p[0] <= t.at).pop();
  $("position").textContent = `position ${t.at} of ${t.last}` + (here ? ` · ${here[1]} · ${when(here[2])}` : "");
  $("position").dataset.at = t.at;
  $("follow").disabled = view.follow;
  $("follow").textContent = view.follow ? "following live" : "follow live";
  const notes = [];
  if (t.fork) notes.push(`forked from ${short(t.fork.source_session_id)} at its position ${t.fork.at_position}`);
  for (const r of t.reverts) notes.push(`reverted at ${r.position}: ${r.to_position + 1}..${r.from_position} abandoned`);
  $("notes").textContent = notes.join(" · ");
  const byId = Object.fromEntries(t.messages.map((m) => [m.message_id, m]));
  $("mailbox").replaceChildren(...STATES.map((state) => {
    const ids = t.mailbox[state].concat(state === "returned" ? t.mailbox.discarded : []);
    return el("div", { class: "column", "data-state": state }, el("h3", {}, `${state} (${ids.length})`),
      ids.map((id) => {
        const m = byId[id];
        return el("div", { class: "msg", "data-message-id": id, title: id, onclick: () => showMessage(id) },
          el("div", { class: "head" }, el("span", { class: "from", title: m.sender_handle || m.owner }, m.sender_handle || m.owner),
             ` · ${m.mode}`, m.step !== null ? ` · step ${m.step}` : ""),
          el("div", { class: "body" }, m.body.length > 120 ? m.body.slice(0, 119) + "…" : m.body));
      }));
  }));
  const rows = [];
  for (const run of t.runs) {
    for (const s of run.steps) {
      const kind = s.inherited_from ? "inherited" : s.reverted_by ? "reverted" : "";
      rows.push(el("tr", { class: kind, "data-run": s.run_id, "data-step": s.step },
        el("td", {}, s.run_id), el("td", {}, s.step + (s.reported ? "" : "*")), el("td", {}, `${s.first}..${s.last}`),
        el("td", {}, ids(s.claimed)), el("td", {}, ids(s.consumed)), el("td", {}, ids(s.sent)), el("td", {}, s.tokens || ""),
        el("td", {}, s.inherited_from ? `inherited from ${short(s.inherited_from)}` : s.reverted_by ? `reverted at ${s.reverted_by}` : "")));
    }
  }
  $("steps").tBodies[0].replaceChildren(...rows);
  $("steps-legend").hidden = !t.runs.some((run) => run.steps.some((s) => !s.reported));
  $("threads").replaceChildren(...(t.threads.length ? t.threads.map(renderThread)
    : [el("p", { class: "dim" }, "No conversation yet (a message alone is not one).")]));
  if (view.message) showMessage(view.message, false);
}

// A thread: its messages oldest first, each reply indented under the message it answers.
function renderThread(thread) {
  return el("div", { class: "thread", "data-thread-id": thread.thread_id },
    el("h4", {}, `thread ${short(thread.thread_id)} (${thread.posts.length} messages)`),
    thread.posts.map((p) => el("div", { class: "post", "data-message-id": p.message_id, "data-depth": p.depth,
      title: p.message_id, style: `margin-left: ${p.depth * 1.5}em`, onclick: () => showMessage(p.message_id) },
      el("span", { class: "from" }, `${p.depth ? "↳ " : ""}${p.sender_handle || short(p.sender_session_id) || "host"}`),
      ` → ${p.recipient_handle || short(p.recipient_session_id)}: `,
      el("span", { class: "body" }, p.body.length > 120 ? p.body.slice(0, 119) + "…" : p.body))));
}

// Message ids in the steps table: the end of each id, a link to the message (sent ones lie in other mailboxes).
const ids = (list) => list.map((id) => [el("a", { href: "#", title: id, "data-message-id": id,
  onclick: (e) => { e.preventDefault(); showMessage(id); } }, short(id)), " "]);

// ---- a message: lifecycle and causal chain -------------------------------------------------------------

async function showMessage(messageId, scroll = true, how = "push") {
  view.message = messageId;
  if (scroll) { view.linkMessage = true; setAddress(how); }
  let chain;
  try {
    chain = await getJSON(`/api/sessions/${view.session}/messages/${messageId}`);
  } catch (error) {
    if (view.message === messageId) $("message").replaceChildren(el("p", { class: "error" }, error.message));
    return;
  }
  // Another message was opened meanwhile (a click while a live redraw's load of the previous one was in flight):
  // this answer is late, and must not put the previous message back over it.
  if (view.message !== messageId) return;
  const [first, ...causes] = chain.chain;
  const m = first.message;
  const lifecycle = el("table", { id: "lifecycle" }, el("tr", {}, el("th", {}, "position"), el("th", {}, "event"), el("th", {}, "run"), el("th", {}, "step, tokens, reason")),
    m.lifecycle.map((t) => el("tr", { "data-kind": t.kind }, el("td", {}, t.position), el("td", {}, t.kind),
      el("td", {}, t.run_id || ""), el("td", {}, [t.step !== null ? `step ${t.step}` : "", t.tokens ? ` ${t.tokens} tokens` : "", t.reason ? ` ${t.reason}` : "", t.by ? ` (asked by the ${t.by})` : ""].join("")))));
  const link = (l) => el("li", {}, el("code", {}, short(l.message.message_id)), ` ${l.message.sender_handle || l.message.owner} → `,
    el("span", {}, l.message.session_id === view.session ? "this session" : l.handle || short(l.message.session_id)),
    `, ${l.message.state}: `, clipped(l.message.body, 80, l.message.message_id));
  $("message").replaceChildren(
    el("p", {}, el("code", {}, m.message_id)),
    el("p", {}, el("strong", {}, m.sender_handle || m.owner), ` (${m.mode}) is ${m.state}`,
       m.superseded_by ? [", superseded by ", ids([m.superseded_by])] : ""),
    el("p", { class: "body" }, m.body),
    el("h3", {}, "Lifecycle"), lifecycle,
    el("h3", {}, "Causal chain"),
    first.sent_by_run ? el("p", { class: "dim" }, `sent by run ${first.sent_by_run}` + (first.sent_at ? ` at its sender's position ${first.sent_at}` : "")) : "",
    causes.length ? el("ul", { class: "chain" }, causes.map(link)) : el("p", { class: "dim" }, "no earlier message caused it"),
    chain.not_followed ? el("p", { class: "dim", id: "chain-cut" }, `${chain.not_followed} earlier cause` +
      `${chain.not_followed === 1 ? "" : "s"} not followed: a chain stops at ${chain.max_chain} messages`) : "",
    el("h3", {}, "Trace " + (chain.trace_id || "(not traced)")),
    chain.trace.length ? el("ul", { class: "chain" }, chain.trace.map((t) => link({ message: t, handle: chain.handles[t.session_id] }))) : "");
  if (scroll) $("detail").scrollIntoView({ block: "nearest" });
}

// ---- live ----------------------------------------------------------------------------------------------

let pending = null;
async function refresh() {
  pending = null;
  try {
    await loadTrees();
    await loadTimeline();
  } catch (error) {
    console.error(error);
  }
}

function follow() {
  const source = new EventSource("/api/events");
  // Following starts when the stream opens: what was appended between the page's first load and then (or while
  // reconnecting) has no event of its own, so the page reads everything once more as it goes live.
  source.onopen = () => {
    $("live").textContent = "live"; $("live").classList.add("on");
    if (!pending) pending = setTimeout(refresh, 250);
  };
  source.onerror = () => { $("live").textContent = "reconnecting…"; $("live").classList.remove("on"); };
  source.onmessage = () => { if (!pending) pending = setTimeout(refresh, 250); };
}

$("scrubber").addEventListener("input", () => {
  view.follow = false;
  view.linkMessage = false;
  view.at = Number($("scrubber").value);
  setAddress();
  timelineLoads++;
  clearTimeout(view.scrubbing);
  view.scrubbing = setTimeout(loadTimeline, 80);
});
$("follow").addEventListener("click", () => { view.follow = true; view.linkMessage = false; setAddress(); loadTimeline(); });

loadTrees().then(async () => {
  if (await openLink()) return;
  const first = document.querySelector("[data-session-id]");
  if (first && !view.session) select(first.dataset.sessionId);
});
follow();
