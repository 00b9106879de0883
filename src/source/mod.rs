//! Where the engine's records come from ([`crate::engine::Source`]): positions in, records and "finished" out.
//!
//! - [`group`]: a consumer-group subscription; partitions are taken over on assignment (checkpoint row, fence
//!   bumped) and positioned at the checkpoint (else [`crate::source::start`]); acknowledged by Kafka offset commits.
//! - [`assign`]: explicit partitions with start and stop offsets (backfill, rebuild); finished when every stop
//!   is reached; acknowledged by Kafka offset commits of its own group.
//! - [`file`]: the records of a `kcat -C -J` file; finished at its end; nothing acknowledged. [`kcat`]: one line
//!   of such a file → a record (payload string, headers, `payload_error`, lines that are not UTF-8).
//! - [`identity`]: the topic id and cluster id kept beside each checkpoint, checked at every Kafka take-over;
//!   [`logwatch`]: a topic re-created under a running group member that keeps its partitions.

pub mod assign;
pub mod file;
pub mod group;
pub mod identity;
pub mod kafka;
pub mod kcat;
pub mod lag;
pub mod logwatch;
pub mod membership;
pub mod others;
pub mod pending;
pub mod queues;
pub mod start;
