// The examples on the docs page run, as they are, against a real stack.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";

import { startStack } from "./stack.mjs";

const run = promisify(execFile);
let stack;
before(async () => { stack = await startStack(); });
after(() => stack?.stop());

test("the engine loop registers a tree, delegates, follows the wake, and hears back", async () => {
  const example = fileURLToPath(new URL("../dist/examples/engine-loop.js", import.meta.url));
  const { stdout } = await run(process.execPath, [example], {
    env: { ...process.env, TREEMAIL_GATEWAY_URL: stack.url }, timeout: 60_000,
  });
  assert.match(stdout, /the planner's model sees the tool send_message/);
  assert.match(stdout, /planner: send_message accepted: .* recipient_state=queued/);
  assert.match(stdout, /explore read 1 message\(s\) and replied/);
  assert.match(stdout, /explore finished; the planner was told: steered/);
  assert.match(stdout, /planner claimed: agent, settlement/);
});
