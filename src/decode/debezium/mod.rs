//! Debezium change events: the [`envelope`] (a change record → [`Change`] and a flat document) and the
//! [`convert`]ion of its column values to PostgreSQL text input.

pub mod convert;
pub mod envelope;
pub mod lean;
pub mod schema;

pub use convert::{to_pg, Pg};
pub use envelope::{old_key_header, Cell, Change, Op, Record, Row, OLD_KEY_HEADER};
