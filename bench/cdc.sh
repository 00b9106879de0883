#!/usr/bin/env bash
# bench/cdc.sh [EVENTS] — the CDC bench of issue 15 (also run as the last section of scripts/bench), one run on
# the same change events:
#   a. `replaysafe run --until-caught-up` of EVENTS Debezium envelopes of public.accounts (examples/cdcgen.rs:
#      EVENTS/4 entities, creates, updates, every tenth entity deleted, 8 partitions by id, source blocks with
#      lsn/sequence/txId) into the version-guarded row projection bench/cdc.toml, once per encoding: JSON
#      schemaless, JSON with schema (JsonConverter schemas.enable=true) and, when REGISTRY_URL is set, Avro
#      through the schema registry (events/s from the log line "throughput from first record to last
#      checkpoint commit", peak RSS);
#   b. the ceiling: COPY of the same changes into a staging table + ONE INSERT … SELECT DISTINCT ON (id) …
#      ON CONFLICT DO UPDATE into a table of the same columns and primary key;
#   c. the peer: Debezium's JDBC sink connector io.debezium:debezium-connector-jdbc 3.6.0.Final (3.6.1.Final, the
#      source connector's version, is not served by the Maven mirror here; kit debezium-jdbc/pom.xml, c3p0 pool
#      because Agroal's Hibernate integration is not served either) in its own Connect worker (bench/cdc-peer.sh),
#      on the topic of row 7b (JSON with schema; keys are the schema'd Debezium key struct), insert.mode=upsert,
#      delete.enabled=true, primary.key.mode=record_key, into a fresh schema <schema>_peer with the table
#      pre-created (business columns only); events/s = EVENTS / seconds from PUT of the connector config until
#      the table's checksum equals row 7b's (polled every 0.5 s, bounded by $PEER_WAIT s, default 900); when the
#      worker cannot start the row says why;
#   d. every final table compared by a checksum over (id, owner, balance, updated_at);
#   e. version guard: one older envelope (id 1, round 1) produced again to the JSON-with-schema topic after the
#      newer ones — replaysafe leaves the row as it is; the real peer connector overwrites it (when the peer did
#      not run, a stand-in: the peer's statement shape, an upsert without a version predicate).
# Prints a table like scripts/bench and writes it as JSON to bench/results/<UTC timestamp>-cdc.json.
# Uses DATABASE_URL, KAFKA_BROKERS and REGISTRY_URL. Schemas are benchcdc_<id>*, topics bench.cdc.<id>.*.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
N=${1:-200000}
export DATABASE_URL=${DATABASE_URL:-$(bash scripts/pg-setup | tail -n1 | sed 's/^DATABASE_URL=//')}
export KAFKA_BROKERS=${KAFKA_BROKERS:-$(bash scripts/kafka-start | tail -n1 | sed 's/^KAFKA_BROKERS=//')}
cargo build --release --quiet --example cdcgen --bin replaysafe
id=$(date +%s)
schema="benchcdc_$id"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
psql() { PGOPTIONS="-c client_min_messages=warning -c TimeZone=UTC" command psql "$DATABASE_URL" -X -q -v ON_ERROR_STOP=1 "$@"; }
log() { printf '[bench cdc] %s\n' "$*" >&2; }
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }
# The final state's checksum of table $1 (live rows only).
checksum() {
    psql -Atc "SELECT count(*) || ':' || md5(coalesce(string_agg(concat_ws('|', id, owner, balance, updated_at), ',' ORDER BY id), '')) FROM $1"
}
declare -A R
encodings=(json json-schema)
[ -n "${REGISTRY_URL:-}" ] && encodings+=(avro)

for enc in "${encodings[@]}"; do
    log "producing $N $enc envelopes to bench.cdc.$id.$enc (8 partitions)"
    target/release/examples/cdcgen produce "$KAFKA_BROKERS" "bench.cdc.$id.$enc" "$N" "$enc" ${REGISTRY_URL:+"$REGISTRY_URL"} >/dev/null
done

