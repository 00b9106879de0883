//! What each row projection has claimed per (entity, version): the state hash of every distinct state a change
//! brought at that version (`replaysafe_row_versions`), so a change at a version the table no longer stores is
//! judged as if that version were still there — the outcome never depends on what arrived before it (issue 34).
//!
//! Rules ([`History::judge`], before the stored state is consulted):
//! - the same (entity, version, state hash) already claimed: `duplicate`, whatever is stored now;
//! - the same (entity, version) with another state: a conflict, always. The winner is the same in every order
//!   ([`rank`]: a delete, else the smaller hash); when that version is the stored one the row holds the winner;
//!   each losing state has one row in `replaysafe_conflicts` naming the winner as `stored` and the loser (its
//!   delivery, topic, partition, offset) as `incoming`;
//! - a version never claimed: judged against the stored state as before (older → `stale`).
//!
//! Under a version column a delete carries the version of the row it deletes: its states are kept apart from
//! the writes at that version (`deleted` is part of the slot). Rows are read and written only under their
//! entity's lock (`statements::lock_entities`), so the claims need no `RETURNING`: what the read found is what
//! the insert adds to. Each row keeps its change's event day (`partition-by`); the ledger prune deletes the rows
//! of pruned days with the ledger's day partitions (`sink::lifecycle`): the memory lasts as long as the ledger's.

use std::collections::{HashMap, HashSet};

use chrono::NaiveDate;
use tokio_postgres::Transaction;

use super::change::{ChangeKind, Coordinates, RowChange};
use super::state::{entity, hash, object, version_text, Unresolved};
use super::statements::{pg_err, Prepared};
use super::table::{Shape, CONFLICTS};
use super::write::Conflict;
use crate::config::Pipeline;
use crate::model::apply_error::ApplyError;

/// Name of the history table (in the pipeline schema).
pub const VERSIONS: &str = "replaysafe_row_versions";

/// `CREATE TABLE` for [`VERSIONS`]: per row projection (`projection`), entity (`entity`, the key as the conflicts
/// table writes it), `version`, `deleted` (a delete under a version column), `position` (the source position when
/// it orders the change: a version column under `truncate = "truncate"`, or a change without a version of its
/// own; `{}` otherwise) and state hash (`sha256`, as `_sha256`): the row object (`state`, NULL for a delete), the delivery key and `topic`/`partition`/`offset` of
/// the first change that brought it, its event `day` (NULL without `partition-by`: never pruned) and `reach`, the
/// [`super::Reach`] tags the claims of the state gave the other projections (NULL for a row claimed before it was
/// kept: a copy of it is a duplicate for all), with an index for the prune. A table from before `reach` gets the
/// column.
pub fn create_versions(p: &Pipeline) -> String {
    let t = p.table(VERSIONS);
    let index = crate::projection::outbox::index_name(&t, "_day");
    format!(
        "CREATE TABLE IF NOT EXISTS {t} (projection text NOT NULL, entity text NOT NULL, version bigint[] NOT NULL, \
         deleted boolean NOT NULL, position bigint[] NOT NULL, sha256 bytea NOT NULL, state text, \
         delivery text NOT NULL, topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, day date, \
         reach text[], PRIMARY KEY (projection, entity, version, deleted, position, sha256)); \
         ALTER TABLE {t} ADD COLUMN IF NOT EXISTS reach text[]; \
         CREATE INDEX IF NOT EXISTS \"{index}\" ON {t} (day) WHERE day IS NOT NULL"
    )
}

/// `$1` projection, `$2` entities, `$3` versions, `$4` slot positions (texts `'{a,b}'`): the claimed states of
/// those slots.
pub(super) fn fetch_sql(p: &Pipeline) -> String {
    format!(
        "SELECT h.entity, h.version, h.deleted, h.sha256, h.state, h.delivery, h.topic, h.partition, h.\"offset\", \
         h.position, h.reach FROM unnest($2::text[], $3::text[], $4::text[]) AS u(e, v, pos) JOIN {} h \
         ON h.projection = $1 AND h.entity = u.e AND h.version = u.v::bigint[] AND h.position = u.pos::bigint[]",
        p.table(VERSIONS)
    )
}

