// An engine loop in TypeScript over `treemail gateway`: register a tree, give a model send_message, claim at
// each model-request boundary, consume, finish, and follow wakes. The "model" is scripted so the example
// runs as it is (the TypeScript suite runs it): replace `model` with your provider's call.
//
//   TREEMAIL_GATEWAY_URL=http://127.0.0.1:8781 node dist/examples/engine-loop.js
import { TreemailClient, isRefusal } from "../src/index.js"; // in an engine: from "treemail-host"
import type { Delivery, SendContext } from "../src/index.js";

const tm = new TreemailClient({ baseUrl: process.env.TREEMAIL_GATEWAY_URL ?? "http://127.0.0.1:8781" });

// A scripted model: given the prompt, the tool calls it makes (a real one also writes text).
type ToolCall = { id: string; name: string; input: Record<string, unknown> };
function model(agent: string, prompt: string[]): ToolCall[] {
  if (agent === "explore" && prompt.some((text) => text.includes("cache"))) {
    const from = /from="([^"]+)"/.exec(prompt.join("\n"))?.[1] ?? "";
    return [{ id: "toolu_reply", name: "send_message", input: { to: from, body: "cache.py line 42 invalidates it" } }];
  }
  return [];
}

// 1. Register the tree as the engine delegates: a planner and the explorer it launches (idle until mail).
const planner = await tm.registerRoot({ agent_type: "planner", description: "splits the task",
  rules: { child: "allow" } });
const explorer = await tm.registerChild(planner.session_id, { agent_type: "explore", description: "reads the code",
  rules: { parent: "allow" }, status: "idle" });

// 2. Give the model send_message, in the shape its API takes (anthropic, openai or mcp).
const [tool] = await tm.tools(planner.session_id, "anthropic");
console.log(`the planner's model sees the tool ${tool?.name}`);

// 3. One model step of a run: claim what is due at the boundary, put it in the prompt, call the model,
//    hand its tool calls to treemail with the host's context, and consume what the request carried.
async function step(sessionId: string, agent: string, runId: string, n: number): Promise<Delivery[]> {
  const claimed = await tm.claim(sessionId, runId, n);
  const calls = model(agent, claimed.map((mail) => mail.text));
  for (const call of calls) {
    const context: SendContext = { session_id: sessionId, run_id: runId, tool_call_id: call.id };
    const answer = await tm.sendMessage(context, call.input); // retried with the same id: sent once
    console.log(`${agent}: ${answer.text}`); // what the model reads as the tool result
    if (isRefusal(answer.result)) console.log(`(refused with ${answer.result.error.code})`);
  }
  for (const mail of claimed) await tm.consume(sessionId, mail.message_id, { step: n });
  return claimed;
}

// The planner's run: its model delegates with send_message; the explorer is idle, so the mail wakes it.
await tm.startRun(planner.session_id, "plan-1");
const delegated = await tm.sendMessage({ session_id: planner.session_id, run_id: "plan-1", tool_call_id: "toolu_01" },
  { to: explorer.handle, body: "Find where the cache is invalidated." });
console.log(`planner: ${delegated.text}`);

// 4. A runner follows wakes (one event stream, resumed after the last wake if the connection drops) and
//    starts each woken run; here it stops after the explorer's.
const stop = new AbortController();
for await (const wake of tm.wakes("runner-1", { signal: stop.signal })) {
  const runId = `wake-${wake.entry_id}`;
  await tm.wakeRun(wake, runId); // starts the run (its due mail is admitted) and acknowledges
  if (wake.session_id !== explorer.session_id) continue;
  const read = await step(explorer.session_id, "explore", runId, 1);
  console.log(`explore read ${read.length} message(s) and replied`);
  // 5. Finish with a stop reason: the parent gets a settlement notice in its open run.
  const gate = await tm.finishRun(explorer.session_id, runId, { reason: "completed", closing_text: "found it" });
  console.log(`explore finished; the planner was told: ${gate}`);
  stop.abort();
}

// Back in the planner's run: the reply and the notice arrive at its next boundary.
const arrived = await step(planner.session_id, "planner", "plan-1", 2);
console.log(`planner claimed: ${arrived.map((mail) => mail.owner).join(", ")}`);
await tm.finishRun(planner.session_id, "plan-1", { reason: "completed" });
