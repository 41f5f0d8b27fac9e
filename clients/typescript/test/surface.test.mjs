// Every operation of the gateway's OpenAPI document is a method of TreemailClient, under its operationId.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import path from "node:path";

import { TreemailClient } from "../dist/src/index.js";
import { REPOSITORY } from "./stack.mjs";

test("the client has a method for every documented operation", () => {
  const document = JSON.parse(readFileSync(path.join(REPOSITORY, "schemas", "host-gateway.openapi.json"), "utf8"));
  const operations = Object.values(document.paths).flatMap((item) => Object.values(item).map((op) => op.operationId));
  assert.ok(operations.length >= 30);
  const missing = operations.filter((id) => typeof TreemailClient.prototype[id] !== "function");
  assert.deepEqual(missing, []);
});