/// `$1` projection, then one array per column: the states a fold claimed.
pub(super) fn insert_sql(p: &Pipeline) -> String {
    format!(
        "INSERT INTO {} (projection, entity, version, deleted, sha256, state, delivery, topic, partition, \"offset\", \
         day, position, reach) SELECT $1, u.e, u.v::bigint[], u.d, u.h, u.s, u.dl, u.t, u.p, u.o, u.day, \
         u.pos::bigint[], u.r::text[] \
         FROM unnest($2::text[], $3::text[], $4::boolean[], $5::bytea[], $6::text[], $7::text[], $8::text[], \
         $9::integer[], $10::bigint[], $11::date[], $12::text[], $13::text[]) AS u(e, v, d, h, s, dl, t, p, o, day, pos, r) \
         ON CONFLICT DO NOTHING",
        p.table(VERSIONS)
    )
}

/// `$1` projection, then per claimed state a later copy claimed again (a new delivery key): entity, version,
/// deleted, position, hash, that copy's event day — the memory lasts as long as the latest claim of the state
/// (the ledger keeps that copy's key until its day is pruned; a copy arriving meanwhile is a `duplicate` in every
/// order, not only when the first claim's day is still kept).
pub(super) fn extend_sql(p: &Pipeline) -> String {
    format!(
        "UPDATE {} h SET day = u.day FROM unnest($2::text[], $3::text[], $4::boolean[], $5::text[], $6::bytea[], \
         $7::date[]) AS u(e, v, d, pos, sh, day) WHERE h.projection = $1 AND h.entity = u.e \
         AND h.version = u.v::bigint[] AND h.deleted = u.d AND h.position = u.pos::bigint[] AND h.sha256 = u.sh \
         AND h.day < u.day",
        p.table(VERSIONS)
    )
}

/// `$1` projection, then per claimed state a copy gave new [`super::Reach`] tags: entity, version, deleted,
/// position, hash, the state's tags now (a `text[]` literal).
pub(super) fn retag_sql(p: &Pipeline) -> String {
    format!(
        "UPDATE {} h SET reach = u.r::text[] FROM unnest($2::text[], $3::text[], $4::boolean[], $5::text[], \
         $6::bytea[], $7::text[]) AS u(e, v, d, pos, sh, r) WHERE h.projection = $1 AND h.entity = u.e \
         AND h.version = u.v::bigint[] AND h.deleted = u.d AND h.position = u.pos::bigint[] AND h.sha256 = u.sh",
        p.table(VERSIONS)
    )
}

/// The three statements that rename a claimed state after a copy with a lesser delivery key: its memory row,
/// then the conflict rows naming it as `stored`, then those naming it as `incoming` (with its coordinates).
/// `$1` projection, then per state: entity, version, deleted, position, hash, delivery, topic, partition, offset.
pub(super) fn relabel_sql(p: &Pipeline) -> [String; 3] {
    let u = "unnest($2::text[], $3::text[], $4::boolean[], $5::text[], $6::bytea[], $7::text[], $8::text[], \
             $9::integer[], $10::bigint[]) AS u(e, v, d, pos, sh, dl, t, p, o)";
    let c = p.table(CONFLICTS);
    [
        format!(
            "UPDATE {} h SET delivery = u.dl, topic = u.t, partition = u.p, \"offset\" = u.o FROM {u} \
             WHERE h.projection = $1 AND h.entity = u.e AND h.version = u.v::bigint[] AND h.deleted = u.d \
             AND h.position = u.pos::bigint[] AND h.sha256 = u.sh",
            p.table(VERSIONS)
        ),
        format!(
            "UPDATE {c} c SET stored_delivery = u.dl FROM {u} WHERE c.projection = $1 AND c.entity = u.e::jsonb \
             AND c.version = u.v::bigint[] AND c.stored_sha256 = u.sh"
        ),
        format!(
            "UPDATE {c} c SET incoming_delivery = u.dl, topic = u.t, partition = u.p, \"offset\" = u.o FROM {u} \
             WHERE c.projection = $1 AND c.entity = u.e::jsonb AND c.version = u.v::bigint[] \
             AND c.incoming_sha256 = u.sh"
        ),
    ]
}

