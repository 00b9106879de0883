//! The database probe behind `/readyz` (`/readyz` rule 3 of `health.rs`): every [`PROBE_EVERY`], on its own
//! connection, a statement that writes nothing and fails when the session cannot write the checkpoints.

use std::sync::Arc;

use crate::config::Pipeline;
use crate::health::{probed, PROBE_EVERY, PROBE_TIMEOUT};
use crate::sink::checkpoint::CHECKPOINTS;

/// The probe statement (module docs): writes nothing, fails when the session cannot write the checkpoints.
pub fn probe_sql(p: &Pipeline) -> String {
    format!(
        "UPDATE {} SET fence = fence WHERE false",
        p.table(CHECKPOINTS)
    )
}

/// Starts the database probe on `rt`: every [`PROBE_EVERY`] on its own connection (reconnected after a
/// failure), each connect and statement bounded by [`PROBE_TIMEOUT`]. Runs until the runtime stops.
pub fn spawn_probe(rt: &tokio::runtime::Handle, pipeline: Arc<Pipeline>, url: String) {
    rt.spawn(async move {
        let sql = probe_sql(&pipeline);
        let mut client = None;
        loop {
            let r = probe_once(&mut client, &url, &sql).await;
            if let Err(e) = &r {
                tracing::debug!("database probe failed: {e}");
                client = None;
            }
            probed(r.err());
            tokio::time::sleep(PROBE_EVERY).await;
        }
    });
}

async fn probe_once(
    client: &mut Option<tokio_postgres::Client>,
    url: &str,
    sql: &str,
) -> Result<(), String> {
    let bounded = async {
        if client
            .as_ref()
            .is_none_or(tokio_postgres::Client::is_closed)
        {
            *client = Some(crate::sink::connect(url).await.map_err(|e| e.to_string())?);
        }
        let c = client.as_ref().expect("connected just above");
        c.batch_execute(sql)
            .await
            .map_err(|e| crate::model::describe(&e))
    };
    match tokio::time::timeout(PROBE_TIMEOUT, bounded).await {
        Ok(r) => r,
        Err(_) => Err(format!("no answer within {} s", PROBE_TIMEOUT.as_secs())),
    }
}
