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
