//! The words every stage shares, below the rooms that do the work: a partition's coordinates ([`Tp`]), what a
//! batch carries into the sink transaction and what comes out ([`batch`]), and why a batch did not commit with
//! the SQLSTATE rule that decides retry or fail ([`apply_error`]). Imports only what decoding produces
//! ([`crate::decode`]) and the crate's [`crate::error::Error`]; every folder above may name it.

pub mod apply_error;
pub mod batch;

pub use apply_error::{classify, describe, is_read_only, retryable, ApplyError, READ_ONLY};
pub use batch::{Batch, Item, Outcome, Pending, Tally};

/// A partition's coordinates: (topic, partition number).
pub type Tp = (String, i32);
