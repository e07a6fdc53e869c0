#!/usr/bin/env bash
# The dashboard's first paint with 10,000 sessions (BENCHMARKS.md, Dashboard): a store of
# 8,000 root sessions and 2,000 sub-agents under the ten newest (40,000 messages), served by a
# release `serve --http`; Debian's headless Chromium (puppeteer-core) loads /ui with the
# operator token already in the tab and times navigation → the first view rendered, and curl
# times GET /ui/api/view alone.
#   benches/dashboard-first-paint.sh [BINARY] [ROUNDS]
# Needs node, $SESSIONS_MCP_PUPPETEER (default .ci/browser/node_modules) and chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/sessions-mcp}"
rounds="${2:-20}"
dir="$(mktemp -d)"
trap 'kill "${server:-0}" 2>/dev/null || true; rm -rf "$dir"' EXIT
token="bench-operator-token"
sha="$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)"
echo "{ server: { operatorTokens: [{ sha256: \"$sha\" }] } }" > "$dir/config.json5"
"$bin" dev seed --state-dir "$dir" --sessions 8000 --messages 32000 >/dev/null
for i in $(seq 7990 7999); do
  "$bin" dev seed --state-dir "$dir" --sessions 200 --messages 800 --spawned-by "agent:main:seed:$i" >/dev/null
done
"$bin" serve --state-dir "$dir" --http 127.0.0.1:0 2> "$dir/serve.log" &
server=$!
port=""
for _ in $(seq 100); do
  port="$(sed -n 's#.*http://127.0.0.1:\([0-9]*\)/mcp.*#\1#p' "$dir/serve.log" | head -1)"
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] || { cat "$dir/serve.log"; exit 1; }
echo "GET /ui/api/view (curl, $rounds rounds, ms):"
for _ in $(seq "$rounds"); do
  curl -s -o /dev/null -w '%{time_total}\n' -H "Authorization: Bearer $token" "http://127.0.0.1:$port/ui/api/view"
done | sort -n | awk '{ a[NR] = $1 * 1000 } END { printf "  p50 %.1f  p90 %.1f  max %.1f\n", a[int(NR*0.5)+1], a[int(NR*0.9)+1], a[NR] }'
bytes="$(curl -s -H "Authorization: Bearer $token" "http://127.0.0.1:$port/ui/api/view" | wc -c)"
echo "  view size: $bytes bytes"
echo "first paint in headless Chromium (navigation → first view rendered):"
SESSIONS_MCP_PUPPETEER="${SESSIONS_MCP_PUPPETEER:-$PWD/.ci/browser/node_modules}" \
  node tests/clients/dashboard.mjs bench "{\"base\": \"http://127.0.0.1:$port\", \"operator\": \"$token\", \"rounds\": $rounds}"
grep VmHWM "/proc/$server/status" || true
