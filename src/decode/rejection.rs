//! Why a record is quarantined: the [`Reason`] category and the [`Rejection`] with its detail.

/// Why a record was quarantined; the `reason` column of `replaysafe_dead_letters` and the `reason` metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// The value is a Kafka null (a tombstone) on a topic of JSON events.
    NullValue,
    /// The value is larger than `batch.max-record-bytes`.
    Oversize,
    /// The value is not JSON (or not a JSON object).
    InvalidJson,
    /// A non-optional field is missing or null.
    MissingField,
    /// A field has the wrong type or an invalid value (bad UUID, bad date, …).
    InvalidField,
    /// The event's partition-by day is older than the ledger horizon: its ledger partition may be gone.
    BeyondHorizon,
    /// The event's partition-by day is later than the database's UTC date + `[ledger] future-days`: a record
    /// of such a day would create a ledger partition of its own (one DDL per day: a clock bug in a producer could
    /// create thousands).
    FutureDay,
    /// A filter expression failed to evaluate on this record.
    FilterError,
    /// PostgreSQL rejected the record's values (a data exception or constraint, found by replaying the batch
    /// record by record).
    RejectedByDatabase,
    /// A Debezium record flattened by the `ExtractNewRecordState` transform (the row alone, no change envelope).
    Flattened,
    /// The record's value (or key) could not be decoded before it reached replaysafe: a `kcat -J` dump line
    /// with `payload_error` (or `key_error`) — kcat's message is the detail —, or a dump line whose bytes are
    /// not UTF-8 (`load --quarantine-invalid-utf8`; the dead letter's value is the whole line).
    UndecodableValue,
    /// A schema-registry frame (magic byte 0x00 + schema id) the pipeline cannot read: a frame where plain JSON
    /// is expected, a truncated frame, an unknown schema id, or data that does not match its schema (case C41).
    SchemaRegistry,
    /// The schema registry could not be reached within `--connect-timeout`: never a dead letter — the engine
    /// stops (exit 1) before applying the record, like an unreachable database.
    RegistryUnavailable,
}

impl Reason {
    /// Every reason (the `reason` labels `/metrics` registers at zero on start).
    pub const ALL: [Reason; 12] = [
        Reason::NullValue,
        Reason::Oversize,
        Reason::InvalidJson,
        Reason::MissingField,
        Reason::InvalidField,
        Reason::BeyondHorizon,
        Reason::FutureDay,
        Reason::FilterError,
        Reason::RejectedByDatabase,
        Reason::Flattened,
        Reason::UndecodableValue,
        Reason::SchemaRegistry,
    ];

    /// Stable kebab-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NullValue => "null-value",
            Reason::Oversize => "oversize",
            Reason::InvalidJson => "invalid-json",
            Reason::MissingField => "missing-field",
            Reason::InvalidField => "invalid-field",
            Reason::BeyondHorizon => "beyond-horizon",
            Reason::FutureDay => "future-day",
            Reason::FilterError => "filter-error",
            Reason::RejectedByDatabase => "rejected-by-database",
            Reason::Flattened => "flattened-record",
            Reason::UndecodableValue => "undecodable-value",
            Reason::SchemaRegistry => "schema-registry",
            Reason::RegistryUnavailable => "registry-unavailable",
        }
    }
}

/// A quarantine decision with a human-readable detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The category.
    pub reason: Reason,
    /// What exactly was wrong (field, path, value excerpt).
    pub detail: String,
}

impl Rejection {
    /// A rejection of this category with this detail.
    pub fn new(reason: Reason, detail: impl Into<String>) -> Self {
        Rejection {
            reason,
            detail: detail.into(),
        }
    }
}
