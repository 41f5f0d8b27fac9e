// A real stack for a test file: Valkey, a worker and the gateway, started by the repository's Python
// (tests/contract/stack.py) and stopped when the file's tests end.
import { spawn } from "node:child_process";
import { after, before } from "node:test";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";
import path from "node:path";

export const REPOSITORY = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const PYTHON = process.env.TREEMAIL_PYTHON ?? path.join(REPOSITORY, ".venv", "bin", "python");

export async function startStack() {
  const child = spawn(PYTHON, ["-m", "tests.contract.stack"], {
    cwd: REPOSITORY, stdio: ["pipe", "pipe", "inherit"],
  });
  const lines = createInterface({ input: child.stdout });
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("the stack did not start within 60 s")), 60_000);
    child.once("error", (error) => reject(new Error(`the stack could not start (${PYTHON}): ${error.message}`)));
    child.once("exit", (code) => reject(new Error(`the stack exited with ${code} before it listened`)));
    lines.on("line", (line) => {
      if (line.startsWith("TREEMAIL_GATEWAY_URL=")) {
        clearTimeout(timer);
        resolve(line.slice("TREEMAIL_GATEWAY_URL=".length));
      }
    });
  });
  return {
    url,
    // End of input is the stack's signal to stop; it cleans up its Valkey and exits.
    stop: () => new Promise((resolve) => {
      child.once("exit", resolve);
      child.stdin.end();
    }),
  };
}

/** A stack for the enclosing suite (or file) and a client of it, filled in before its tests: `held.tm`,
 *  `held.url`. */
export function stackWithClient() {
  const held = {};
  before(async () => {
    const { TreemailClient } = await import("../dist/src/index.js");
    held.stack = await startStack();
    held.url = held.stack.url;
    held.tm = new TreemailClient({ baseUrl: held.url });
  });
  after(() => held.stack?.stop());
  return held;
}
