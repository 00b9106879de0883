//! The commands built on the engine and around it: `check`, `run`, `load`, `backfill`, `rebuild`, `offsets`,
//! `verify`, `dead-letters`.

pub mod backfill;
pub mod check;
pub mod dead_letters;
pub mod load;
pub mod offsets;
pub mod projection;
pub mod prove;
pub mod rebuild;
pub mod run;
pub mod verify;