/// `$1` projection, then per slot whose winner changed: entity, version, winner's delivery, hash, object, the
/// former winner's hash — the conflict rows recorded before (naming the former winner) name the new one as
/// `stored`.
pub(super) fn rewin_sql(p: &Pipeline) -> String {
    format!(
        "UPDATE {} c SET stored_delivery = u.sd, stored_sha256 = u.sh, stored = u.s::jsonb \
         FROM unnest($2::text[], $3::text[], $4::text[], $5::bytea[], $6::text[], $7::bytea[]) \
         AS u(e, v, sd, sh, s, old) WHERE c.projection = $1 AND c.entity = u.e::jsonb AND c.version = u.v::bigint[] \
         AND c.stored_sha256 = u.old",
        p.table(CONFLICTS)
    )
}

/// `(entity text, version, deleted under a version column, source position when it orders the change — else
/// empty)`: where a change's state is claimed.
type Slot = (String, Vec<i64>, bool, Vec<i64>);

/// One claimed state of a slot.
#[derive(Debug, Clone)]
struct Entry {
    sha: Vec<u8>,
    deleted: bool,
    /// The row object ([`object`]); `None` for a delete.
    state: Option<String>,
    delivery: String,
    topic: String,
    partition: i32,
    offset: i64,
    /// The [`super::Reach`] tags the claims of this state gave the other projections; `None` when not known (a
    /// row claimed before they were kept).
    reach: Option<Vec<String>>,
}

/// Which of two states at one version wins, the same in every order: a delete (the entity is gone at that
/// version), else the smaller state hash.
fn rank(e: &Entry) -> (bool, &[u8]) {
    (!e.deleted, e.sha.as_slice())
}

/// What the history says about a change, before the stored state is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Seen {
    /// Its version was never claimed with any state: judge it against the stored state.
    Fresh,
    /// Its state was already claimed at its version, and gives no projection anything new: a duplicate.
    Same,
    /// Its state was already claimed at its version under another delivery key, but it gives these projections
    /// (indices) values no earlier claim of the state gave them: a duplicate for the row, landed for them.
    Copy(Vec<usize>),
    /// Another state was claimed at its version: a conflict; `wins`: its state is the slot's winner now (the
    /// stored row takes it when the row is at that version).
    Conflict { wins: bool },
}

/// The claimed states of a batch's slots (read under the entity locks) and what the fold adds.
pub(super) struct History {
    seen: HashMap<Slot, Vec<Entry>>,
    added: Vec<(Slot, Entry, Option<NaiveDate>)>,
    /// Slots whose winner this batch changed, with their winner's hash before this batch.
    rewon: HashMap<Slot, Vec<u8>>,
    /// Losing states to record as conflicts (the winner is taken at the end).
    losers: Vec<(Slot, Entry)>,
    /// Claimed states a newly claimed copy confirmed, with that copy's event day ([`extend_sql`]).
    confirmed: Vec<(Slot, Vec<u8>, NaiveDate)>,
    /// Claimed states a copy gave new reach tags ([`retag_sql`]).
    retagged: HashSet<(Slot, Vec<u8>)>,
    /// Claimed states a copy with a lesser delivery key now names ([`relabel_sql`]).
    relabeled: HashSet<(Slot, Vec<u8>)>,
    by_column: bool,
    /// A version column under `truncate = "truncate"` ([`Prepared`]'s `reloads`): the source position orders too.
    reloads: bool,
}

/// The source position that is part of change `c`'s slot: when it orders the change (`reloads`, or no version
/// of its own), else none.
fn slot_position(c: &RowChange, reloads: bool) -> Vec<i64> {
    if reloads || c.version.is_empty() {
        c.position.clone().unwrap_or_default()
    } else {
        Vec::new()
    }
}

