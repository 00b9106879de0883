#!/usr/bin/env bash
# bench/cdc-peer.sh <instance-dir> — start the CDC bench's peer worker (bench/cdc.sh row 7e): one Kafka Connect
# 4.3.1 standalone worker with NO connector, its classpath scripts/connect-start's kit (.connect/lib, from
# debezium/pom.xml) and plugin.path .connect/jdbc-plugins holding Debezium's JDBC sink connector 3.6.0.Final
# (from debezium-jdbc/pom.xml; why 3.6.0 and why c3p0 instead of Agroal: see that pom). The sink loads in its
# own plugin class loader, so its 3.6.0 Debezium jars do not clash with the 3.6.1 source connector's.
# The caller creates the connector with PUT <url>/connectors/<name>/config and stops the worker with
# scripts/connect-stop <instance-dir> (the command line is the same shape as scripts/connect-start's).
# Keys and values: JsonConverter with schemas.enable=true (the sink needs Connect schemas).
# Output: progress on stderr; last lines CONNECT_PID=<pid>, CONNECT_URL=http://127.0.0.1:<port>. Exit 1 with
# the reason (Maven's log tail, the worker log's tail) when a kit cannot be built or the REST API does not come
# up within $CONNECT_START_WAIT seconds (default 120). Uses KAFKA_BROKERS.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
C=$ROOT/.connect
MVN=${MVN:-mvn}
JAVA=${JAVA:-java}
WAIT_S=${CONNECT_START_WAIT:-120}
die() { echo "cdc-peer: ERROR: $*" >&2; exit 1; }
[[ $# -eq 1 ]] || die "usage: bench/cdc-peer.sh <instance-dir>"
[[ -n ${KAFKA_BROKERS:-} ]] || die "KAFKA_BROKERS is not set"
mkdir -p "$1/logs"
I=$(cd "$1" && pwd)

# kit <pom> <dir> [mvn args…]: copy-dependencies of <pom> into <dir> unless built from the same pom and args.
kit() {
    local pom=$1 dir=$2 sum
    shift 2
    sum=$(sha256sum "$pom" | cut -d' ' -f1)
    [[ $# -eq 0 ]] || sum=$(echo "$sum $*" | sha256sum | cut -d' ' -f1) # the same stamp as connect-start's without args
    [[ -f $dir/.pom.sha256 && "$(cat "$dir/.pom.sha256")" == "$sum" ]] && return 0
    echo "cdc-peer: building $dir from $pom" >&2
    rm -rf "$dir.tmp"
    if ! "$MVN" -q -B -Dstyle.color=never -f "$pom" dependency:copy-dependencies -DoutputDirectory="$dir.tmp" "$@" \
        >"$C/mvn-$(basename "$dir").log" 2>&1; then
        grep -E 'Could not|ERROR' "$C/mvn-$(basename "$dir").log" | head -n 5 >&2
        die "maven could not build $dir from $pom (log: $C/mvn-$(basename "$dir").log)"
    fi
    echo "$sum" >"$dir.tmp/.pom.sha256"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
}
mkdir -p "$C" "$C/jdbc-plugins"
exec 9>"$C/.lock"
flock -w 600 9 || die "timed out waiting for $C/.lock"
kit "$ROOT/debezium/pom.xml" "$C/lib"
# Kafka's own jars, slf4j and Jackson come from the worker's classpath (Connect loads org.apache.kafka.* from the
# parent; two Jacksons fail: Hibernate's ServiceLoader finds the parent's BlackbirdModule, "not a subtype").
kit "$ROOT/debezium-jdbc/pom.xml" "$C/jdbc-plugins/debezium-connector-jdbc" -DincludeScope=runtime \
    -DexcludeGroupIds=org.apache.kafka,com.fasterxml.jackson.core,com.fasterxml.jackson.datatype -DexcludeArtifactIds=slf4j-api
exec 9>&-

PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$I/worker.properties" <<PROPS
# Written by bench/cdc-peer.sh: the CDC bench's peer worker (Debezium JDBC sink).
bootstrap.servers=$KAFKA_BROKERS
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=true
value.converter.schemas.enable=true
offset.storage.file.filename=$I/offsets.dat
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:$PORT
plugin.path=$C/jdbc-plugins
task.shutdown.graceful.timeout.ms=10000
PROPS
cat >"$I/log4j2.properties" <<PROPS
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = $I/logs/connect.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %X{connector.context}%m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
logger.kafkaclients.name = org.apache.kafka.clients
logger.kafkaclients.level = WARN
logger.kafkaconfig.name = org.apache.kafka.common.config
logger.kafkaconfig.level = WARN
logger.hibernate.name = org.hibernate
logger.hibernate.level = WARN
logger.c3p0.name = com.mchange
logger.c3p0.level = WARN
PROPS
# shellcheck disable=SC2086  # CONNECT_HEAP_OPTS is a list of flags
nohup setsid "$JAVA" ${CONNECT_HEAP_OPTS:--Xms128m -Xmx512m} -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$I/log4j2.properties" -cp "$C/lib/*" \
    org.apache.kafka.connect.cli.ConnectStandalone "$I/worker.properties" \
    >>"$I/logs/stdout.log" 2>&1 </dev/null &
PID=$!
echo "$PID" >"$I/connect.pid"
URL="http://127.0.0.1:$PORT"
echo "$URL" >"$I/connect.url"
deadline=$((SECONDS + WAIT_S))
until curl -sf --max-time 5 "$URL/connector-plugins" 2>/dev/null | grep -q JdbcSinkConnector; do
    if ! kill -0 "$PID" 2>/dev/null || ((SECONDS >= deadline)); then
        tail -n 30 "$I/logs/connect.log" "$I/logs/stdout.log" >&2 2>/dev/null || true
        "$ROOT/scripts/connect-stop" "$I" >&2 || true
        die "the worker did not list io.debezium.connector.jdbc.JdbcSinkConnector within ${WAIT_S}s"
    fi
    sleep 0.5
done
echo "cdc-peer: worker pid $PID on $URL lists the JDBC sink" >&2
echo "CONNECT_PID=$PID"
echo "CONNECT_URL=$URL"
