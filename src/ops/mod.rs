//! The commands built on the engine and around it: `check`, `run`, `load`, `backfill`, `rebuild`, `offsets`, `verify`.

pub mod backfill;
pub mod check;
pub mod load;
pub mod offsets;
pub mod rebuild;
pub mod run;
pub mod verify;
