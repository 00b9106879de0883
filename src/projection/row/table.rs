//! A row projection's table: its shape (columns from the pipeline file or the catalog, key), the DDL `init` runs
//! (`setup`), and the conflicts and truncates tables.

use tokio_postgres::GenericClient;

use super::plan::{NewColumns, TombstoneMode};
use super::types::{ColumnSpec, SqlType};
use crate::config::Pipeline;
use crate::error::{Error, Result};
use crate::ident::{Ident, QualifiedName};

/// Name of the conflicts table (in the pipeline schema).
pub const CONFLICTS: &str = "replaysafe_conflicts";

/// The qualified conflicts table ([`CONFLICTS`]) of a pipeline with a row projection; `None` without one (it has
/// no conflicts). The table is shared by the pipelines of a schema: its rows name their projection.
pub fn conflicts_table(p: &Pipeline) -> Option<String> {
    (p.projections.iter().any(|x| x.row.is_some())).then(|| p.table(CONFLICTS).to_string())
}

/// Name of the truncate table (in the pipeline schema): one row per truncate applied, per projection; the
/// newest is the projection's *truncate watermark* (source-position versions older than it are stale on every
/// entity, also ones that arrive later from another partition).
pub const TRUNCATES: &str = "replaysafe_truncates";

/// A row projection resolved against the database: its columns (from the pipeline file or the catalog) and key.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Index of the projection in `Pipeline::projections`.
    pub index: usize,
    /// The projection's name.
    pub name: String,
    /// Its columns.
    pub columns: Vec<ColumnSpec>,
    /// Indices into `columns` of the primary key.
    pub key: Vec<usize>,
    /// `new-columns = "extra"`: index into `columns` of the `_extra jsonb` column (the last one), which holds
    /// the members of `after` that are none of the other columns. It is carried, never judged: the row state
    /// hash (duplicate, conflict, unchanged) covers the other columns only.
    pub extra: Option<usize>,
    /// `new-columns = "add"`: how many of `columns` (the last ones) are source columns added to the table
    /// (marked [`super::evolve::MARK`] in the catalog). Carried, never judged, like `_extra`.
    pub added: usize,
    /// Generated columns of the table (`GENERATED ALWAYS AS (…) STORED`): never written (PostgreSQL computes
    /// them); a member of `after` with such a name is neither a new column nor `_extra`.
    pub generated: Vec<String>,
    /// `GENERATED ALWAYS AS IDENTITY` columns of the table: inserted with `OVERRIDING SYSTEM VALUE` (the
    /// source's value is the row's identity), never updated.
    pub identity: Vec<String>,
}

impl Shape {
    /// Whether column `i` takes part in the row state hash (not `_extra`, not an added column).
    pub fn judged(&self, i: usize) -> bool {
        self.extra != Some(i) && i < self.columns.len() - self.added
    }
}

#[cfg(test)]
impl Shape {
    /// For unit tests: a projection `t` of `text` columns named `names`, keyed by the first.
    pub(super) fn of_text(names: &[&str]) -> Shape {
        let columns = names
            .iter()
            .map(|n| ColumnSpec {
                name: Ident::new(n).expect("a valid column name"),
                ty: SqlType::parse("text").expect("text is a type"),
                unit: None,
                field: None,
            })
            .collect();
        Shape {
            index: 0,
            name: "t".into(),
            columns,
            key: vec![0],
            extra: None,
            added: 0,
            generated: Vec::new(),
            identity: Vec::new(),
        }
    }
}

/// The live table's column of a row whose unchanged-TOAST values of a primary-key change wait for the old key's
/// row (docs/cdc.md "Debezium CDC to a table", unchanged TOAST values).
pub const UNRESOLVED: &str = "_unresolved";

/// The name of the `new-columns = "extra"` column.
pub const EXTRA: &str = "_extra";

