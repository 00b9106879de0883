//! Integration tests against a real Kafka broker and PostgreSQL (started by `scripts/test`).
//! Each test uses its own topic, consumer group and schema, and asserts final database state.

mod backfill;
mod break11;
mod breakit;
mod cases;
mod cases_hostile;
mod cases_kcat;
mod cases_tx;
mod cdc;
mod cdc_order;
mod cdc_tx;
mod common;
mod config_errors;
mod connect;
mod core;
mod debezium;
mod entities;
mod file_source;
mod hardening;
mod health;
mod horizon;
mod keys_drift;
mod load_safety;
mod lock_order;
mod ops;
mod privileges;
mod projections;
mod sasl;
mod starts;
mod tls;
mod tolerance;
mod verify;
mod waits;
