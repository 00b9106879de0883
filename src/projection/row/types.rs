//! Column types of a row projection: the validated PostgreSQL type of each column ([`SqlType`], its value
//! family [`Kind`]), the epoch [`Unit`] of temporal values, and the [`ColumnSpec`] that binds a column to a field.

use crate::ident::Ident;

/// How a column's values are read and written: the PostgreSQL type (validated text used in DDL and casts) and
/// what family of values it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlType {
    /// The type as written in SQL, e.g. `numeric(12,2)`, `timestamp(3)`, `text[]`.
    pub sql: String,
    /// The value family of the type (of the element type for arrays).
    pub kind: Kind,
    /// Whether it is a one-dimensional array of `kind`.
    pub array: bool,
    /// The type modifier's first number (precision of `timestamp(p)`/`time(p)`, `numeric(p,s)`), if any.
    pub precision: Option<u32>,
    /// The scale of `numeric(p,s)`, if any.
    pub scale: Option<u32>,
}

/// Families of PostgreSQL types, by how a Debezium value is converted to their text input form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// smallint, integer, bigint.
    Integer,
    /// real, double precision.
    Float,
    /// numeric / decimal.
    Numeric,
    /// boolean.
    Boolean,
    /// text, varchar, char, citext, and anything else taken as text.
    Text,
    /// date.
    Date,
    /// timestamp without time zone.
    Timestamp,
    /// timestamptz.
    Timestamptz,
    /// time without time zone.
    Time,
    /// json / jsonb.
    Json,
    /// uuid.
    Uuid,
    /// bytea.
    Bytea,
    /// interval (Debezium `MicroDuration` µs, or an ISO 8601 string with `interval.handling.mode=string`).
    Interval,
}

impl SqlType {
    /// Parses a type name as PostgreSQL's `format_type()` prints it (or as a user writes it in the pipeline file).
    ///
    /// # Errors
    /// A message when the text is not a plain type name with an optional `(p[,s])` modifier and `[]`.
    pub fn parse(raw: &str) -> std::result::Result<SqlType, String> {
        let t = raw.trim().to_ascii_lowercase();
        let (base, array) = match t.strip_suffix("[]") {
            Some(b) => (b.trim().to_string(), true),
            None => (t.clone(), false),
        };
        // `name(p[,s]) [tail]`, e.g. format_type's `timestamp(3) with time zone`.
        let (name, modifier, tail) = match (base.find('('), base.find(')')) {
            (Some(i), Some(j)) if j > i => (
                base[..i].trim().to_string(),
                Some(base[i + 1..j].to_string()),
                base[j + 1..].trim().to_string(),
            ),
            (None, None) => (base.clone(), None, String::new()),
            _ => return Err(format!("`{raw}` is not a type name")),
        };
        let full = if tail.is_empty() {
            name.clone()
        } else {
            format!("{name} {tail}")
        };
        if !full
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == ' ' || c == '_')
            || full.is_empty()
        {
            return Err(format!("`{raw}` is not a type name"));
        }
        let nums: Vec<u32> = match &modifier {
            None => Vec::new(),
            Some(m) => m
                .split(',')
                .map(|n| n.trim().parse::<u32>())
                .collect::<std::result::Result<_, _>>()
                .map_err(|_| format!("`{raw}`: the type modifier must be numbers"))?,
        };
        let kind = match full.as_str() {
            "smallint" | "integer" | "int" | "int2" | "int4" | "int8" | "bigint" => Kind::Integer,
            "real" | "float4" | "float8" | "double precision" => Kind::Float,
            "numeric" | "decimal" => Kind::Numeric,
            "boolean" | "bool" => Kind::Boolean,
            "date" => Kind::Date,
            "timestamp" | "timestamp without time zone" => Kind::Timestamp,
            "timestamptz" | "timestamp with time zone" => Kind::Timestamptz,
            "time" | "time without time zone" => Kind::Time,
            "json" | "jsonb" => Kind::Json,
            "uuid" => Kind::Uuid,
            "bytea" => Kind::Bytea,
            "interval" => Kind::Interval,
            "text"
            | "varchar"
            | "character varying"
            | "character"
            | "char"
            | "bpchar"
            | "citext"
            | "name"
            | "inet"
            | "cidr"
            | "macaddr"
            | "money"
            | "xml"
            | "timetz"
            | "time with time zone"
            | "bit"
            | "bit varying"
            | "varbit" => Kind::Text,
            other => return Err(format!("unsupported column type `{other}`")),
        };
        let bad_modifier = match kind {
            Kind::Numeric => {
                nums.len() > 2
                    || nums.first().is_some_and(|p| !(1..=1000).contains(p))
                    || matches!((nums.first(), nums.get(1)), (Some(p), Some(s)) if s > p)
            }
            Kind::Timestamp | Kind::Timestamptz | Kind::Time | Kind::Interval => {
                nums.len() > 1 || nums.first().is_some_and(|p| *p > 6)
            }
            Kind::Text => {
                nums.len() > 1 || nums.first().is_some_and(|n| !(1..=10_485_760).contains(n))
            }
            _ => !nums.is_empty(),
        };
        if bad_modifier {
            return Err(format!("`{raw}`: invalid type modifier"));
        }
        Ok(SqlType {
            sql: t,
            kind,
            array,
            precision: nums.first().copied(),
            scale: nums.get(1).copied(),
        })
    }
}

