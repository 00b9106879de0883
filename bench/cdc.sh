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
#   c. the peer: Debezium's JDBC sink connector (insert.mode=upsert, delete.enabled=true,
#      primary.key.mode=record_key) — run only when its jar is on the Connect kit's classpath (.connect/lib);
#      otherwise the row says why not;
#   d. every final table compared by a checksum over (id, owner, balance, updated_at);
#   e. version guard: one older envelope replayed after the newer ones — replaysafe leaves the row as it is;
#      the peer's statement (PostgreSQL upsert without a version predicate) overwrites it.
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
    REPLAYSAFE_LOG=info /usr/bin/time -f '%M' -o "$work/$enc.rss" target/release/replaysafe run --until-caught-up \
        --config "$work/$enc.toml" >"$work/$enc.out" 2>"$work/$enc.err" || { cat "$work/$enc.err" >&2; exit 1; }
    R[${enc}_rss_mib]=$(awk '{ printf "%.1f", $1 / 1024 }' "$work/$enc.rss" | tail -n1)
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
psql -c "\\copy \"$cs\".staging FROM '$work/changes.csv' (FORMAT csv)" \
    -c "INSERT INTO \"$cs\".accounts (id, owner, balance, updated_at, _version, _sha256)
        SELECT id, owner, balance, updated_at, ARRAY[commit_lsn, lsn],
               sha256(convert_to(concat_ws('|', id, owner, balance, updated_at), 'UTF8')) FROM (
            SELECT DISTINCT ON (id) * FROM \"$cs\".staging ORDER BY id, lsn DESC) last WHERE op <> 'd'
        ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, balance = excluded.balance,
            updated_at = excluded.updated_at, _version = excluded._version, _sha256 = excluded._sha256"
t1=$(now)
R[ceiling_s]=$(elapsed "$t0" "$t1")
R[ceiling_eps]=$(awk -v n="$N" -v s="${R[ceiling_s]}" 'BEGIN { printf "%.0f", n / s }')
R[ceiling_checksum]=$(checksum "\"$cs\".accounts")
log "ceiling: ${R[ceiling_eps]} events/s"

log "c. peer: Debezium JDBC sink connector"
if compgen -G ".connect/lib/debezium-connector-jdbc-*.jar" >/dev/null; then
    R[peer_note]="jar present but the peer run is not scripted yet"
else
    R[peer_note]="not run: io.debezium:debezium-connector-jdbc:3.6.1.Final is not served by the Maven mirror here (mvn: Could not find artifact)"
fi
log "peer: ${R[peer_note]}"

log "e. version guard: an older envelope of id 1 (round 1 of 4) replayed after the newer ones"
old=$((N / 4))
target/release/examples/cdcgen replay "$KAFKA_BROKERS" "bench.cdc.$id.json" "$N" json "$old" >/dev/null
before=$(psql -Atc "SELECT owner FROM \"${schema}_json\".accounts WHERE id = 1")
REPLAYSAFE_LOG=warn target/release/replaysafe run --until-caught-up --config "$work/json.toml" \
    >"$work/guard.out" 2>"$work/guard.err" || { cat "$work/guard.err" >&2; exit 1; }
after=$(psql -Atc "SELECT owner FROM \"${schema}_json\".accounts WHERE id = 1")
R[guard_replaysafe]="id 1 owner $before -> $after ($(tail -n1 "$work/guard.out"))"
# The peer's statement for one record in upsert mode: INSERT … ON CONFLICT (pk) DO UPDATE, no version predicate.
row=$(sed -n "$((old + 1))p" "$work/changes.csv")
IFS=, read -r pid powner pbal pts _ <<<"$row"
psql -c "CREATE TABLE \"$cs\".peer_like AS TABLE \"$cs\".accounts" -c "ALTER TABLE \"$cs\".peer_like ADD PRIMARY KEY (id)"
pb=$(psql -Atc "SELECT owner FROM \"$cs\".peer_like WHERE id = $pid")
psql -c "INSERT INTO \"$cs\".peer_like (id, owner, balance, updated_at, _version, _sha256) VALUES ($pid, '$powner', $pbal, '$pts', '{}', '')
         ON CONFLICT (id) DO UPDATE SET owner = excluded.owner, balance = excluded.balance, updated_at = excluded.updated_at"
pa=$(psql -Atc "SELECT owner FROM \"$cs\".peer_like WHERE id = $pid")
R[guard_peer]="id $pid owner $pb -> $pa (upsert without a version predicate, the JDBC sink's upsert statement shape)"
log "replaysafe: ${R[guard_replaysafe]}"
log "peer-style upsert: ${R[guard_peer]}"

R[events]=$N
R[schema]=$schema
R[encodings]="${encodings[*]}"
R[commit]=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src || echo -dirty)
R[load]=$(cut -d' ' -f1-3 /proc/loadavg)
mkdir -p bench/results
out="bench/results/$(date -u +%Y%m%dT%H%M%SZ)-cdc.json"
for k in "${!R[@]}"; do printf '%s\t%s\n' "$k" "${R[$k]}"; done | python3 bench/cdc_report.py "$out"
