// Wakes as a stream through the client, on a real stack: a lost connection is opened again after the last
// wake received (Last-Event-ID), so the runner gets every wake read for it, none twice.
import { test } from "node:test";
import assert from "node:assert/strict";

import { TreemailClient } from "../dist/src/index.js";
import { stackWithClient } from "./stack.mjs";

const stack = stackWithClient();

/** `count` idle children, each sent one message: one wake each. */
async function idleChildrenWithMail(count, tag) {
  const root = await stack.tm.registerRoot({ agent_type: "planner", rules: { child: "allow" } });
  await stack.tm.startRun(root.session_id, "run-1");
  const children = [];
  for (let i = 0; i < count; i++) {
    const child = await stack.tm.registerChild(root.session_id, { agent_type: "explore", rules: { parent: "allow" },
      status: "idle" });
    const sent = await stack.tm.sendMessage({ session_id: root.session_id, run_id: "run-1", tool_call_id: `${tag}-${i}` },
      { to: child.handle, body: "wake up" });
    assert.equal(sent.result.recipient_state, "queued");
    children.push(child.session_id);
  }
  return children;
}

/** A fetch whose first event stream is cut just after its first wake, as a dropped connection is. */
function cuttingFirstStream(opened) {
  return async (url, init) => {
    if (init.headers.Accept !== "text/event-stream") return fetch(url, init); // wakeRun
    opened.push(init.headers["Last-Event-ID"]);
    const response = await fetch(url, init);
    if (opened.length > 1) return response;
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let text = "";
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        text += decoder.decode(value, { stream: true });
        const wake = text.indexOf("event: wake");
        const end = wake < 0 ? -1 : text.indexOf("\n\n", wake);
        if (end < 0) return;
        controller.enqueue(new TextEncoder().encode(text.slice(0, end + 2)));
        await reader.cancel();
        controller.error(new TypeError("terminated: the connection was lost"));
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
}

test("a stream cut after a wake is opened again after it: every wake once, in the order received", async () => {
  const woken = await idleChildrenWithMail(3, "cut");
  const opened = [];
  const client = new TreemailClient({ baseUrl: stack.url, fetch: cuttingFirstStream(opened) });
  const stop = new AbortController();
  const seen = [];
  for await (const wake of client.wakes("node-follower", { signal: stop.signal, heartbeat_ms: 500 })) {
    seen.push(wake);
    assert.equal(await client.wakeRun(wake, `run-${seen.length}`), true);
    if (seen.length === 3) stop.abort();
  }
  assert.deepEqual(seen.map((w) => w.session_id).sort(), [...woken].sort());
  assert.equal(opened.length, 2, "one reconnect");
  assert.equal(opened[0], undefined);
  assert.match(opened[1], /^\d+:\d+-\d+/, "the reconnect named the last wake received");
  assert.ok(opened[1].includes(seen[0].entry_id));
});

test("a wake sent while the runner follows arrives as it comes", async () => {
  const stop = new AbortController();
  const following = (async () => {
    for await (const wake of stack.tm.wakes("node-live", { signal: stop.signal, heartbeat_ms: 500 })) {
      stop.abort();
      return wake;
    }
  })();
  const [child] = await idleChildrenWithMail(1, "live");
  const wake = await following;
  assert.equal(wake.session_id, child);
  assert.equal(await stack.tm.wakeRun(wake, "run-live"), true);
});
