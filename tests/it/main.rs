//! Integration tests against a real Kafka broker and PostgreSQL (started by `scripts/test`).
//! Each test uses its own topic, consumer group and schema, and asserts final database state.
//! Modules are named by subject; the line above each says what it covers.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::disallowed_methods,
    reason = "tests fail loudly where they fail, and build their own Kafka clients and fixtures"
)]

// Offsets snapshot, backfill, verify and rebuild against the real broker, retention loss made real.
mod backfill;
// `batch.max-bytes`: a partition batch holds at most that many bytes (and `max-records` records).
mod batches;
// One form per value a row projection stores or compares, whatever the batching, replay and encoding.
mod canonical;
// The handed failure cases (`tests/fixtures/cases/`), each run through the binary against its `expected`.
mod cases;
// Hostile input: NUL characters, unpaired surrogates, huge numbers, too-long group-by texts.
mod cases_hostile;
// C43: replaying `kcat -C -J` dumps with `load` (payloads, keys, headers, timestamps, errors).
mod cases_kcat;
// C42: transactional producers — aborted records never land, markers are stepped over.
mod cases_tx;
// Debezium change events into version-guarded row projections: the handed CDC cases and the seed fixture.
mod cdc;
// Schema evolution with real Debezium: columns added, dropped, retyped; `new-columns = "add"`.
mod cdc_evolve;
// CDC rows ordered by source position: tombstones, conflicts, dead letters, batch sizes 1 and 5000.
mod cdc_order;
// C51, C52, C54, C55: typed destination columns, intervals, incremental snapshots, keyless tables.
mod cdc_pgtypes;
// Primary-key changes whose new-key image holds unchanged-TOAST placeholders, over two partitions.
mod cdc_pk;
// Debezium source transactions applied atomically (`[source] transactions = "atomic"`).
mod cdc_tx;
// Break-it round on issue 36: batch runs behind a held END, a late END, a collection only an outbox reads.
mod cdc_tx_break;
// The gaps of atomic source transactions: rejected values, fences, lost COMMIT replies, open transactions.
mod cdc_tx_gaps;
// Issue 36: atomic source transactions under every encoding, redeliveries, batch runs, restarts, unread tables.
mod cdc_tx_round2;
// Shared scaffolding: pipelines, databases, topics, command helpers, Debezium envelopes, Kafka clients.
mod common;
// Bad pipeline files: exit 2 with `file:line:column`, nothing consumed.
mod config_errors;
// A real Debezium source for tests (Kafka Connect standalone via `scripts/connect-start`).
mod connect;
// The core guarantees: replay under a new group, crash between the commits, kill -9, the demo.
mod core;
// Issue 41: operations without dead ends (later --from resumes, builds and rebuilds after prunes, named lock waits).
mod dead_ends;
// End to end with real Debezium: every column type, updates, deletes, key changes, truncates.
mod debezium;
// The docs' cross references: every README or docs/ page and heading the code names, and every link, exist.
mod doc_refs;
// The same temporal values through the four encodings a Debezium pipeline accepts.
mod encodings;
// One entity's events on several partitions: the version guard gives what one serial application gives.
mod entities;
// `replaysafe load`: records from a `kcat -C -J` file through the same path as `run`.
mod file_source;
// Health for orchestrators: `/healthz`, `/readyz`, the lag gauge, markers leaving no lag.
mod health;
// The ledger horizon as a durable fact: every claim checks it, future days, replays below pruned offsets.
mod horizon;
// Issue 37 under attack: the log's identity seen by other groups, a running worker, bad `offsets start` input.
mod identity_breaks;
// What a terminal or a script reads from `dead-letters list`: no raw control byte.
mod hostile_output;
// `import connector`: the JDBC sink configurations Debezium and Confluent document → pipelines, end to end.
mod import;
// Outbox message keys, epoch units, changed field types and projections, dead letters a backfill resolves.
mod keys_drift;
// The ledger's delivery keys kept by an exclusion constraint on each day partition.
mod ledger_key;
// The ledger's lifecycle: `ledger stats`, `ledger prune`, pruned offsets, a prune while `run` runs.
mod lifecycle;
// `load` beside a running `run`, dumps past the live end, take-over races, a fenced `run`.
mod load_safety;
// C36: batches updating the same aggregate rows in opposite orders wait instead of deadlocking.
mod lock_order;
// C46, C47: topic id and cluster id beside each checkpoint; a recreated topic, a failover, `offsets start`.
mod log_identity;
// Issue 43: `/metrics` by the Prometheus conventions, the docs' table and the Grafana dashboard.
mod metrics;
// Issue 34 (b2): `ledger prune` forgets a claimed state only when its latest claim's day goes.
mod memory_prune;
// Operator friction: connection errors, `/metrics` of an idle instance, missing topics, backfill loose ends.
mod ops;
// C45: PostgreSQL behind PgBouncer — session pooling works, transaction/statement pooling is refused.
mod pooler;
// Least privilege: `init` by the owner, `--no-ddl` runtime roles, `check --database`, missing partitions.
mod privileges;
// Building a projection added to a live pipeline beside production and dead-letter replays.
mod projection_builds;
// Changing the projections of a running pipeline: add, build, remove, a ledger shared by other pipelines.
mod projections;
// `replaysafe prove` on every example pipeline and on deliberately unsafe ones.
mod prove;
// Workers and replays around a prune: a lagging worker resumes, a checkpoint below a pruned offset is refused.
mod pruned_replays;
// C48 and issue 37: eager, cooperative-sticky and KIP-848 rebalances; a silent coordinator; a shared instance id.
mod rebalance;
// Schema-registry framed records (Avro, JSON Schema), hostile frames, a failing or wrong registry.
mod registry;
// Real Debezium output through a registry-aware converter (Avro), edge values and a retype.
mod registry_cdc;
mod registry_protobuf;
// The outbox relay: published once per event across replays, crashes, refusals, readiness.
mod relay;
// C50: dead-letter replay in offset order; a superseded stale event stays unresolved.
mod replay_order;
// A row projection judges a change at (entity, version) the same whatever arrived before it (issue 34).
mod row_order;
// Issue 34 (b2): copies at one version that differ outside the row's columns count the same in any order.
mod same_state_copies;
// Kafka over SASL_SSL through the test broker's listener; wrong password and CA named.
mod sasl;
// No secret reaches the output: URLs, registry credentials, properties, client keys.
mod secrets;
// Issue 42: a shadow pipeline beside a hand-made consumer, `verify compare` naming its redeliveries.
mod shadow;
// `stale` is a row projection's judgement about its own table, not a verdict on the event.
mod stale;
// Where a partition starts without a checkpoint: added partitions, changed generations, fenced starts.
mod starts;
// PostgreSQL over TLS: sslmode semantics, certificates, client-certificate roles.
mod tls;
// `[errors] tolerance`: where it stops, quarantines, and `dead-letters replay` after a fix.
mod tolerance;
// Issue 34 (b2): a tombstone's `_last` does not depend on arrival order (a newer delete first).
mod tombstone_last;
// `verify snapshot` / `verify diff` while production writes into the window.
mod verify;
// Every wait on PostgreSQL and the group is bounded: frozen owners, idle sessions, shutdown drains.
mod waits;
// Issue 41: each killed backfill, build and rebuild, before and after a prune, finished by its documented way out.
mod ways_out;
