//! The README's library snippet (crates/cli/tests/readme.rs keeps the two the same).
use redrive_policy::Outcome;
use redrive_runtime::{Attempted, JobContext, Worker, typed};
use redrive_store::{Clock, NewJob, SqliteStore, Store, SystemClock};

#[derive(serde::Deserialize)]
struct Charge {
    amount: u64,
    currency: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args().nth(1).unwrap_or("sqlite:shop.db".into());
    let sqlite = SqliteStore::connect(&url).await?;

    // Transactional enqueue: the order and its charge commit together, or neither does.
    let mut tx = sqlite.pool().begin().await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER)")
        .execute(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO orders (id, amount) VALUES ('order-42', 1000)")
        .execute(&mut *tx)
        .await?;
    let job = NewJob::new(
        "payments",
        "charge",
        serde_json::json!({"amount": 1000, "currency": "EUR"}),
    )
    .key("order-42") // the same queue and key again: the same job
    .dependency("psp"); // one breaker, pause and rate limit per PSP, for the whole fleet
    sqlite.enqueue_in(&mut tx, &job, SystemClock.now()).await?;
    tx.commit().await?;

    let charge = typed(|c: Charge, ctx: JobContext| async move {
        // Call the PSP here with ctx.key as its Idempotency-Key; map its answer to an outcome.
        if c.amount == 0 {
            return Attempted::failure(Outcome::Permanent, "amount must be positive");
        }
        let key = ctx.key.unwrap_or_default();
        println!("charged {} {} for {key}", c.amount, c.currency);
        Attempted::success(serde_json::json!({"charge": "ch_1"}))
    });
    let worker = Worker::builder(Store::Sqlite(sqlite), vec!["payments".into()])
        .handler("charge", charge)
        .concurrency(16)
        .build()?; // refuses a setting out of its bounds, naming it
    // A service runs `worker.run(stop)` until SIGTERM cancels `stop` (a CancellationToken):
    // running attempts finish, the rest go back to the queue.
    let summary = worker.run_until_idle().await?;
    println!("{} succeeded, {} dead", summary.succeeded, summary.dead);
    Ok(())
}