impl History {
    /// Reads the claimed states of the slots of `changes` (their versions before [`super::state::follow`]).
    ///
    /// # Errors
    /// As [`pg_err`].
    pub(super) async fn fetch(
        tx: &Transaction<'_>,
        prepared: &Prepared,
        projection: &str,
        by_column: bool,
        changes: &[&RowChange],
    ) -> Result<History, ApplyError> {
        let shape = &prepared.shape;
        let reloads = prepared.reloads;
        let slots: HashSet<(String, String, String)> = changes
            .iter()
            .map(|c| {
                (
                    entity(shape, &c.key),
                    version_text(&c.version),
                    version_text(&slot_position(c, reloads)),
                )
            })
            .collect();
        let mut es = Vec::new();
        let mut vs = Vec::new();
        let mut ps = Vec::new();
        for (e, v, p) in slots {
            es.push(e);
            vs.push(v);
            ps.push(p);
        }
        let mut seen: HashMap<Slot, Vec<Entry>> = HashMap::new();
        if !es.is_empty() {
            for r in tx
                .query(&prepared.history.fetch, &[&projection, &es, &vs, &ps])
                .await
                .map_err(pg_err)?
            {
                let slot: Slot = (r.get(0), r.get(1), r.get(2), r.get(9));
                let state: Option<String> = r.get(4);
                seen.entry(slot).or_default().push(Entry {
                    sha: r.get(3),
                    deleted: state.is_none(),
                    state,
                    delivery: r.get(5),
                    topic: r.get(6),
                    partition: r.get(7),
                    offset: r.get(8),
                    reach: r.get(10),
                });
            }
        }
        Ok(History {
            seen,
            added: Vec::new(),
            rewon: HashMap::new(),
            losers: Vec::new(),
            confirmed: Vec::new(),
            retagged: HashSet::new(),
            relabeled: HashSet::new(),
            by_column,
            reloads,
        })
    }