# One replaysafe pass over encoding $1 into schema $2 under group $3. Sets R[$1_*].
pass() {
    local enc=$1 sch=$2 group=$3 line line_enc=""
    [ "$enc" = avro ] && line_enc="encoding = \"avro\"\nschema-registry = { url = \"$REGISTRY_URL\" }"
    sed -e "s/{group}/$group/" -e "s/{topic}/bench.cdc.$id.$enc/" -e "s/{schema}/$sch/" \
        -e "s|^{encoding}$|$line_enc|" bench/cdc.toml >"$work/$enc.toml"
    local c0
    c0=$(python3 bench/cpu.py snapshot)
    REPLAYSAFE_LOG=info /usr/bin/time -f '%M %U %S' -o "$work/$enc.rss" target/release/replaysafe run --until-caught-up \
        --config "$work/$enc.toml" >"$work/$enc.out" 2>"$work/$enc.err" || { cat "$work/$enc.err" >&2; exit 1; }
    R[${enc}_cpu_us]=$(python3 bench/cpu.py per-event "$c0" "$(python3 bench/cpu.py snapshot)" "$N" \
        "$(tail -n1 "$work/$enc.rss" | awk '{ print $2 + $3 }')")
    R[${enc}_rss_mib]=$(tail -n1 "$work/$enc.rss" | awk '{ printf "%.1f", $1 / 1024 }')
    line=$(grep 'throughput from first record to last checkpoint commit' "$work/$enc.err" | tail -n1)
    R[${enc}_s]=$(sed -E 's/.*seconds=([0-9.e+-]+).*/\1/' <<<"$line")
    R[${enc}_eps]=$(sed -E 's/.*rate=([0-9.e+-]+).*/\1/' <<<"$line")
    R[${enc}_tally]=$(tail -n1 "$work/$enc.out")
    log "$enc: ${R[${enc}_eps]} events/s, peak RSS ${R[${enc}_rss_mib]} MiB — ${R[${enc}_tally]}"
}

for enc in "${encodings[@]}"; do
    log "a. replaysafe run, $enc"
    pass "$enc" "${schema}_${enc//-/_}" "bench-cdc-$id-$enc"
    R[${enc}_checksum]=$(checksum "\"${schema}_${enc//-/_}\".accounts")
done

log "b. ceiling: COPY + one INSERT … ON CONFLICT DO UPDATE"
target/release/examples/cdcgen csv "$N" >"$work/changes.csv"
cs="${schema}_ceiling"
psql -c "DROP SCHEMA IF EXISTS \"$cs\" CASCADE; CREATE SCHEMA \"$cs\"" \
    -c "CREATE TABLE \"$cs\".staging (id bigint, owner text, balance numeric(12,2), updated_at timestamptz, op text, commit_lsn bigint, lsn bigint)" \
    -c "CREATE TABLE \"$cs\".accounts (LIKE \"${schema}_json\".accounts INCLUDING ALL)"
