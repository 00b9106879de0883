//! The commands built on the engine and around it: `check`, `run`, `load`, `backfill`, `rebuild`, `offsets`,
//! `verify`, `dead-letters`, `outbox relay`, `ledger`, `import`.

pub mod backfill;
pub mod check;
pub mod dead_letters;
pub mod fingerprint;
pub mod import;
pub mod ledger;
pub mod load;
pub mod offsets;
pub mod outbox;
pub mod projection;
pub mod prove;
pub mod rebuild;
pub mod run;
pub mod start_at;
pub mod verify;