/// A column of an existing table as the catalog describes it.
#[derive(Debug, Clone)]
pub struct CatalogColumn {
    /// Its name.
    pub name: String,
    /// Its type as `format_type()` spells it in this session (qualified and quoted as needed).
    pub sql: String,
    /// The type its values are read as (see [`SqlType::catalog`]): an enum's `text`, a domain's base type (with
    /// `[]` for arrays of them); the type itself otherwise.
    pub base: String,
    /// `GENERATED ALWAYS AS (…) STORED` (`pg_attribute.attgenerated`): computed by PostgreSQL, never written.
    pub generated: bool,
    /// `GENERATED ALWAYS AS IDENTITY` (`pg_attribute.attidentity = 'a'`): written with `OVERRIDING SYSTEM VALUE`.
    pub identity_always: bool,
}

/// The columns of `table` from the catalog (`None`: no such table), in column order.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn catalog_columns(
    c: &impl GenericClient,
    table: &QualifiedName,
) -> Result<Option<Vec<CatalogColumn>>> {
    let rows = c
        .query(
            "SELECT a.attname::text, pg_catalog.format_type(a.atttypid, a.atttypmod), \
             CASE e.typtype WHEN 'e' THEN 'text' \
               WHEN 'd' THEN pg_catalog.format_type(e.typbasetype, e.typtypmod) END \
               || CASE WHEN e.oid <> t.oid THEN '[]' ELSE '' END, \
             a.attgenerated <> '', a.attidentity = 'a' \
             FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_class r ON r.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace \
             JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             JOIN pg_catalog.pg_type e ON e.oid = CASE WHEN t.typcategory = 'A' AND t.typelem <> 0 \
               THEN t.typelem ELSE t.oid END \
             WHERE n.nspname = $1 AND r.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&table.schema.as_str(), &table.name.as_str()],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        rows.iter()
            .map(|r| {
                let sql: String = r.get(1);
                CatalogColumn {
                    name: r.get(0),
                    base: r.get::<_, Option<String>>(2).unwrap_or_else(|| sql.clone()),
                    sql,
                    generated: r.get(3),
                    identity_always: r.get(4),
                }
            })
            .collect(),
    ))
}

