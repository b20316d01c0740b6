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

/// The job's queue is in the JSON array parameter `$n`. The unary `+` keeps the planner from
/// looking the listed queues up in the per-queue claim index (and sorting what it finds):
/// the set only filters the walk of the pending jobs in claim order.
pub(super) fn queue_in(n: u8) -> String {
    format!("+j.queue IN (SELECT value FROM json_each(${n}))")
}

/// The job's queue is not paused: an uncorrelated subquery, which SQLite reads once per
/// statement into a temporary index (paused queues' names are never NULL, but `NOT IN` with
/// a NULL in the set would match nothing, so they are left out).
pub(super) const NOT_PAUSED: &str =
    "j.queue NOT IN (SELECT pq.queue FROM redrive_paused_queues pq WHERE pq.queue IS NOT NULL)";

/// Element `k` of the JSON array parameter `$2` (a claim's queues), as text.
pub(super) fn queue_at(k: usize) -> String {
    format!("json_extract($2, '$[{k}]')")
}

/// SQLite has one writer: a claim's arms take no row locks.
pub(super) const ARM_LOCK: &str = "";

/// The claim of the jobs that `claimable` selects (the queue and kinds' filters included).
///
/// Each claimed row comes back as one JSON array of [`JOB_COLS`](crate::rows::JOB_COLS):
/// sqlx copies every value of a SQLite row into a value of its own (an allocation and a
/// free per column), which for 32 columns was a third of the store-level drain's CPU.
pub(super) fn claim(claimable: &str) -> String {
    format!(
        "UPDATE redrive_jobs SET state = 'running', lease_owner = $4, \
         lease_token = lease_token + 1, lease_expires_at = $5, updated_at = $1 \
         WHERE id IN (SELECT j.id FROM redrive_jobs j WHERE {claimable} \
           ORDER BY j.priority, j.run_at, j.id LIMIT $3) \
         RETURNING json_array({})",
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
         RETURNING json_array({})",
        crate::rows::JOB_COLS
    )
}
