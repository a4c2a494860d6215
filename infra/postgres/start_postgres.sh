#!/usr/bin/env bash
# Start a throw-away PostgreSQL server on 127.0.0.1 (Debian's postgresql; installs it with apt when missing, as root)
# and print its URL. Used by the registry tests; also handy to try `tracking.registry_url: postgresql://…`.
#   infra/postgres/start_postgres.sh DATA_DIR PORT     → prints postgresql://forgeflow@127.0.0.1:PORT/forgeflow
#   infra/postgres/start_postgres.sh stop DATA_DIR
set -euo pipefail
find_bin() {
    local d; for d in /usr/lib/postgresql/*/bin; do [[ -x "$d/initdb" ]] && { echo "$d"; return; }; done
}
if [[ "${1:-}" == "stop" ]]; then
    BIN="$(find_bin)"; runuser -u postgres -- "$BIN/pg_ctl" -D "$2" -m fast stop >/dev/null 2>&1 || true; exit 0
fi
DATA="$1"; PORT="$2"
BIN="$(find_bin || true)"
if [[ -z "$BIN" ]]; then
    (apt-get update -qq || true); DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    BIN="$(find_bin)"
fi
RUN_AS=(); [[ $EUID -eq 0 ]] && RUN_AS=(runuser -u postgres --)   # initdb refuses to run as root
mkdir -p "$DATA"; [[ $EUID -eq 0 ]] && chown postgres:postgres "$DATA"
"${RUN_AS[@]}" "$BIN/initdb" -D "$DATA" -A trust -U forgeflow >/dev/null
"${RUN_AS[@]}" "$BIN/pg_ctl" -D "$DATA" -l "$DATA/server.log" -w \
    -o "-h 127.0.0.1 -p $PORT -k $DATA -c fsync=off -c max_connections=50" start >/dev/null
"${RUN_AS[@]}" "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U forgeflow forgeflow
echo "postgresql://forgeflow@127.0.0.1:$PORT/forgeflow"