impl SqlType {
    /// A column type read from the catalog: `sql` is `format_type()`'s spelling of the column's type (quoted and
    /// schema-qualified by PostgreSQL itself as the session's `search_path` needs: used as is in casts), `base`
    /// the type whose input the values take — the column's own type, an enum's `text` (an enum's labels are
    /// text; PostgreSQL casts text to the enum and refuses a label it lacks, SQLSTATE 22P02), a domain's base
    /// type (its constraints are checked by the cast, SQLSTATE 23514) — with `[]` for arrays.
    ///
    /// # Errors
    /// As [`SqlType::parse`] for `base`.
    pub fn catalog(sql: &str, base: &str) -> std::result::Result<SqlType, String> {
        let mut t = SqlType::parse(base)?;
        if sql != base {
            t.sql = sql.to_string();
        }
        Ok(t)
    }
}

/// Unit of an integer temporal value in a schemaless Debezium message (with schemas the Connect schema name
/// says it: `io.debezium.time.MicroTimestamp` is µs, `Timestamp` ms, `NanoTimestamp` ns, `Date` days).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Days since 1970-01-01 (dates).
    Days,
    /// Milliseconds.
    Millis,
    /// Microseconds.
    Micros,
    /// Nanoseconds.
    Nanos,
}

/// One column of a row projection.
#[derive(Debug, Clone)]
pub struct ColumnSpec {
    /// Column name.
    pub name: Ident,
    /// Its type.
    pub ty: SqlType,
    /// Unit of integer temporal values in schemaless messages; default: from the type (date: days;
    /// `timestamp(p)`/`time(p)` with p ≤ 3: ms, otherwise µs — Debezium's `time.precision.mode=adaptive`).
    pub unit: Option<Unit>,
    /// JSON mode: the field this column is taken from.
    pub field: Option<usize>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_types_as_format_type_prints_them() {
        let t = SqlType::parse("timestamp(6) without time zone").unwrap();
        assert_eq!(
            (t.kind, t.precision, t.array),
            (Kind::Timestamp, Some(6), false)
        );
        let t = SqlType::parse("timestamp(3) with time zone").unwrap();
        assert_eq!((t.kind, t.precision), (Kind::Timestamptz, Some(3)));
        let t = SqlType::parse("numeric(12,2)").unwrap();
        assert_eq!(
            (t.kind, t.precision, t.scale),
            (Kind::Numeric, Some(12), Some(2))
        );
        let t = SqlType::parse("text[]").unwrap();
        assert_eq!((t.kind, t.array), (Kind::Text, true));
        assert_eq!(
            SqlType::parse("character varying(20)").unwrap().kind,
            Kind::Text
        );
        for bad in [
            "numeric(5,2,1)",
            "varchar(0)",
            "numeric(1000,2000)",
            "timestamp(7)",
            "int; drop table x",
            "numeric(1",
            "text)",
            "numeric(a)",
            "",
            "geometry",
        ] {
            assert!(SqlType::parse(bad).is_err(), "{bad}");
        }
    }

    /// Catalog types: an enum is written as its own (qualified, quoted) type from text, a domain from its base
    /// type, arrays of them as arrays; a base replaysafe cannot convert is refused.
    #[test]
    fn catalog_types_keep_their_name_and_take_the_base_kind() {
        let t = SqlType::catalog("\"S\".product_status", "text").unwrap();
        assert_eq!(
            (t.sql.as_str(), t.kind, t.array),
            ("\"S\".product_status", Kind::Text, false)
        );
        let t = SqlType::catalog("s.cents", "numeric(12,2)").unwrap();
        assert_eq!((t.kind, t.scale), (Kind::Numeric, Some(2)));
        let t = SqlType::catalog("s.product_status[]", "text[]").unwrap();
        assert_eq!(
            (t.kind, t.array, t.sql.as_str()),
            (Kind::Text, true, "s.product_status[]")
        );
        assert_eq!(SqlType::catalog("jsonb", "jsonb").unwrap().kind, Kind::Json);
        assert!(SqlType::catalog("s.shape", "geometry").is_err());
    }
}
