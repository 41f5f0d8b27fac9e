// The TypeScript host's side of bench phase 11 (bench/gateway.py): one send and one claim at a time through
// the TypeScript client and `treemail gateway`, each timed; prints {"send_ms": [...], "claim_ms": [...]}.
//   node bench/gateway_host.mjs '{"url", "root", "child", "to", "run", "child_run", "sends", "warm", "prefix"}'
import { performance } from "node:perf_hooks";

import { TreemailClient } from "../clients/typescript/dist/src/index.js";

const job = JSON.parse(process.argv[2]);
const tm = new TreemailClient({ baseUrl: job.url });
const send = [];
const claim = [];
let failed = 0;
for (let i = 0; i < job.warm + job.sends; i++) {
  const context = { session_id: job.root, run_id: job.run, tool_call_id: `${job.prefix}-${i}` };
  const started = performance.now();
  const answer = await tm.sendMessage(context, { to: job.to, body: `typescript send ${i}` });
  const sent = performance.now();
  const claimed = await tm.claim(job.child, job.child_run);
  const done = performance.now();
  failed += answer.is_error || claimed.length !== 1 ? 1 : 0;
  for (const mail of claimed) await tm.consume(job.child, mail.message_id); // untimed: keeps the inbox empty
  if (i >= job.warm) {
    send.push(sent - started);
    claim.push(done - sent);
  }
}
console.log(JSON.stringify({ send_ms: send, claim_ms: claim, failed }));