cols=$(psql -Atc "SELECT string_agg(quote_ident(column_name), ',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_schema = '$cs' AND table_name = 'accounts'")
R[ceiling_table_columns]=$cols
t0=$(now)
c0=$(python3 bench/cpu.py snapshot)
psql -c "\\copy \"$cs\".staging FROM '$work/changes.csv' (FORMAT csv)" \
    -c "INSERT INTO \"$cs\".accounts (id, owner, balance, updated_at, _version, _sha256)
        SELECT id, owner, balance, updated_at, ARRAY[commit_lsn, lsn],
               sha256(convert_to(concat_ws('|', id, owner, balance, updated_at), 'UTF8')) FROM (
            SELECT DISTINCT ON (id) * FROM \"$cs\".staging ORDER BY id, lsn DESC) last WHERE op <> 'd'
        ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, balance = excluded.balance,
            updated_at = excluded.updated_at, _version = excluded._version, _sha256 = excluded._sha256"
t1=$(now)
R[ceiling_cpu_us]=$(python3 bench/cpu.py per-event "$c0" "$(python3 bench/cpu.py snapshot)" "$N")
R[ceiling_s]=$(elapsed "$t0" "$t1")
R[ceiling_eps]=$(awk -v n="$N" -v s="${R[ceiling_s]}" 'BEGIN { printf "%.0f", n / s }')
R[ceiling_checksum]=$(checksum "\"$cs\".accounts")
log "ceiling: ${R[ceiling_eps]} events/s"

log "c. peer: Debezium JDBC sink connector on bench.cdc.$id.json-schema (the topic of row 7b)"
# Its own worker (bench/cdc-peer.sh: Connect 4.3.1, the sink 3.6.0.Final from debezium-jdbc/pom.xml, c3p0 pool)
# and a fresh schema; the table pre-created like the ceiling's business columns (the sink keeps no version).
ps="${schema}_peer"
psql -c "DROP SCHEMA IF EXISTS \"$ps\" CASCADE; CREATE SCHEMA \"$ps\"" \
    -c "CREATE TABLE \"$ps\".accounts (id bigint PRIMARY KEY, owner text, balance numeric(12,2), updated_at timestamptz)"
# The worker's files (logs) stay in .connect/bench-peer-<id> when the peer fails; removed when it succeeds.
peer_dir=$ROOT/.connect/bench-peer-$id
peer_url=""
peer_stop() { [ -z "$peer_url" ] || bash scripts/connect-stop "$peer_dir" >/dev/null 2>&1 || true; }
trap 'peer_stop; rm -rf "$work"' EXIT
# status of connector $1: RUNNING, FAILED (trace on stderr) or the states joined by '/'.
peer_state() {
    curl -sf --max-time 5 "$peer_url/connectors/$1/status" 2>/dev/null | python3 -c '
import json, sys
try: s = json.load(sys.stdin)
except ValueError: print("?"); sys.exit()
st = [s["connector"]["state"]] + [t["state"] for t in s.get("tasks") or []]
print("FAILED" if "FAILED" in st else "/".join(st))
for t in s.get("tasks") or []:
    if t.get("trace"): print(t["trace"][:2000], file=sys.stderr)'
}
# Polls until "$ps".accounts holds the checksum $1 (or until PEER_WAIT s); sets peer_sum, peer_t1, peer_tfirst.
peer_wait() {
    local want=$1 deadline st
    deadline=$(awk -v a="$(now)" -v w="${PEER_WAIT:-900}" 'BEGIN { printf "%d", a + w }')
    peer_tfirst=""
    while :; do
        peer_sum=$(checksum "\"$ps\".accounts")
        [ -z "$peer_tfirst" ] && [ "${peer_sum%%:*}" != 0 ] && peer_tfirst=$(now)
        [ "$peer_sum" = "$want" ] && { peer_t1=$(now); return 0; }
        st=$(peer_state peer 2>>"$work/peer.trace")
        [ "$st" = FAILED ] && return 1
        kill -0 "$(cat "$peer_dir/connect.pid")" 2>/dev/null || { echo "the peer's worker exited (log $peer_dir/logs)" >>"$work/peer.trace"; return 1; }
        [ "$(date +%s)" -ge "$deadline" ] && return 2
        sleep 0.5
    done
}
jdbc_url=$(python3 - "$DATABASE_URL" <<'PY'
import sys, urllib.parse as u, json
p = u.urlsplit(sys.argv[1])
print(json.dumps({"connection.url": f"jdbc:postgresql://{p.hostname or 'localhost'}:{p.port or 5432}/{p.path.lstrip('/') or 'postgres'}",
                  "connection.username": u.unquote(p.username or "postgres"), "connection.password": u.unquote(p.password or "")}))
PY
)
peer_config=$(python3 - "$jdbc_url" "bench.cdc.$id.json-schema" "$ps" <<'PY'
import sys, json
c = json.loads(sys.argv[1])
c.update({
    "connector.class": "io.debezium.connector.jdbc.JdbcSinkConnector", "tasks.max": "1", "topics": sys.argv[2],
    # the 3.6 default provider (Agroal) is not served here; see debezium-jdbc/pom.xml
    "connection.provider": "org.hibernate.c3p0.internal.C3P0ConnectionProvider",
    "insert.mode": "upsert", "delete.enabled": "true", "primary.key.mode": "record_key", "primary.key.fields": "id",
    "collection.name.format": f"{sys.argv[3]}.accounts", "schema.evolution": "none", "quote.identifiers": "false",
    "consumer.override.auto.offset.reset": "earliest"})
print(json.dumps(c))
PY
)
if out=$(bash bench/cdc-peer.sh "$peer_dir" 2>"$work/peer-start.err"); then
    peer_url=$(sed -n 's/^CONNECT_URL=//p' <<<"$out")
    t0=$(now)
    curl -sf --max-time 30 -X PUT -H 'Content-Type: application/json' --data "$peer_config" \
        "$peer_url/connectors/peer/config" >/dev/null || { R[peer_note]="not run: PUT /connectors/peer/config refused"; }
    if [ -z "${R[peer_note]:-}" ]; then
        rc=0; peer_wait "${R[json-schema_checksum]}" || rc=$?
        R[peer_checksum]=$peer_sum
        if [ $rc = 0 ]; then
            R[peer_s]=$(elapsed "$t0" "$peer_t1")
            R[peer_eps]=$(awk -v n="$N" -v s="${R[peer_s]}" 'BEGIN { printf "%.0f", n / s }')
            R[peer_eps_first]=$(awk -v n="$N" -v s="$(elapsed "$peer_tfirst" "$peer_t1")" 'BEGIN { printf "%.0f", n / s }')
            fr=${R[peer_eps_first]}
            R[peer_note]="debezium-connector-jdbc 3.6.0.Final (3.6.1 not served here), c3p0 pool, tasks.max=1; from connector creation to the final state ${R[peer_s]} s ($fr events/s from its first row visible); no _version/_sha256 columns, business columns compared"
        elif [ $rc = 1 ]; then
            R[peer_note]="FAILED: $(grep -m1 -E 'Exception|Error|exited' "$work/peer.trace" | cut -c1-300)"
        else
            R[peer_note]="did not reach the final state within ${PEER_WAIT:-900}s (holds ${peer_sum})"
        fi
    fi
else
    R[peer_note]="not run: $(grep -m1 'cdc-peer: ERROR' "$work/peer-start.err" | cut -c1-200); $(grep -m1 -E 'Could not|Missing|ERROR' "$work/peer-start.err" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-300)"
fi
log "peer: ${R[peer_note]}"

log "e. version guard: an older envelope of id 1 (round 1 of 4) replayed after the newer ones, bench.cdc.$id.json-schema"
old=$((N / 4))
# id 1 in the peer's table before the replay (its connector is still running and consumes it at once)
peer_before=$( [ -z "${R[peer_eps]:-}" ] || psql -Atc "SELECT owner FROM \"$ps\".accounts WHERE id = 1")
target/release/examples/cdcgen replay "$KAFKA_BROKERS" "bench.cdc.$id.json-schema" "$N" json-schema "$old" >/dev/null
rs="${schema}_json_schema"
before=$(psql -Atc "SELECT owner FROM \"$rs\".accounts WHERE id = 1")
REPLAYSAFE_LOG=warn target/release/replaysafe run --until-caught-up --config "$work/json-schema.toml" \
    >"$work/guard.out" 2>"$work/guard.err" || { cat "$work/guard.err" >&2; exit 1; }
after=$(psql -Atc "SELECT owner FROM \"$rs\".accounts WHERE id = 1")
R[guard_replaysafe]="id 1 owner $before -> $after ($(tail -n1 "$work/guard.out"))"
row=$(sed -n "$((old + 1))p" "$work/changes.csv")
IFS=, read -r pid powner pbal pts _ <<<"$row"
if [ -n "${R[peer_eps]:-}" ]; then
    # The real connector consumes the replayed envelope; wait (bounded) until id 1 changes or 60 s pass.
    pb=$peer_before
    for _ in $(seq 120); do
        pa=$(psql -Atc "SELECT owner FROM \"$ps\".accounts WHERE id = $pid")
        [ "$pa" != "$pb" ] && break
        sleep 0.5
    done
    R[guard_peer]="id $pid owner $pb -> $pa (the real JDBC sink connector, same replayed record)"
else
    # Fallback stand-in: the peer's statement for one record in upsert mode, INSERT … ON CONFLICT (pk) DO
    # UPDATE without a version predicate.
    psql -c "CREATE TABLE \"$cs\".peer_like AS TABLE \"$cs\".accounts" -c "ALTER TABLE \"$cs\".peer_like ADD PRIMARY KEY (id)"
    pb=$(psql -Atc "SELECT owner FROM \"$cs\".peer_like WHERE id = $pid")
    psql -c "INSERT INTO \"$cs\".peer_like (id, owner, balance, updated_at, _version, _sha256) VALUES ($pid, '$powner', $pbal, '$pts', '{}', '')
             ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, balance = excluded.balance, updated_at = excluded.updated_at"
    pa=$(psql -Atc "SELECT owner FROM \"$cs\".peer_like WHERE id = $pid")
    R[guard_peer]="id $pid owner $pb -> $pa (STAND-IN: the real peer did not complete; the JDBC sink's upsert statement shape, no version predicate)"
fi
peer_stop
peer_url=""
[ -z "${R[peer_eps]:-}" ] || rm -rf "$peer_dir"
log "replaysafe: ${R[guard_replaysafe]}"
log "peer: ${R[guard_peer]}"

R[events]=$N
R[schema]=$schema
R[encodings]="${encodings[*]}"
R[commit]=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo -dirty)
R[load]=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p bench/results
out="bench/results/$(date -u +%Y%m%dT%H%M%SZ)-cdc.json"
for k in "${!R[@]}"; do printf '%s\t%s\n' "$k" "${R[$k]}"; done | python3 bench/cdc_report.py "$out"