async fn catalog_pk(c: &impl GenericClient, table: &QualifiedName) -> Result<Vec<String>> {
    let rows = c
        .query(
            "SELECT a.attname::text FROM pg_index i JOIN pg_class r ON r.oid = i.indrelid \
             JOIN pg_namespace n ON n.oid = r.relnamespace \
             JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) ON true \
             JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum = k.attnum \
             WHERE n.nspname = $1 AND r.relname = $2 AND i.indisprimary ORDER BY k.ord",
            &[&table.schema.as_str(), &table.name.as_str()],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Resolves a row projection's columns and key: from the pipeline file, or from the existing table.
///
/// # Errors
/// [`Error::Schema`] when the table is missing and `columns` is not given, has no primary key and `key` is not
/// given, or has a column type replaysafe cannot convert to.
pub async fn resolve(c: &impl GenericClient, p: &Pipeline, index: usize) -> Result<Shape> {
    let proj = &p.projections[index];
    let plan = proj
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
    let catalog = catalog_columns(c, &plan.table).await?;
    let (generated, identity) = write_rules(&proj.name, plan, catalog.as_deref())?;
    let mut columns: Vec<ColumnSpec> = match &plan.columns {
        Some(cols) => cols.clone(),
        None => {
            let found = catalog.ok_or_else(|| {
                Error::Schema(format!(
                    "row projection `{}`: table {} does not exist; create it (the source table's DDL) or declare `columns`",
                    proj.name, plan.table
                ))
            })?;
            let mut out = Vec::new();
            for CatalogColumn {
                name,
                sql,
                base,
                generated,
                ..
            } in found
            {
                if name.starts_with('_') || generated {
                    continue;
                }
                let ty = SqlType::catalog(&sql, &base).map_err(|m| {
                    Error::Schema(format!(
                        "row projection `{}`: column {name} of {}: {m}",
                        proj.name, plan.table
                    ))
                })?;
                out.push(ColumnSpec {
                    name: Ident::new(&name).map_err(|m| {
                        Error::Schema(format!(
                            "row projection `{}`: column `{name}`: {m}",
                            proj.name
                        ))
                    })?,
                    ty,
                    unit: None,
                    field: None,
                });
            }
            out
        }
    };
    // Before the key's indices are taken: the added columns move to the end.
    let added = match plan.new_columns {
        NewColumns::Add => {
            let declared: Vec<&str> = plan
                .columns
                .iter()
                .flatten()
                .map(|c| c.name.as_str())
                .collect();
            append_added(c, &plan.table, &proj.name, &declared, &mut columns).await?
        }
        _ => 0,
    };
    let key_names: Vec<String> = if plan.key.is_empty() {
        let pk = catalog_pk(c, &plan.table).await?;
        if pk.is_empty() {
            return Err(Error::Schema(format!(
                "row projection `{}`: set `key` (the table {} has no primary key yet)",
                proj.name, plan.table
            )));
        }
        pk
    } else {
        plan.key.iter().map(|k| k.as_str().to_string()).collect()
    };
    let mut key = Vec::new();
    for k in &key_names {
        let i = columns
            .iter()
            .position(|c| c.name.as_str() == k)
            .ok_or_else(|| {
                Error::Schema(format!(
                    "row projection `{}`: key column `{k}` is not a column of {}",
                    proj.name, plan.table
                ))
            })?;
        key.push(i);
    }
    let extra = (plan.new_columns == NewColumns::Extra).then(|| {
        columns.push(ColumnSpec {
            name: Ident::new(EXTRA).expect("a built-in name is a valid SQL identifier"),
            ty: SqlType::parse("jsonb").expect("a built-in SQL type"),
            unit: None,
            field: None,
        });
        columns.len() - 1
    });
    Ok(Shape {
        index,
        name: proj.name.clone(),
        columns,
        key,
        extra,
        added,
        generated,
        identity,
    })
}

/// What `check --database` says about row projection `index`'s destination table (`(ok, text)` each, before
/// any batch): a table that does not exist while `columns` is not declared, or a shape [`resolve`] refuses (a
/// column type replaysafe cannot write, a declared generated column), is not ok; generated columns left out of
/// the write, identity columns written with `OVERRIDING SYSTEM VALUE`, enum and domain columns and (with
/// `[source] interval-handling = "numeric"`) interval columns are noted.
///
/// # Errors
/// [`Error::Postgres`].
pub async fn column_notes(
    c: &impl GenericClient,
    p: &Pipeline,
    index: usize,
) -> Result<Vec<(bool, String)>> {
    let plan = p.projections[index]
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
    let Some(catalog) = catalog_columns(c, &plan.table).await? else {
        return Ok(match plan.columns {
            Some(_) => Vec::new(),
            None => vec![(
                false,
                format!(
                    "table {} does not exist and `columns` is not declared: create it (the source table's DDL)",
                    plan.table
                ),
            )],
        });
    };
    let shape = match resolve(c, p, index).await {
        Ok(s) => s,
        Err(Error::Schema(m)) => return Ok(vec![(false, m)]),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for col in &catalog {
        let name = &col.name;
        if col.generated {
            out.push((true, format!("column `{name}` of {} is generated: left out of every write (PostgreSQL computes it; the source's value is ignored)", plan.table)));
        } else if col.identity_always && shape.columns.iter().any(|c| c.name.as_str() == name) {
            out.push((true, format!("column `{name}` of {} is GENERATED ALWAYS AS IDENTITY: inserted with OVERRIDING SYSTEM VALUE (the source's value), never updated", plan.table)));
        } else if col.base != col.sql && shape.columns.iter().any(|c| c.name.as_str() == name) {
            out.push((true, format!("column `{name}` of {} is {} (an enum or domain), written from {}: a value the type refuses is quarantined (invalid-field) naming the column", plan.table, col.sql, col.base)));
        }
    }
    if p.interval_handling == crate::config::IntervalHandling::Numeric {
        for c in shape
            .columns
            .iter()
            .filter(|c| c.ty.kind == super::Kind::Interval)
        {
            out.push((
                true,
                format!(
                    "warning: interval column `{}`: {}",
                    c.name.as_str(),
                    NUMERIC_INTERVAL
                ),
            ));
        }
    }
    Ok(out)
}

/// `check`'s warning about interval columns under `[source] interval-handling = "numeric"` (Debezium PostgreSQL
/// connector documentation, `interval.handling.mode`: `numeric` "represents intervals using approximate number
/// of microseconds").
pub const NUMERIC_INTERVAL: &str = "Debezium's numeric interval (interval.handling.mode = numeric, the default) is \
     approximate for months and years (a month = 30.4375 days, a year = 365.25 days): the microseconds it carries \
     are stored exactly (`1 mon` lands as 730:30:00); set interval.handling.mode = string on the connector and \
     [source] interval-handling = \"string\" to keep months and years exactly";

/// The generated columns of the existing table (left out of every write; members of `after` named like them
/// are not new columns) and its `GENERATED ALWAYS AS IDENTITY` columns (written with `OVERRIDING SYSTEM VALUE`,
/// never updated) — both empty when the table does not exist yet.
///
/// # Errors
/// [`Error::Schema`] when `columns` declares a generated column: PostgreSQL computes it and refuses a written
/// value (SQLSTATE 428C9).
fn write_rules(
    projection: &str,
    plan: &super::plan::RowPlan,
    catalog: Option<&[CatalogColumn]>,
) -> Result<(Vec<String>, Vec<String>)> {
    let cols = catalog.unwrap_or(&[]);
    let generated: Vec<String> = cols
        .iter()
        .filter(|c| c.generated)
        .map(|c| c.name.clone())
        .collect();
    if let Some(g) = plan
        .columns
        .iter()
        .flatten()
        .find(|d| generated.iter().any(|g| g == d.name.as_str()))
    {
        return Err(Error::Schema(format!(
            "row projection `{projection}`: column `{}` of {} is GENERATED ALWAYS AS (…) STORED: PostgreSQL \
             computes it and refuses a written value (SQLSTATE 428C9); leave it out of `columns` (the source's \
             value is then ignored)",
            g.name.as_str(),
            plan.table
        )));
    }
    let identity = cols
        .iter()
        .filter(|c| c.identity_always)
        .map(|c| c.name.clone())
        .collect();
    Ok((generated, identity))
}

/// `new-columns = "add"`: moves the table's columns marked [`super::evolve::MARK`] to the end of `columns` (adding
/// the ones not there) and returns how many there are. A marked column the pipeline file declares in `columns`
/// (mapped after it was added) is a declared column: it stays where it is, judged.
async fn append_added(
    c: &impl GenericClient,
    table: &QualifiedName,
    projection: &str,
    declared: &[&str],
    columns: &mut Vec<ColumnSpec>,
) -> Result<usize> {
    let rows = c
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             JOIN pg_class r ON r.oid = a.attrelid JOIN pg_namespace n ON n.oid = r.relnamespace \
             WHERE n.nspname = $1 AND r.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
             AND col_description(r.oid, a.attnum) = $3 ORDER BY a.attnum",
            &[
                &table.schema.as_str(),
                &table.name.as_str(),
                &super::evolve::MARK,
            ],
        )
        .await?;
    let mut added = Vec::new();
    for r in &rows {
        let (name, ty): (String, String) = (r.get(0), r.get(1));
        if declared.contains(&name.as_str()) {
            continue;
        }
        let bad = |m: String| {
            Error::Schema(format!(
                "row projection `{projection}`: added column {name}: {m}"
            ))
        };
        added.push(ColumnSpec {
            name: Ident::new(&name).map_err(bad)?,
            ty: SqlType::parse(&ty).map_err(bad)?,
            unit: None,
            field: None,
        });
    }
    columns.retain(|c| !added.iter().any(|a| a.name == c.name));
    let n = added.len();
    columns.extend(added);
    Ok(n)
}

/// DDL for a row projection: the table (when `columns` are declared) or the bookkeeping columns added to an
/// existing one, the tombstone table, and the conflicts table. Idempotent.
///
/// # Errors
/// As [`resolve`], and [`Error::Postgres`].
pub async fn setup(c: &impl GenericClient, p: &Pipeline, index: usize) -> Result<()> {
    let proj = &p.projections[index];
    let plan = proj
        .row
        .as_ref()
        .expect("a row projection's plan holds its RowPlan");
    let t = &plan.table;
    let deleted = if plan.tombstones == TombstoneMode::Column {
        ", _deleted_at timestamptz"
    } else {
        ""
    };
    let exec = |sql: String| async move {
        c.batch_execute(&sql).await.map_err(|e| {
            Error::Schema(format!(
                "setup of row projection `{}`: {e}: {sql}",
                proj.name
            ))
        })
    };
    let schema_exists = !c
        .query(
            "SELECT 1 FROM pg_namespace WHERE nspname = $1",
            &[&t.schema.as_str()],
        )
        .await?
        .is_empty();
    if !schema_exists {
        exec(format!("CREATE SCHEMA IF NOT EXISTS {}", t.schema)).await?;
    }
    if let Some(cols) = &plan.columns {
        let defs: Vec<String> = cols
            .iter()
            .map(|c| {
                let null = if plan.key.contains(&c.name) {
                    " NOT NULL"
                } else {
                    ""
                };
                format!("{} {}{null}", c.name, c.ty.sql)
            })
            .collect();
        let key: Vec<String> = plan.key.iter().map(|k| k.to_string()).collect();
        exec(format!(
            "CREATE TABLE IF NOT EXISTS {t} ({}, _version bigint[] NOT NULL, _sha256 bytea NOT NULL, _delivery text, \
             _updated_at timestamptz NOT NULL DEFAULT now(){deleted}, _position bigint[], PRIMARY KEY ({}))",
            defs.join(", "),
            key.join(", ")
        ))
        .await?;
    } else {
        exec(format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS _version bigint[], ADD COLUMN IF NOT EXISTS _sha256 bytea, \
             ADD COLUMN IF NOT EXISTS _delivery text, ADD COLUMN IF NOT EXISTS _updated_at timestamptz DEFAULT now(){}",
            if deleted.is_empty() { "" } else { ", ADD COLUMN IF NOT EXISTS _deleted_at timestamptz" }
        ))
        .await?;
    }
    // The source position of the change that wrote each state (tables made before it was kept get the column).
    exec(format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS _position bigint[]"
    ))
    .await?;
    // The version of the write whose values a deleted row keeps (`tombstones = "column"`; tables made before it
    // get it, their deleted rows count theirs at their own version: `state::kept_since`).
    if plan.tombstones == TombstoneMode::Column {
        exec(format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS _last_version bigint[]"
        ))
        .await?;
    }
    // Primary-key changes whose new-key columns wait for the old key's values (tables made before it get it):
    // `{"key": [old key texts], "lsn": change LSN, "columns": [names]}`, looked up by old key when its delete
    // applies.
    let unresolved = crate::projection::outbox::index_name(t, "_unresolved");
    exec(format!(
        "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {UNRESOLVED} jsonb"
    ))
    .await?;
    exec(format!(
        "CREATE INDEX IF NOT EXISTS \"{unresolved}\" ON {t} (({UNRESOLVED} -> 'key')) WHERE {UNRESOLVED} IS NOT NULL"
    ))
    .await?;
    if plan.new_columns == NewColumns::Extra {
        exec(format!(
            "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {EXTRA} jsonb"
        ))
        .await?;
    }
    let shape = resolve(c, p, index).await?;
    if plan.tombstones == TombstoneMode::Column {
        refuse_not_null(c, &proj.name, &shape, t).await?;
    }
    if plan.tombstones == TombstoneMode::Table {
        let defs: Vec<String> = shape
            .key
            .iter()
            .map(|&i| {
                format!(
                    "{} {} NOT NULL",
                    shape.columns[i].name, shape.columns[i].ty.sql
                )
            })
            .collect();
        let key: Vec<String> = shape
            .key
            .iter()
            .map(|&i| shape.columns[i].name.to_string())
            .collect();
        exec(format!(
            "CREATE TABLE IF NOT EXISTS {} ({}, _version bigint[] NOT NULL, _delivery text, \
             _deleted_at timestamptz NOT NULL DEFAULT now(), _last jsonb, _position bigint[], _last_version bigint[], \
             PRIMARY KEY ({}))",
            plan.tombstone_table,
            defs.join(", "),
            key.join(", ")
        ))
        .await?;
        exec(format!(
            "ALTER TABLE {} ADD COLUMN IF NOT EXISTS _position bigint[], ADD COLUMN IF NOT EXISTS _last_version bigint[]",
            plan.tombstone_table
        ))
        .await?;
    }
    exec(create_conflicts(p)).await?;
    exec(super::history::create_versions(p)).await?;
    exec(format!(
        "CREATE TABLE IF NOT EXISTS {} (projection text NOT NULL, version bigint[] NOT NULL, topic text NOT NULL, \
         partition integer NOT NULL, \"offset\" bigint NOT NULL, applied_at timestamptz NOT NULL DEFAULT now(), \
         PRIMARY KEY (projection, version))",
        p.table(TRUNCATES)
    ))
    .await?;
    Ok(())
}

