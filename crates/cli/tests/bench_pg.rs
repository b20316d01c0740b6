//! `redrive bench` on PostgreSQL: each drain of a level (store level, ceiling, runtime) runs
//! on a schema of its own, every one of them dropped at the end, and each starts after a
//! `CHECKPOINT`.
//!
//! Uses `REDRIVE_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/test`); fails,
//! not skips, when `CI=true` and the server is unreachable.

use redrive_testkit::cli::block;

#[test]
fn each_drain_gets_a_fresh_schema_after_a_checkpoint_and_none_is_left() {
    let url = redrive_testkit::postgres_url();
    if !block(redrive_testkit::postgres_available(&url)) {
        return;
    }
    let cli = redrive_testkit::cli!();
    let child = cli
        .db_command(
            &url,
            [
                "bench",
                "--jobs",
                "300",
                "--concurrency",
                "1",
                "--concurrency",
                "4",
                "--ceiling",
                "--json",
            ],
        )
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The bench's scratch schemas are named after its process id.
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["backend"], "postgres", "{r}");
    assert_eq!(r["fresh_stores"], true, "{r}");
    assert!(r["checkpoint_error"].is_null(), "{r}");
    assert!(!stderr.contains("no checkpoint"), "{stderr}");
    let runs = r["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        // Each drain took exactly its 300 jobs (the bench fails otherwise) from its own
        // schema: the ceiling and the runtime do not find the store drain's rows.
        for k in [
            "drain_jobs_per_s",
            "ceiling_drain_jobs_per_s",
            "runtime_drain_jobs_per_s",
        ] {
            assert!(run[k].as_f64().unwrap() > 0.0, "{k}: {run}");
        }
    }
    let left: Vec<String> = block(async {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let like = format!("redrive\\_bench\\_{pid}\\_%");
        let rows: Vec<(String,)> =
            sqlx::query_as("SELECT nspname::text FROM pg_namespace WHERE nspname LIKE $1")
                .bind(like)
                .fetch_all(&pool)
                .await
                .unwrap();
        rows.into_iter().map(|r| r.0).collect()
    });
    assert!(left.is_empty(), "schemas left behind: {left:?}");
}
