//! Card declines through the built binary: `redrive psp-sim --decline-rate/--decline-mix`,
//! `enqueue --quota-key`, `work`, `show` with the declines and the quota use, `quota show`,
//! and the decline rows of `policy show`.

use std::process::Output;

use redrive_testkit::cli::{Running, err_text as err, ok_text as ok, spawn_listening};

fn redrive(db: &str, args: &[&str]) -> Output {
    redrive_testkit::cli!().run_db(db, args)
}

fn sim(extra: &[&str]) -> (Running, String) {
    let mut sim = redrive_testkit::cli!().command(["psp-sim", "--addr", "127.0.0.1:0"]);
    spawn_listening(sim.args(extra), "listening on ")
}

#[test]
fn policy_show_lists_the_decline_rows_and_the_quotas() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let out = ok(&redrive(
        &db,
        &["policy", "show", "payment", "--samples", "10"],
    ));
    assert!(
        out.contains("after a card decline (retry later = 1h"),
        "{out}"
    );
    assert!(out.contains("visa 15/720h"), "{out}");
    assert!(out.contains("mastercard 10/24h + 35/720h"), "{out}");
    assert!(
        out.contains(
            "card stops after visa category 1, MAC 03, MAC 21: visa 720h, mastercard 720h \
             (a stopped card's other jobs: dead)"
        ),
        "{out}"
    );
    assert!(out.contains("card_stop"), "{out}");
    for row in [
        "visa category 1",
        "mastercard MAC 24-30",
        "update_payment_method",
        "recurring_stopped",
        "reattempt_quota",
    ] {
        assert!(out.contains(row), "{row}: {out}");
    }
}

#[test]
fn a_card_number_as_quota_key_is_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let e = err(
        &redrive(
            &db,
            &[
                "enqueue",
                "--queue",
                "q",
                "--kind",
                "noop",
                "--quota-key",
                "4111-1111-1111-1111",
            ],
        ),
        2,
    );
    assert!(e.contains("--quota-key") && e.contains("quota_key"), "{e}");
    assert!(
        e.contains("1111") && !e.contains("4111-1111"),
        "the number is not echoed: {e}"
    );
    let e = err(&redrive(&db, &["quota", "show", "4111111111111111"]), 2);
    assert!(e.contains("quota_key"), "{e}");
}

