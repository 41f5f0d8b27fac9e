// The client itself: cancellation through AbortSignal, the error class with the stable code, refusals a
// model causes answered (not thrown), no globals.
import { describe, test } from "node:test";
import assert from "node:assert/strict";

import { TreemailClient, TreemailError, isRefusal } from "../dist/src/index.js";
import { stackWithClient } from "./stack.mjs";

describe("the TypeScript client", () => {
  const stack = stackWithClient();

  test("speaks the gateway's version and names the event protocol it stands on", async () => {
    const info = await stack.tm.info();
    assert.equal(info.gateway_version, 1);
    assert.ok(info.protocol_version >= 6);
    // A base URL given with the version prefix reaches the same gateway.
    assert.deepEqual(await new TreemailClient({ baseUrl: `${stack.url}/v1/` }).info(), info);
  });

  test("an aborted long poll ends at once, and a stream of wakes ends with its signal", async () => {
    const stop = new AbortController();
    const polling = stack.tm.pollWakes("client-test", { block_ms: 30_000, signal: stop.signal });
    setTimeout(() => stop.abort(), 50);
    await assert.rejects(polling, (error) => error.name === "AbortError");

    const follow = new AbortController();
    setTimeout(() => follow.abort(), 50);
    for await (const wake of stack.tm.wakes("client-test", { signal: follow.signal })) assert.fail(`no wake: ${wake}`);
    assert.ok(follow.signal.aborted);
  });

  test("a host operation refused throws TreemailError with the stable code and the status", async () => {
    const root = await stack.tm.registerRoot({ agent_type: "planner" });
    await stack.tm.startRun(root.session_id, "run-1");
    await assert.rejects(stack.tm.startRun(root.session_id, "run-2"), (error) => {
      assert.ok(error instanceof TreemailError);
      assert.equal(error.code, "lifecycle:run_active");
      assert.equal(error.status, 409);
      return true;
    });
    await assert.rejects(stack.tm.setStatus(root.session_id, "sleeping"),
      (error) => error.code === "gateway:invalid_request" && error.status === 400);
    await assert.rejects(stack.tm.inspect("00000000-0000-7000-8000-000000000000"),
      (error) => error.code === "message:unknown" && error.status === 404);
  });

  test("a model's refused send is answered with the line the model reads, never thrown", async () => {
    const root = await stack.tm.registerRoot({ agent_type: "planner", rules: { child: "allow" } });
    await stack.tm.startRun(root.session_id, "run-1");
    const answer = await stack.tm.sendMessage({ session_id: root.session_id, run_id: "run-1", tool_call_id: "t1" },
      { to: "nobody", body: "hello" });
    assert.ok(answer.is_error && isRefusal(answer.result));
    assert.equal(answer.result.error.code, "send_message:unknown_session");
    assert.ok(answer.text.startsWith("send_message:unknown_session"));
  });

  test("a send under an ask rule waits for a person, who approves it through the client", async () => {
    const root = await stack.tm.registerRoot({ agent_type: "planner", rules: { child: "ask" } });
    const child = await stack.tm.registerChild(root.session_id, { agent_type: "explore", rules: { parent: "allow" } });
    await stack.tm.startRun(root.session_id, "run-1");
    const asking = stack.tm.sendMessage({ session_id: root.session_id, run_id: "run-1", tool_call_id: "ask-1" },
      { to: child.handle, body: "may I?" });
    let mine = [];
    while (mine.length === 0) {
      mine = (await stack.tm.pendingApprovals()).filter((a) => a.sender_session_id === root.session_id);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    assert.equal((await stack.tm.approve(mine[0].request_id, "once")).status, "approved");
    const answer = await asking;
    assert.ok(!answer.is_error && "message_id" in answer.result);
    assert.equal(await stack.tm.drain(child.session_id), 1);
    const refused = await stack.tm.sendMessage({ session_id: root.session_id, run_id: "run-1", tool_call_id: "ask-2" },
      { to: child.handle, body: "again" });
    assert.equal(refused.result.error.code, "send_message:draining");
    assert.equal(await stack.tm.undrain(child.session_id), 1);
    assert.ok((await stack.tm.reconcile()) >= 0);
  });

  test("a stream refused for now (429) is opened again as late as it says", async () => {
    const wake = { session_id: "s", message_id: null, stream: "tm:{p0}:wakes", entry_id: "1-0" };
    const answers = [
      new Response(JSON.stringify({ error: { code: "gateway:too_many_streams", message: "busy", retry_after_ms: 20 } }),
        { status: 429 }),
      new Response(`retry: 10\n\n: heartbeat\n\nid: 0:1-0\nevent: wake\ndata: ${JSON.stringify(wake)}\n\n`,
        { status: 200, headers: { "Content-Type": "text/event-stream" } }),
    ];
    const opened = [];
    const fake = async (url, init) => {
      opened.push([performance.now(), init.headers.Accept, new URL(url).pathname]);
      return answers.shift() ?? new Promise(() => {});
    };
    const stop = new AbortController();
    const client = new TreemailClient({ baseUrl: "http://gateway.invalid", fetch: fake });
    for await (const got of client.wakes("r", { signal: stop.signal })) {
      assert.deepEqual(got, wake);
      stop.abort();
    }
    assert.equal(opened.length, 2);
    assert.deepEqual(opened[1].slice(1), ["text/event-stream", "/v1/wakes/stream"]);
    assert.ok(opened[1][0] - opened[0][0] >= 15, "it waited out retry_after_ms before opening again");
  });

  test("a gateway that cannot be reached is gateway:unavailable", async () => {
    const nowhere = new TreemailClient({ baseUrl: "http://127.0.0.1:9" });
    await assert.rejects(nowhere.info(), (error) => error.code === "gateway:unavailable" && error.status === 0);
  });

  test("the client defines no globals and takes the fetch it is given", async () => {
    const before = new Set(Object.getOwnPropertyNames(globalThis));
    await import("../dist/src/index.js?again");
    assert.deepEqual(Object.getOwnPropertyNames(globalThis).filter((name) => !before.has(name)), []);
    const seen = [];
    const recording = new TreemailClient({ baseUrl: stack.url, headers: { "X-Engine": "test" },
      fetch: (url, init) => (seen.push([url, init.headers["X-Engine"]]), fetch(url, init)) });
    await recording.info();
    assert.deepEqual(seen, [[`${stack.url}/v1`, "test"]]);
  });
});
