#!/usr/bin/env node
// extract-reference-paths.mjs — list every config key path accepted by OpenClaw's
// zod config schema (`OpenClawSchema`, src/config/zod-schema.ts in the openclaw npm package).
//
// Usage (scratch dir; never run the package's install scripts):
//   npm pack openclaw@2026.3.13 && tar xzf openclaw-2026.3.13.tgz      # -> ./package
//   cd package && npm pkg delete devDependencies 'dependencies.@whiskeysockets/baileys' \
//     && npm install --ignore-scripts --no-audit --no-fund --omit=dev --omit=peer && cd ..
//     (the dist chunk needs the runtime deps to import; baileys pulls a git-hosted
//      dependency and is not needed by the config schema)
//   node /work/main/tools/extract-reference-paths.mjs ./package > /work/main/src/config/reference_paths.txt
//   (a summary and the open-ended `.*` paths are printed to stderr)
//
// The script imports the dist chunk that exports `OpenClawSchema` (found by scanning
// dist/*.js export statements for `OpenClawSchema as <alias>`) and walks the zod v4
// schema: object shape -> `.key`, record -> `.*`, array/tuple -> `[]` appended to the
// segment; optional/nullable/default/prefault/catch/readonly/lazy/pipe/union are unwrapped
// (all union members / both pipe sides are merged). Every depth is emitted.
// A trailing `.*` also marks places where arbitrary keys are accepted: objects with a
// non-`never` catchall (passthrough/loose) and records; if the value there is
// unknown/any, everything below is free-form. Such paths are also printed to stderr.
// Node 20 lacks node:module `enableCompileCache` (used by dist/entry.js); a resolve hook shims it.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { register } from "node:module";

const pkgDir = path.resolve(process.argv[2] ?? "package");
const pkgJson = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
const distDir = path.join(pkgDir, "dist");
const distUrl = pathToFileURL(distDir).href + "/";

const hooks = `
const SHIM = "oc-shim:node-module";
export async function resolve(s, c, n) {
  if ((s === "node:module" || s === "module") && c.parentURL && c.parentURL.startsWith(${JSON.stringify(distUrl)}))
    return { url: SHIM, shortCircuit: true };
  return n(s, c);
}
export async function load(u, c, n) {
  if (u === SHIM) return { format: "module", shortCircuit: true, source:
    'import m from "node:module"; export * from "node:module"; export default m;' +
    'export const enableCompileCache = m.enableCompileCache ?? (() => undefined);' };
  return n(u, c);
}`;
register("data:text/javascript," + encodeURIComponent(hooks));

// Locate the chunk that exports OpenClawSchema (top-level dist/ only, first match by name).
let chunk = null, alias = null;
for (const f of fs.readdirSync(distDir).filter((f) => f.endsWith(".js")).sort()) {
  const src = fs.readFileSync(path.join(distDir, f), "utf8");
  const mm = /(?:^|\n)export \{[^}]*\bOpenClawSchema as ([A-Za-z_$][\w$]*)/.exec(src);
  if (mm) { chunk = f; alias = mm[1]; break; }
}
if (!chunk) throw new Error("no dist/*.js chunk exports OpenClawSchema");
const mod = await import(pathToFileURL(path.join(distDir, chunk)).href);
const root = mod[alias];
if (!root?._zod?.def) throw new Error(`${chunk}:${alias} is not a zod v4 schema`);

const paths = new Set();
const openPaths = new Map(); // path (with trailing .*) -> reason
const FREE = new Set(["unknown", "any"]);
const WRAP = new Set(["optional", "nullable", "default", "prefault", "catch", "readonly", "nonoptional", "success"]);

function isFree(s, stack = new Set()) {
  if (!s?._zod || stack.has(s)) return false;
  stack.add(s);
  const d = s._zod.def;
  if (FREE.has(d.type)) return true;
  if (WRAP.has(d.type)) return isFree(d.innerType, stack);
  if (d.type === "lazy") return isFree(d.getter(), stack);
  if (d.type === "union") return d.options.some((o) => isFree(o, stack));
  if (d.type === "pipe") return isFree(d.in, stack) && (d.out._zod.def.type === "transform" || isFree(d.out, stack));
  return false;
}

// walk(schema, p): p is the dotted path of the value `schema` validates ("" = root).
function walk(s, p, stack) {
  if (!s?._zod) return;
  if (stack.includes(s)) { // recursive schema: mark as open-ended
    if (p) { paths.add(p + ".*"); openPaths.set(p + ".*", "recursive schema"); }
    return;
  }
  const st = [...stack, s];
  const d = s._zod.def;
  const add = (q) => { if (q) paths.add(q); };
  const join = (k) => (p ? `${p}.${k}` : k);
  switch (d.type) {
    case "object": {
      add(p);
      for (const [k, v] of Object.entries(d.shape)) { add(join(k)); walk(v, join(k), st); }
      if (d.catchall && d.catchall._zod.def.type !== "never") {
        const q = join("*");
        add(q);
        const free = isFree(d.catchall);
        openPaths.set(q, `object catchall (${d.catchall._zod.def.type})${free ? ": anything below" : ""}`);
        if (!free) walk(d.catchall, q, st);
      }
      break;
    }
    case "record": {
      add(p);
      const q = join("*");
      add(q);
      const kt = d.keyType?._zod?.def;
      const keyDesc = kt?.type === "enum" ? `enum key {${Object.values(kt.entries).join(",")}}` : `${kt?.type} key`;
      if (isFree(d.valueType)) openPaths.set(q, `record (${keyDesc}) of ${d.valueType._zod.def.type}: anything below`);
      walk(d.valueType, q, st);
      break;
    }
    case "array": add(p); walk(d.element, p + "[]", st); break;
    case "tuple": add(p); for (const it of d.items) walk(it, p + "[]", st); if (d.rest) walk(d.rest, p + "[]", st); break;
    case "union": for (const o of d.options) walk(o, p, st); break;
    case "intersection": walk(d.left, p, st); walk(d.right, p, st); break;
    case "pipe": walk(d.in, p, st); walk(d.out, p, st); break;
    case "lazy": walk(d.getter(), p, st); break;
    default:
      if (WRAP.has(d.type)) { walk(d.innerType, p, st); break; }
      if (FREE.has(d.type) && p && !openPaths.has(p)) {
        // a bare unknown/any field (not already reported as a record/catchall value):
        // it accepts anything, so mark it open-ended too
        paths.add(p + ".*");
        openPaths.set(p + ".*", `${d.type} field: anything below`);
      }
      add(p);
  }
}
walk(root, "", []);

// array element paths like `a.b[]` are not key paths by themselves; keep only keys.
const lines = [...paths].filter((q) => !q.endsWith("[]")).sort();
const header = [
  `# OpenClaw config key paths — generated from npm package ${pkgJson.name}@${pkgJson.version}`,
  `# source: zod schema \`OpenClawSchema\` (src/config/zod-schema.ts), imported from dist/${chunk} (export alias \`${alias}\`)`,
  `# generated by: node tools/extract-reference-paths.mjs <unpacked-package-dir>  (see header of that script)`,
  `# syntax: \`*\` = any key (record, or catchall/passthrough object), \`[]\` = array element; a \`X.*\` line with no deeper lines and a free-form value (e.g. plugins.entries.*.config.*) = anything below`,
];
process.stdout.write(header.join("\n") + "\n" + lines.join("\n") + "\n");
process.stderr.write(`chunk=dist/${chunk} alias=${alias} paths=${lines.length}\n`);
for (const [q, why] of [...openPaths].sort()) process.stderr.write(`OPEN ${q}\t${why}\n`);
process.exit(0);