    /// Judges change `c` (its state `incoming`, `waits`) by what its slot holds, and claims its state there —
    /// unless it is [`Seen::Fresh`] and `c` is a ledger duplicate ([`RowChange::redelivered`]: its first
    /// record's state is not known, so its own is not taken for it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn judge(
        &mut self,
        c: &RowChange,
        key: &[String],
        incoming: &[Option<String>],
        waits: Option<&Unresolved>,
        shape: &Shape,
        at: &Coordinates<'_>,
    ) -> Seen {
        let deleted = c.kind == ChangeKind::Delete;
        let slot: Slot = (
            entity(shape, key),
            c.version.clone(),
            deleted && self.by_column,
            slot_position(c, self.reloads),
        );
        let e = Entry {
            sha: hash(shape, incoming, deleted, waits),
            deleted,
            state: (!deleted).then(|| object(shape, incoming)),
            delivery: c.delivery.clone(),
            topic: at.topic.to_string(),
            partition: at.partition,
            offset: c.offset,
            reach: Some(c.reach.iter().filter_map(|r| r.tag.clone()).collect()),
        };
        let entries = self.seen.entry(slot.clone()).or_default();
        if let Some(x) = entries.iter_mut().find(|x| x.sha == e.sha) {
            if !c.redelivered {
                if let Some(&day) = at.days.get(&c.offset) {
                    self.confirmed.push((slot.clone(), e.sha.clone(), day));
                }
            }
            if c.redelivered {
                return Seen::Same;
            }
            // Of the copies of a state, the least delivery key (and its coordinates) is the one named (conflict
            // rows, the memory), whichever arrived first.
            if !c.snapshot && c.delivery < x.delivery {
                x.delivery = c.delivery.clone();
                x.topic = at.topic.to_string();
                x.partition = at.partition;
                x.offset = c.offset;
                self.relabeled.insert((slot.clone(), e.sha.clone()));
            }
            let Some(known) = x.reach.as_mut() else {
                return Seen::Same;
            };
            let reaches = new_reaches(&c.reach, known);
            if reaches.new_tags {
                self.retagged.insert((slot, e.sha));
            }
            return if reaches.projections.is_empty() {
                Seen::Same
            } else {
                Seen::Copy(reaches.projections)
            };
        }
        let winner = entries.iter().min_by(|a, b| rank(a).cmp(&rank(b))).cloned();
        if winner.is_none() && c.redelivered {
            return Seen::Fresh;
        }
        entries.push(e.clone());
        let day = at.days.get(&c.offset).copied();
        self.added.push((slot.clone(), e.clone(), day));
        let Some(w) = winner else {
            return Seen::Fresh;
        };
        let wins = rank(&e) < rank(&w);
        if wins {
            self.rewon
                .entry(slot.clone())
                .or_insert_with(|| w.sha.clone());
            self.losers.push((slot, w));
        } else {
            self.losers.push((slot, e));
        }
        Seen::Conflict { wins }
    }

    /// The conflicts of this fold's losing states, each against its slot's winner at the end of the fold.
    pub(super) fn conflicts(&self) -> Vec<Conflict> {
        self.losers
            .iter()
            .map(|(slot, l)| {
                let w = self.winner(slot);
                let l = self.current(slot, &l.sha).unwrap_or(l);
                Conflict {
                    entity: slot.0.clone(),
                    version: version_text(&slot.1),
                    stored_delivery: Some(w.delivery.clone()),
                    incoming_delivery: l.delivery.clone(),
                    stored_sha: w.sha.clone(),
                    incoming_sha: l.sha.clone(),
                    stored: w.state.clone().unwrap_or_else(|| "null".into()),
                    incoming: l.state.clone().unwrap_or_else(|| "null".into()),
                    offset: l.offset,
                    source: Some((l.topic.clone(), l.partition)),
                }
            })
            .collect()
    }

    /// The entry of `slot` with state hash `sha` as it is now.
    fn current(&self, slot: &Slot, sha: &[u8]) -> Option<&Entry> {
        self.seen.get(slot)?.iter().find(|x| x.sha == sha)
    }

    fn winner(&self, slot: &Slot) -> &Entry {
        self.seen[slot]
            .iter()
            .min_by(|a, b| rank(a).cmp(&rank(b)))
            .expect("a slot with a loser has a winner")
    }

    /// Writes the claimed states and renames the winner of the conflict rows of slots whose winner changed
    /// (before this fold's conflicts are inserted).
    ///
    /// # Errors
    /// As [`pg_err`].
    pub(super) async fn write(
        &self,
        tx: &Transaction<'_>,
        prepared: &Prepared,
        projection: &str,
    ) -> Result<(), ApplyError> {
        if !self.added.is_empty() {
            let a: Vec<(&Slot, &Entry, Option<NaiveDate>)> = self
                .added
                .iter()
                .map(|(s, x, d)| (s, self.current(s, &x.sha).unwrap_or(x), *d))
                .collect();
            let e: Vec<&str> = a.iter().map(|(s, _, _)| s.0.as_str()).collect();
            let v: Vec<String> = a.iter().map(|(s, _, _)| version_text(&s.1)).collect();
            let d: Vec<bool> = a.iter().map(|(s, _, _)| s.2).collect();
            let h: Vec<&[u8]> = a.iter().map(|(_, x, _)| x.sha.as_slice()).collect();
            let st: Vec<Option<&str>> = a.iter().map(|(_, x, _)| x.state.as_deref()).collect();
            let dl: Vec<&str> = a.iter().map(|(_, x, _)| x.delivery.as_str()).collect();
            let t: Vec<&str> = a.iter().map(|(_, x, _)| x.topic.as_str()).collect();
            let p: Vec<i32> = a.iter().map(|(_, x, _)| x.partition).collect();
            let o: Vec<i64> = a.iter().map(|(_, x, _)| x.offset).collect();
            let day: Vec<Option<NaiveDate>> = a.iter().map(|(_, _, d)| *d).collect();
            let pos: Vec<String> = a.iter().map(|(s, _, _)| version_text(&s.3)).collect();
            let r: Vec<Option<String>> = a
                .iter()
                .map(|(s, x, _)| self.reach_text(s, &x.sha))
                .collect();
            tx.execute(
                &prepared.history.insert,
                &[
                    &projection,
                    &e,
                    &v,
                    &d,
                    &h,
                    &st,
                    &dl,
                    &t,
                    &p,
                    &o,
                    &day,
                    &pos,
                    &r,
                ],
            )
            .await
            .map_err(pg_err)?;
        }
        self.write_retags(tx, prepared, projection).await?;
        self.write_relabels(tx, prepared, projection).await?;
        if !self.confirmed.is_empty() {
            let c = &self.confirmed;
            let e: Vec<&str> = c.iter().map(|(s, _, _)| s.0.as_str()).collect();
            let v: Vec<String> = c.iter().map(|(s, _, _)| version_text(&s.1)).collect();
            let d: Vec<bool> = c.iter().map(|(s, _, _)| s.2).collect();
            let pos: Vec<String> = c.iter().map(|(s, _, _)| version_text(&s.3)).collect();
            let h: Vec<&[u8]> = c.iter().map(|(_, h, _)| h.as_slice()).collect();
            let day: Vec<NaiveDate> = c.iter().map(|(_, _, d)| *d).collect();
            tx.execute(
                &prepared.history.extend,
                &[&projection, &e, &v, &d, &pos, &h, &day],
            )
            .await
            .map_err(pg_err)?;
        }
        if !self.rewon.is_empty() {
            let slots: Vec<&Slot> = self.rewon.keys().collect();
            let old: Vec<&[u8]> = slots.iter().map(|s| self.rewon[*s].as_slice()).collect();
            let ws: Vec<&Entry> = slots.iter().map(|s| self.winner(s)).collect();
            let e: Vec<&str> = slots.iter().map(|s| s.0.as_str()).collect();
            let v: Vec<String> = slots.iter().map(|s| version_text(&s.1)).collect();
            let sd: Vec<&str> = ws.iter().map(|w| w.delivery.as_str()).collect();
            let sh: Vec<&[u8]> = ws.iter().map(|w| w.sha.as_slice()).collect();
            let so: Vec<&str> = ws
                .iter()
                .map(|w| w.state.as_deref().unwrap_or("null"))
                .collect();
            tx.execute(
                &prepared.history.rewin,
                &[&projection, &e, &v, &sd, &sh, &so, &old],
            )
            .await
            .map_err(pg_err)?;
        }
        Ok(())
    }
}

