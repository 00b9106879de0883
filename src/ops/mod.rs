//! The commands built on the engine and around it: `check`, `run`, `load`, `backfill`, `rebuild`, `offsets`,
//! `verify`, `dead-letters`, `ledger`.

pub mod backfill;
pub mod check;
pub mod dead_letters;
pub mod ledger;
pub mod load;
pub mod offsets;
pub mod projection;
pub mod rebuild;
pub mod run;
pub mod verify;
