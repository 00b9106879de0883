//! The commands built on the engine and around it: `run`, `load`, `backfill`, `rebuild`, `offsets`, `verify`.

pub mod backfill;
pub mod load;
pub mod offsets;
pub mod projection;
pub mod rebuild;
pub mod run;
pub mod verify;
