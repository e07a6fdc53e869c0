#!/usr/bin/env bash
# Packs the MCP Bundle that Claude Desktop installs with a double click, and writes the registry
# entry for it: target/mcpb/sessions-mcp-<version>-<os>-<arch>.mcpb and target/mcpb/server.json
# (the repository's server.json naming that file, with its fileSha256).
#   packaging/mcpb/build.sh [path/to/sessions-mcp]     default: target/release/sessions-mcp
# A bundle holds the binaries of one platform (sessions-mcp and the run supervisor beside it,
# sessions-mcp-supervise): build it on the platform it is for. Needs node and the mcpb CLI
# (`npm install -g @anthropic-ai/mcpb`, or MCPB naming it); MCPB_OUT moves the output.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${1:-$root/target/release/sessions-mcp}"
out="${MCPB_OUT:-$root/target/mcpb}"
mcpb="${MCPB:-mcpb}"

case "$(uname -s)" in
  Darwin) os=darwin ;;
  Linux) os=linux ;;
  *) echo "build.sh: bundles are built for darwin and linux, not $(uname -s)" >&2; exit 2 ;;
esac
arch="$(uname -m)"
[ -x "$bin" ] || { echo "build.sh: no executable at $bin (cargo build --release first)" >&2; exit 2; }
# Every run starts through the supervisor, which the server finds beside its own binary.
supervisor="$(dirname "$bin")/sessions-mcp-supervise"
[ -x "$supervisor" ] || { echo "build.sh: no executable at $supervisor (cargo build --release builds both)" >&2; exit 2; }
version="$(node -p 'require(process.argv[1]).version' "$here/manifest.json")"
# A stale binary would ship under the manifest's version: refuse it.
[ "$("$bin" --version)" = "sessions-mcp $version" ] ||
  { echo "build.sh: $bin is '$("$bin" --version)', the manifest says $version" >&2; exit 2; }
[ "$("$supervisor" --version)" = "sessions-mcp-supervise $version" ] ||
  { echo "build.sh: $supervisor is '$("$supervisor" --version)', the manifest says $version" >&2; exit 2; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/server" "$out"
cp "$bin" "$stage/server/sessions-mcp"
cp "$supervisor" "$stage/server/sessions-mcp-supervise"
chmod 755 "$stage/server/sessions-mcp" "$stage/server/sessions-mcp-supervise"
# The bundle runs only where its binary does: its manifest names that one platform.
node -e '
  const [manifest, os] = process.argv.slice(1);
  const m = require(manifest);
  m.compatibility.platforms = [os];
  console.log(JSON.stringify(m, null, 2));
' "$here/manifest.json" "$os" >"$stage/manifest.json"

bundle="$out/sessions-mcp-$version-$os-$arch.mcpb"
"$mcpb" pack "$stage" "$bundle"

# The registry entry names the bundle just packed (beside the release URL the repository's
# server.json gives) and its SHA-256, which clients check before they install it.
node -e '
  const [serverJson, bundle] = process.argv.slice(1);
  const { createHash } = require("node:crypto");
  const { readFileSync } = require("node:fs");
  const { basename } = require("node:path");
  const entry = require(serverJson);
  const pkg = entry.packages.find((p) => p.registryType === "mcpb");
  pkg.identifier = pkg.identifier.replace(/[^/]*$/, basename(bundle));
  pkg.fileSha256 = createHash("sha256").update(readFileSync(bundle)).digest("hex");
  console.log(JSON.stringify(entry, null, 2));
' "$root/server.json" "$bundle" >"$out/server.json"
echo "build.sh: $bundle and $out/server.json"