#[test]
fn a_declined_charge_shows_its_advice_and_the_cards_quota() {
    let (_sim, url) = sim(&[
        "--decline-rate",
        "1",
        "--decline-mix",
        "mc21:1",
        "--seed",
        "3",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let payload = format!(
        r#"{{"method":"POST","url":"{url}/v1/charges","body":{{"amount":500,"currency":"EUR","card":"fp_9"}},"declines":"redrive"}}"#
    );
    ok(&redrive(
        &db,
        &[
            "enqueue",
            "--queue",
            "subs",
            "--kind",
            "http",
            "--key",
            "renewal-1",
            "--quota-key",
            "fp_9",
            "--payload",
            &payload,
        ],
    ));
    ok(&redrive(
        &db,
        &[
            "work",
            "--queue",
            "subs",
            "--until-idle",
            "--allow-host",
            "loopback",
        ],
    ));
    let out = ok(&redrive(&db, &["show", "1"]));
    assert!(out.contains("dead (recurring_stopped)"), "{out}");
    assert!(out.contains("quota key  fp_9"), "{out}");
    assert!(out.contains("declines:"), "{out}");
    assert!(
        out.contains("mastercard") && out.contains("advice 21"),
        "{out}"
    );
    assert!(out.contains("quota of card key fp_9"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&ok(&redrive(&db, &["show", "1", "--json"]))).unwrap();
    assert_eq!(v["declines"][0]["advice_code"], 21);
    assert_eq!(v["declines"][0]["rule"], "recurring_stopped");
    assert_eq!(v["job"]["quota_key"], "fp_9");
    let q: serde_json::Value =
        serde_json::from_str(&ok(&redrive(&db, &["quota", "show", "fp_9", "--json"]))).unwrap();
    assert_eq!(q["key"], "fp_9");
    assert_eq!(
        q["reattempts"].as_array().unwrap().len(),
        0,
        "never reattempted"
    );
    let text = ok(&redrive(&db, &["quota", "show", "fp_9"]));
    assert!(text.contains("visa") && text.contains("0/15"), "{text}");
}

#[test]
fn a_bad_decline_mix_names_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let e = err(&redrive(&db, &["psp-sim", "--decline-mix", "visa9:1"]), 2);
    assert!(e.contains("--decline-mix"), "{e}");
    let e = err(&redrive(&db, &["psp-sim", "--decline-rate", "2"]), 2);
    assert!(e.contains("--decline-rate"), "{e}");
}

/// The keys the simulator saw on `/v1/charges` (its request log), in order.
fn charged_keys(addr: &str) -> Vec<String> {
    let r = redrive_testkit::cli::http_request(
        addr,
        "GET",
        "/_sim/requests?limit=1000",
        &[] as &[&str],
        "",
        std::time::Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    let log: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    log["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|q| q["path"] == "/v1/charges")
        .map(|q| q["key"].as_str().unwrap_or("").to_owned())
        .collect()
}

/// Issue 41 item 2: a Visa category 1 decline stops the card, not only its job. Four renewals
/// of one card key: the first is declined category 1; the simulator sees no call for the other
/// three, which are dead `card_stopped` naming the blocking decline; another card is not
/// stopped; `quota show` says so; `quota lift` (audited) lets the card's calls resume.
#[test]
fn a_category_1_decline_stops_every_job_of_the_card_until_lifted() {
    let (_sim, url) = sim(&[
        "--decline-rate",
        "1",
        "--decline-mix",
        "visa1:1",
        "--seed",
        "5",
    ]);
    let addr = url.trim_start_matches("http://").to_owned();
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite:{}", dir.path().join("q.db").display());
    let enqueue = |key: &str, card: &str| {
        let payload = format!(
            r#"{{"method":"POST","url":"{url}/v1/charges","body":{{"amount":500,"currency":"EUR","card":"{card}"}},"declines":"redrive"}}"#
        );
        ok(&redrive(
            &db,
            &[
                "enqueue",
                "--queue",
                "subs",
                "--kind",
                "http",
                "--key",
                key,
                "--quota-key",
                card,
                "--payload",
                &payload,
            ],
        ));
    };
    for i in 1..=4 {
        enqueue(&format!("renewal-{i}"), "fp_stop");
    }
    enqueue("other-1", "fp_other");
    let work = || {
        ok(&redrive(
            &db,
            &[
                "work",
                "--queue",
                "subs",
                "--until-idle",
                "--allow-host",
                "loopback",
                "--concurrency",
                "1",
            ],
        ))
    };
    work();
    let keys = charged_keys(&addr);
    assert_eq!(
        keys,
        ["renewal-1", "other-1"],
        "one call for each card, none after the stop"
    );
    let stats = |addr: &str| -> serde_json::Value {
        let r = redrive_testkit::cli::http_request(
            addr,
            "GET",
            "/_sim/stats",
            &[] as &[&str],
            "",
            std::time::Duration::from_secs(30),
        )
        .unwrap();
        serde_json::from_str(&r.body).unwrap()
    };
    assert_eq!(stats(&addr)["card_stop_attempts"], 0, "the judge saw none");
    assert!(ok(&redrive(&db, &["show", "1"])).contains("dead (do_not_retry)"));
    for id in ["2", "3", "4"] {
        let v: serde_json::Value =
            serde_json::from_str(&ok(&redrive(&db, &["show", id, "--json"]))).unwrap();
        assert_eq!(v["job"]["state"], "dead", "{v}");
        assert_eq!(v["job"]["dead_reason"], "card_stopped", "{v}");
        assert_eq!(
            v["attempts"].as_array().unwrap().len(),
            0,
            "never called: {v}"
        );
        let why = v["job"]["last_error"].as_str().unwrap_or_default();
        assert!(
            why.contains("card key fp_stop stopped until")
                && why.contains("job 1 declined visa 14 cat 1 (never_retry)"),
            "{why}"
        );
        assert_eq!(v["quota"]["card_stop"]["job_id"], 1, "{v}");
    }
    let text = ok(&redrive(&db, &["quota", "show", "fp_stop"]));
    assert!(
        text.contains("STOPPED: card key fp_stop stopped until"),
        "{text}"
    );
    assert!(text.contains("redrive quota lift fp_stop"), "{text}");
    let q: serde_json::Value =
        serde_json::from_str(&ok(&redrive(&db, &["quota", "show", "fp_stop", "--json"]))).unwrap();
    assert_eq!(q["card_stop"]["rule"], "never_retry", "{q}");
    // The other card was declined too: its own stop, set by its own job.
    let q: serde_json::Value =
        serde_json::from_str(&ok(&redrive(&db, &["quota", "show", "fp_other", "--json"]))).unwrap();
    assert_eq!(q["card_stop"]["job_id"], 5, "{q}");

    // Lifted (audited): the card's calls resume.
    let out = ok(&redrive(&db, &["quota", "lift", "fp_stop"]));
    assert!(out.starts_with("lifted: card key fp_stop"), "{out}");
    let out = ok(&redrive(&db, &["quota", "lift", "fp_stop"]));
    assert!(out.contains("was not stopped"), "{out}");
    let audit: serde_json::Value =
        serde_json::from_str(&ok(&redrive(&db, &["audit", "--json"]))).unwrap();
    let lifts: Vec<&serde_json::Value> = audit["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["action"] == "card_stop_lift")
        .collect();
    assert_eq!(lifts.len(), 2, "{audit}");
    assert_eq!(
        lifts[1]["rows"], 1,
        "the first lift lifted one stop: {audit}"
    );
    let q: serde_json::Value =
        serde_json::from_str(&ok(&redrive(&db, &["quota", "show", "fp_stop", "--json"]))).unwrap();
    assert!(q["card_stop"].is_null(), "{q}");
    let r = redrive_testkit::cli::http_request(
        &addr,
        "POST",
        "/_sim/faults",
        &["Content-Type: application/json"],
        r#"{"decline_rate": 0}"#,
        std::time::Duration::from_secs(30),
    )
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    ok(&redrive(&db, &["dead", "replay", "2"]));
    work();
    assert!(ok(&redrive(&db, &["show", "2"])).contains("succeeded"));
    assert_eq!(
        charged_keys(&addr),
        ["renewal-1", "other-1", "renewal-2"],
        "the lifted card is called again"
    );
    // A lift is the operator's decision, not the network's: the judge counts the call.
    assert_eq!(stats(&addr)["card_stop_attempts_by_card"]["fp_stop"], 1);
}
