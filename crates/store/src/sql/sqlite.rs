//! The statements and fragments that SQLite spells its own way.

/// The set of texts in the JSON array parameter `$n`.
pub(super) fn texts(n: u8) -> String {
    format!("(SELECT value FROM json_each(${n}))")
}

/// The set of ids in the JSON array parameter `$n` (`json_each` yields integers as such).
pub(super) fn ids(n: u8) -> String {
    format!("(SELECT value FROM json_each(${n}))")
}

/// The job's kind is in the JSON array parameter `$n`.
pub(super) fn kind_in(n: u8) -> String {
    format!("j.kind IN (SELECT value FROM json_each(${n}))")
}

/// Element `k` of the JSON array parameter `$2` (a claim's queues), as text.
pub(super) fn queue_at(k: usize) -> String {
    format!("json_extract($2, '$[{k}]')")
}

/// SQLite has one writer: a claim's arms take no row locks.
pub(super) const ARM_LOCK: &str = "";

/// The claim of the jobs that `claimable` selects (the queue and kinds' filters included).
pub(super) fn claim(claimable: &str) -> String {
    format!(
        "UPDATE redrive_jobs SET state = 'running', lease_owner = $4, \
         lease_token = lease_token + 1, lease_expires_at = $5, updated_at = $1 \
         WHERE id IN (SELECT j.id FROM redrive_jobs j WHERE {claimable} \
           ORDER BY j.priority, j.run_at, j.id LIMIT $3) \
         RETURNING {}",
        crate::rows::JOB_COLS
    )
}

/// The claim of the first `$3` rows of `arms` (a `UNION ALL` of per-queue selections).
pub(super) fn claim_union(arms: &str) -> String {
    format!(
        "UPDATE redrive_jobs SET state = 'running', lease_owner = $4, \
         lease_token = lease_token + 1, lease_expires_at = $5, updated_at = $1 \
         WHERE id IN (SELECT c.id FROM ({arms}) c \
           ORDER BY c.priority, c.run_at, c.id LIMIT $3) \
         RETURNING {}",
        crate::rows::JOB_COLS
    )
}

/// When the next job of the queues in `$1` (a JSON array) may run, given its dependency's
/// pause and breaker (the scalar `MAX` of the three times).
pub(super) fn next_due() -> String {
    format!(
        "SELECT MIN(CASE WHEN d.name IS NULL THEN j.run_at ELSE MAX(j.run_at, \
    COALESCE(d.paused_until, 0), \
    CASE WHEN d.state = 'open' THEN COALESCE(d.open_until, 0) ELSE 0 END) END) \
    FROM redrive_jobs j LEFT JOIN redrive_dependencies d ON d.name = j.dependency \
    WHERE j.state IN ('scheduled', 'available', 'deferred') AND j.queue IN {} \
    AND NOT EXISTS (SELECT 1 FROM redrive_paused_queues pq WHERE pq.queue = j.queue) \
    AND (d.mode IS NULL OR d.mode <> 'forced_open')",
        texts(1)
    )
}

/// A fleet-wide pause of a dependency: the later of the stored and the new end wins.
pub(super) const PAUSE: &str = "INSERT INTO redrive_dependencies (name, paused_until, pause_reason, updated_at, version) \
                 VALUES ($1, $2, $3, $4, 1) ON CONFLICT (name) DO UPDATE SET \
                 paused_until = MAX(COALESCE(redrive_dependencies.paused_until, 0), excluded.paused_until), \
                 pause_reason = excluded.pause_reason, updated_at = excluded.updated_at, \
                 version = redrive_dependencies.version + 1";
