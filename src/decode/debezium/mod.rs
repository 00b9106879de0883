//! Debezium change events: the [`envelope`] (a change record → [`Change`] and a flat document); the conversion of
//! its column values to PostgreSQL text input is the row projection's ([`crate::projection::row::convert`]).

pub mod envelope;
pub mod lean;
pub mod schema;

pub use envelope::{old_key_header, Cell, Change, Op, Record, Row, OLD_KEY_HEADER};
