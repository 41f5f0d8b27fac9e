// The host contract (tests/contract/host_contract.json), every case, on the TypeScript client over the
// gateway: the same file and the same rules as the Python suite (tests/contract/interpreter.py).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";

import { TreemailClient, TreemailError } from "../dist/src/index.js";
import { REPOSITORY, startStack } from "./stack.mjs";

const CONTRACT = JSON.parse(readFileSync(path.join(REPOSITORY, "tests", "contract", "host_contract.json"), "utf8"));
// A wake or an interrupt of the case's session may follow those of earlier cases: read until it comes.
const FOLLOW_READS = 50;
const FOLLOW_BLOCK_MS = 200;

function at(value, dotted) {
  for (const part of dotted.split(".").filter(Boolean)) value = Array.isArray(value) ? value[Number(part)] : value[part];
  return value;
}

function resolve(value, bound) {
  if (typeof value === "string" && value.startsWith("$")) {
    const [name, ...rest] = value.slice(1).split(".");
    return at(bound[name], rest.join("."));
  }
  if (Array.isArray(value)) return value.map((v) => resolve(v, bound));
  if (value && typeof value === "object") {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, resolve(v, bound)]));
  }
  return value;
}

function includes(container, part) {
  return typeof container === "string" ? container.includes(part) : container.some((v) => v === part);
}

function check(step, outcome, bound) {
  const expect = resolve(step.expect ?? {}, bound);
  const where = `${step.op} ${JSON.stringify(step.args)}: ${JSON.stringify(outcome)?.slice(0, 600)}`;
  const failed = outcome !== null && typeof outcome === "object" && "error" in outcome;
  if ("error" in expect) {
    assert.ok(failed && outcome.error.code === expect.error, `expected ${expect.error}; ${where}`);
    return;
  }
  assert.ok(!failed, `refused; ${where}`);
  for (const [p, wanted] of Object.entries(expect.match ?? {})) assert.deepEqual(at(outcome, p), wanted, `${p}; ${where}`);
  for (const [p, prefix] of Object.entries(expect.prefix ?? {})) {
    assert.ok(String(at(outcome, p)).startsWith(prefix), `${p} should start with ${prefix}; ${where}`);
  }
  for (const [p, part] of Object.entries(expect.includes ?? {})) assert.ok(includes(at(outcome, p), part), `${p}; ${where}`);
  if ("length" in expect) {
    const size = Array.isArray(outcome) ? outcome.length : Object.keys(outcome).length;
    assert.equal(size, expect.length, `length; ${where}`);
  }
  if ("same_as" in expect) assert.deepEqual(outcome, expect.same_as, where);
}

// The contract's operations on the TypeScript client; a refusal, thrown or answered, is {error}.
function operations(tm) {
  const ctx = (a) => ({ session_id: a.session, run_id: a.run, tool_call_id: a.call });
  const done = async (promise) => (await promise, {});
  const without = (a, ...keys) => Object.fromEntries(Object.entries(a).filter(([k]) => !keys.includes(k)));
  return {
    register_root: (a) => tm.registerRoot(a),
    register_child: (a) => tm.registerChild(a.parent, without(a, "parent")),
    set_status: (a) => done(tm.setStatus(a.session, a.status)),
    tool_names: async (a) => (await tm.tools(a.session)).map((d) => d.name),
    install_tools: (a) => tm.installTools(a.session, a.names),
    start_run: (a) => done(tm.startRun(a.session, a.run)),
    finish_run: async (a) => ({ gate: await tm.finishRun(a.session, a.run, without(a, "session", "run")) }),
    send_message: async (a) => (await tm.sendMessage(ctx(a), a.arguments)).result,
    call_tool: async (a) => (await tm.callTool(ctx(a), a.name, a.arguments)).result,
    host_send: (a) => tm.send(a.session, without(a, "session")),
    claim: (a) => tm.claim(a.session, a.run, a.step),
    consume: (a) => done(tm.consume(a.session, a.message, a.step === undefined ? {} : { step: a.step })),
    release: (a) => done(tm.release(a.session, a.message, a.reason)),
    discard: (a) => done(tm.discard(a.session, a.message, a.reason)),
    inject: async (a) => ({ message_id: await tm.inject(a.session, without(a, "session")) }),
    inspect: (a) => tm.inspect(a.message, a.caller),
    retry: (a) => tm.retry(a.message, a.caller),
    cancel: (a) => tm.cancel(a.message, a.caller),
    wake_for: async (a) => {
      for (let i = 0; i < FOLLOW_READS; i++) {
        for (const wake of await tm.pollWakes(a.consumer, { block_ms: FOLLOW_BLOCK_MS })) {
          if (wake.session_id === a.session) return { started: await tm.wakeRun(wake, a.run) };
        }
      }
      throw new Error(`no wake for ${a.session}`);
    },
    interrupt_for: async (a) => {
      for (let i = 0; i < FOLLOW_READS; i++) {
        for (const it of await tm.pollInterrupts(a.consumer, { block_ms: FOLLOW_BLOCK_MS })) {
          if (it.session_id === a.session) return { aborted: await tm.abortRun(it) };
        }
      }
      throw new Error(`no interrupt for ${a.session}`);
    },
    register_route: (a) => done(tm.registerRoute(a)),
    revoke_route: async (a) => ({ revoked: await tm.revokeRoute(a) }),
    set_grant: async (a) => ({ principal: await tm.setGrant(a) }),
    routes: (a) => tm.routes(a.session),
    dispose: (a) => tm.dispose(a.session, without(a, "session")),
  };
}

describe("the host contract over the gateway", () => {
  let stack;
  let ops;
  before(async () => {
    stack = await startStack();
    ops = operations(new TreemailClient({ baseUrl: stack.url }));
  });
  after(() => stack?.stop());

  for (const kase of CONTRACT.cases) {
    test(kase.name, async () => {
      const bound = {};
      for (const stage of ["given", "when", "then"]) {
        for (const step of kase[stage]) {
          const args = resolve(step.args ?? {}, bound);
          let outcome;
          if (step.op === "echo") {
            outcome = args.value;
          } else {
            assert.ok(step.op in ops, `the TypeScript suite has no operation ${step.op}`);
            try {
              outcome = await ops[step.op](args);
            } catch (error) {
              if (!(error instanceof TreemailError)) throw error;
              outcome = { error: error.detail };
            }
          }
          check(step, outcome, bound);
          if (step.as) bound[step.as] = outcome;
        }
      }
    });
  }
});