impl History {
    /// A claimed state's reach tags now, as a `text[]` literal (NULL when not known).
    fn reach_text(&self, slot: &Slot, sha: &[u8]) -> Option<String> {
        let e = self.seen.get(slot)?.iter().find(|x| x.sha == sha)?;
        e.reach.as_ref().map(|r| format!("{{{}}}", r.join(",")))
    }

    /// Writes the reach tags copies added to states claimed before this batch (a state claimed in this batch
    /// is inserted with its tags).
    ///
    /// # Errors
    /// As [`pg_err`].
    async fn write_retags(
        &self,
        tx: &Transaction<'_>,
        prepared: &Prepared,
        projection: &str,
    ) -> Result<(), ApplyError> {
        let added: HashSet<(&Slot, &[u8])> = self
            .added
            .iter()
            .map(|(s, x, _)| (s, x.sha.as_slice()))
            .collect();
        let todo: Vec<&(Slot, Vec<u8>)> = self
            .retagged
            .iter()
            .filter(|(s, h)| !added.contains(&(s, h.as_slice())))
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let e: Vec<&str> = todo.iter().map(|(s, _)| s.0.as_str()).collect();
        let v: Vec<String> = todo.iter().map(|(s, _)| version_text(&s.1)).collect();
        let d: Vec<bool> = todo.iter().map(|(s, _)| s.2).collect();
        let pos: Vec<String> = todo.iter().map(|(s, _)| version_text(&s.3)).collect();
        let h: Vec<&[u8]> = todo.iter().map(|(_, h)| h.as_slice()).collect();
        let r: Vec<Option<String>> = todo.iter().map(|(s, h)| self.reach_text(s, h)).collect();
        tx.execute(
            &prepared.history.retag,
            &[&projection, &e, &v, &d, &pos, &h, &r],
        )
        .await
        .map_err(pg_err)?;
        Ok(())
    }
}

