// Installable from the repository: npm pack builds it (tsc), and an engine installs the tarball with npm,
// offline (it has no runtime dependencies), and imports it by name.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { fileURLToPath } from "node:url";

const run = promisify(execFile);
const PACKAGE = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const NPM = process.platform === "win32" ? "npm.cmd" : "npm";

test("an engine installs the packed client with npm and imports it by name", async () => {
  const where = await mkdtemp(path.join(tmpdir(), "treemail-host-"));
  try {
    await run(NPM, ["pack", "--silent", "--pack-destination", where], { cwd: PACKAGE });
    const [tarball] = (await readdir(where)).filter((name) => name.endsWith(".tgz"));
    const engine = path.join(where, "engine");
    await mkdir(engine);
    await writeFile(path.join(engine, "package.json"), JSON.stringify({ name: "engine", version: "1.0.0", type: "module" }));
    await run(NPM, ["install", "--offline", "--no-audit", "--no-fund", "--silent", path.join(where, tarball)],
      { cwd: engine });
    const { stdout } = await run(process.execPath, ["--input-type=module", "-e",
      "import { TreemailClient, TreemailError } from 'treemail-host';" +
      "console.log(typeof TreemailClient, new TreemailError(409, { code: 'lifecycle:run_active', message: 'm' }).code);"],
    { cwd: engine });
    assert.equal(stdout.trim(), "function lifecycle:run_active");
  } finally {
    await rm(where, { recursive: true, force: true });
  }
});
