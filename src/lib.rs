//! replaysafe: consume Apache Kafka into PostgreSQL so that replaying anything is harmless.
//!
//! The design in four answers:
//! 1. **What identifies a change**: a delivery key taken from the record (`[identity] key`), optionally
//!    prefixed by a stream generation, claimed in the ledger with `INSERT … ON CONFLICT DO NOTHING`.
//! 2. **What orders changes**: offsets within a partition; aggregates are commutative increments of rows that
//!    were newly claimed.
//! 3. **What commits atomically**: one PostgreSQL transaction per partition batch holds the checkpoint
//!    (compare-and-set + fence), the ledger claims, every projection over the rows claimed, and the dead
//!    letters. The Kafka offset is committed after it.
//! 4. **How long the guarantees survive**: the ledger's horizon (`[ledger] horizon-days`, by the database's UTC
//!    date, and the durable pruned-below day in `replaysafe_horizon`); older events are quarantined in the batch
//!    transaction, never applied blindly.
//!
//! Data flow: [`source`] (group, assign, file) → [`engine`] (decide, batch, pipelined apply, settle, ack) →
//! [`sink`] (the batch transaction). The commands are in [`ops`].
//!
//! Every consumed record ends as exactly one [`model::Outcome`]; a run's [`model::Tally`] adds up.

pub mod cel;
pub mod config;
pub mod db_gauges;
pub mod decode;
pub mod demo;
pub mod endpoint;
pub mod engine;
pub mod error;
pub mod filter;
pub mod health;
pub mod ident;
pub mod metrics_http;
pub mod model;
pub mod ops;
pub mod printable;
pub mod projection;
pub mod sink;
pub mod source;
pub mod units;

pub use error::{Error, Result};