/// Refuses `tombstones = "column"` on a table whose non-key columns are `NOT NULL`: the tombstone of an entity
/// never seen (its delete arrives before its create — from another partition, or the create is past the topic's
/// retention) is a row with only its key, which such a table rejects — the delete would be quarantined and a later
/// older insert would resurrect the row.
async fn refuse_not_null(
    c: &impl GenericClient,
    projection: &str,
    shape: &Shape,
    table: &QualifiedName,
) -> Result<()> {
    let rows = c
        .query(
            "SELECT a.attname::text FROM pg_attribute a JOIN pg_class r ON r.oid = a.attrelid \
             JOIN pg_namespace n ON n.oid = r.relnamespace WHERE n.nspname = $1 AND r.relname = $2 \
             AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull ORDER BY a.attnum",
            &[&table.schema.as_str(), &table.name.as_str()],
        )
        .await?;
    let keys: Vec<&str> = shape
        .key
        .iter()
        .map(|&i| shape.columns[i].name.as_str())
        .collect();
    let bad: Vec<String> = rows
        .iter()
        .map(|r| r.get::<_, String>(0))
        .filter(|n| {
            shape.columns.iter().any(|c| c.name.as_str() == n) && !keys.contains(&n.as_str())
        })
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    Err(Error::Schema(format!(
        "row projection `{projection}`: tombstones = \"column\" keeps a row with only its key for an entity deleted \
         before it was seen, but column(s) {} of {table} are NOT NULL; drop the constraint (ALTER TABLE {table} ALTER \
         COLUMN … DROP NOT NULL) or use tombstones = \"table\"",
        bad.join(", ")
    )))
}

/// `CREATE TABLE` for `replaysafe_conflicts`: one row per change that claimed a stored version with a different
/// row state.
pub fn create_conflicts(p: &Pipeline) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (id bigserial PRIMARY KEY, projection text NOT NULL, table_name text NOT NULL, \
         entity jsonb NOT NULL, version bigint[] NOT NULL, stored_delivery text, incoming_delivery text, \
         stored_sha256 bytea, incoming_sha256 bytea NOT NULL, stored jsonb, incoming jsonb NOT NULL, \
         topic text NOT NULL, partition integer NOT NULL, \"offset\" bigint NOT NULL, consumer_group text NOT NULL, \
         detected_at timestamptz NOT NULL DEFAULT now(), UNIQUE (projection, entity, version, incoming_sha256))",
        p.table(CONFLICTS)
    )
}