impl History {
    /// Renames the states a copy with a lesser delivery key now names, in their memory rows and in the conflict
    /// rows already recorded ([`relabel_sql`]).
    ///
    /// # Errors
    /// As [`pg_err`].
    async fn write_relabels(
        &self,
        tx: &Transaction<'_>,
        prepared: &Prepared,
        projection: &str,
    ) -> Result<(), ApplyError> {
        let todo: Vec<(&Slot, &Entry)> = self
            .relabeled
            .iter()
            .filter_map(|(s, h)| self.current(s, h).map(|x| (s, x)))
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let e: Vec<&str> = todo.iter().map(|(s, _)| s.0.as_str()).collect();
        let v: Vec<String> = todo.iter().map(|(s, _)| version_text(&s.1)).collect();
        let d: Vec<bool> = todo.iter().map(|(s, _)| s.2).collect();
        let pos: Vec<String> = todo.iter().map(|(s, _)| version_text(&s.3)).collect();
        let h: Vec<&[u8]> = todo.iter().map(|(_, x)| x.sha.as_slice()).collect();
        let dl: Vec<&str> = todo.iter().map(|(_, x)| x.delivery.as_str()).collect();
        let t: Vec<&str> = todo.iter().map(|(_, x)| x.topic.as_str()).collect();
        let p: Vec<i32> = todo.iter().map(|(_, x)| x.partition).collect();
        let o: Vec<i64> = todo.iter().map(|(_, x)| x.offset).collect();
        for st in &prepared.history.relabel {
            tx.execute(st, &[&projection, &e, &v, &d, &pos, &h, &dl, &t, &p, &o])
                .await
                .map_err(pg_err)?;
        }
        Ok(())
    }
}

/// What a copy gives the other projections that no earlier claim of its state gave them.
struct NewReaches {
    /// The projections it reaches (indices): those reading the record itself, and those whose tag is new.
    projections: Vec<usize>,
    /// Whether `known` took a new tag.
    new_tags: bool,
}

/// The projections copy `reach` reaches given the tags `known` of its state, adding its new tags to `known`.
fn new_reaches(reach: &[super::Reach], known: &mut Vec<String>) -> NewReaches {
    let mut out = NewReaches {
        projections: Vec::new(),
        new_tags: false,
    };
    for r in reach {
        match &r.tag {
            None => out.projections.push(r.projection),
            Some(t) if !known.contains(t) => {
                known.push(t.clone());
                out.projections.push(r.projection);
                out.new_tags = true;
            }
            Some(_) => {}
        }
    }
    out
}

/// The prepared statements of [`History`].
pub(super) struct Statements {
    pub(super) fetch: tokio_postgres::Statement,
    pub(super) insert: tokio_postgres::Statement,
    pub(super) rewin: tokio_postgres::Statement,
    pub(super) extend: tokio_postgres::Statement,
    pub(super) retag: tokio_postgres::Statement,
    pub(super) relabel: Vec<tokio_postgres::Statement>,
}

#[cfg(test)]
mod tests {
    use super::super::Reach;
    use super::new_reaches;

    fn reach(projection: usize, tag: Option<&str>) -> Reach {
        Reach {
            projection,
            tag: tag.map(str::to_string),
        }
    }

    #[test]
    fn a_copy_reaches_the_projections_it_gives_a_new_tag_and_those_reading_the_record() {
        let mut known = vec!["a".to_string()];
        // Projection 1 read `a` before, projection 2 reads something new, projection 3 reads the record itself.
        let r = new_reaches(
            &[reach(1, Some("a")), reach(2, Some("b")), reach(3, None)],
            &mut known,
        );
        assert_eq!(r.projections, vec![2, 3]);
        assert!(r.new_tags);
        assert_eq!(known, vec!["a".to_string(), "b".to_string()]);
        // The same copy again gives nothing new but to the record reader.
        let r = new_reaches(&[reach(1, Some("a")), reach(2, Some("b"))], &mut known);
        assert!(r.projections.is_empty());
        assert!(!r.new_tags);
    }
}
