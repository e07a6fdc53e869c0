#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for the tests (tests/it/postgres.rs, store::postgres): initdb into
# a temp dir, listening on 127.0.0.1 on a free port only, password (scram-sha-256) auth over TCP.
# PostgreSQL refuses to run as root, so as root the cluster belongs to the `postgres` user (the
# Debian package creates it) and runs through runuser. fsync is off: the cluster is thrown away.
# TLS is on, as a production server's would be (store/postgres/tls.rs's tests): a throwaway CA
# signs the server's certificate, for the name localhost only (so that sslmode=verify-full to
# 127.0.0.1 must fail), and a client certificate for the role sessions_mcp_cert, which logs in by
# certificate alone.
#
#   eval "$(.ci/postgres.sh start)"   starts one; prints the exports SESSIONS_MCP_TEST_PG (a URL
#                                     with the password), SESSIONS_MCP_TEST_PG_DIR and
#                                     SESSIONS_MCP_TEST_PG_TLS (ca.crt, client.crt, client.key)
#   .ci/postgres.sh stop DIR          stops the cluster in DIR and removes DIR
set -euo pipefail

# The directory of pg_ctl and initdb: on PATH, else Debian's /usr/lib/postgresql/<ver>/bin (newest).
bindir() {
  local d
  if command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1; then
    dirname "$(command -v pg_ctl)"
    return
  fi
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  if [ -n "$d" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/initdb" ]; then
    echo "$d"
    return
  fi
  echo "postgres.sh: no pg_ctl/initdb (install Debian's postgresql package)" >&2
  return 1
}

# psql: beside pg_ctl, else on PATH (Debian's /usr/bin wrapper).
psql_bin() {
  if [ -x "$1/psql" ]; then echo "$1/psql"; else command -v psql; fi
}

# Runs a PostgreSQL program as an unprivileged user.
as_pg() {
  # From /: the programs look at their working directory, which root's may not let them.
  if [ "$(id -u)" = 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# A CA, and the certificates it signs, in DIR/tls (openssl, Debian's package).
tls_files() {
  local t="$1/tls" quiet
  command -v openssl >/dev/null 2>&1 || { echo "postgres.sh: no openssl (install Debian's openssl)" >&2; return 1; }
  mkdir -p "$t"
  quiet="$t/openssl.log"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3 \
    -subj "/CN=sessions-mcp test CA" -keyout "$t/ca.key" -out "$t/ca.crt" >>"$quiet" 2>&1
  signed "$t" server "/CN=localhost" "subjectAltName=DNS:localhost"
  signed "$t" client "/CN=sessions_mcp_cert" "extendedKeyUsage=clientAuth"
  rm -f "$t/ca.key" "$t"/*.csr "$t"/*.srl
  chmod 600 "$t"/*.key
}

# signed DIR NAME SUBJECT EXTENSION: DIR/NAME.key and DIR/NAME.crt, signed by DIR/ca.
signed() {
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "$3" \
    -keyout "$1/$2.key" -out "$1/$2.csr" >>"$1/openssl.log" 2>&1
  openssl x509 -req -in "$1/$2.csr" -CA "$1/ca.crt" -CAkey "$1/ca.key" -CAcreateserial -days 3 \
    -extfile <(printf '%s\n' "$4") -out "$1/$2.crt" >>"$1/openssl.log" 2>&1
}

start() {
  local bin dir port password
  bin="$(bindir)"
  dir="$(mktemp -d "${TMPDIR:-/tmp}/sessions-mcp-pg.XXXXXX")"
  password="$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
  printf '%s\n' "$password" >"$dir/pwfile"
  tls_files "$dir" || { cat "$dir/tls/openssl.log" >&2 2>/dev/null; return 1; }
  printf '%s\n' "local all all trust" "hostssl all sessions_mcp_cert 127.0.0.1/32 cert" \
    "host all all 127.0.0.1/32 scram-sha-256" >"$dir/pg_hba.conf"
  if [ "$(id -u)" = 0 ]; then chown -R postgres: "$dir"; fi
  as_pg "$bin/initdb" -D "$dir/data" -U postgres --pwfile="$dir/pwfile" --auth-host=scram-sha-256 \
    --auth-local=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    return 1
  }
  rm -f "$dir/pwfile"
  # Statement counts for the bench's nodes rows (src/bench/nodes.rs), where the module is there.
  local preload="" config
  config="$(dirname "$(readlink -f "$bin/pg_ctl")")/pg_config"
  if [ -x "$config" ] && [ -f "$("$config" --pkglibdir)/pg_stat_statements.so" ]; then
    preload="-c shared_preload_libraries=pg_stat_statements"
  fi
  # A port taken between the look and the start fails the start: try a few.
  for _ in 1 2 3 4 5; do
    port="$(free_port)"
    if as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o \
      "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=off \
       -c hba_file=$dir/pg_hba.conf -c ssl=on -c ssl_cert_file=$dir/tls/server.crt \
       -c ssl_key_file=$dir/tls/server.key -c ssl_ca_file=$dir/tls/ca.crt $preload" \
      start >/dev/null 2>&1; then
      as_pg "$(psql_bin "$bin")" -h "$dir" -p "$port" -U postgres -d postgres -qc "CREATE ROLE sessions_mcp_cert LOGIN" >&2
      echo "postgres.sh: PostgreSQL ($("$bin/pg_ctl" --version)) on 127.0.0.1:$port with TLS, data in $dir" >&2
      echo "export SESSIONS_MCP_TEST_PG='postgres://postgres:$password@127.0.0.1:$port/postgres'"
      echo "export SESSIONS_MCP_TEST_PG_DIR='$dir'"
      echo "export SESSIONS_MCP_TEST_PG_TLS='$dir/tls'"
      return
    fi
  done
  cat "$dir/server.log" >&2 || true
  return 1
}

stop() {
  local dir="$1"
  [ -d "$dir/data" ] || { echo "postgres.sh: no cluster in $dir" >&2; return 1; }
  as_pg "$(bindir)/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null || true
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) stop "${2:?usage: .ci/postgres.sh stop DIR}" ;;
  *) echo "usage: .ci/postgres.sh start | stop DIR" >&2; exit 2 ;;
esac
