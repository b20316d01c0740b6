//! The README checked against what it claims, so that it fails when the README drifts:
//!
//! - it is at most 250 lines and starts with its two commands (the demo and the test
//!   command, which `.ci/run` runs);
//! - the quickstart's commands run: each `$ ` line of its `console` block is run by bash, in a
//!   temporary directory with the built `redrive` first on `PATH`, and prints the lines the
//!   README shows under it (times, durations and claim counts masked);
//! - the library snippet and its `[dependencies]` are `examples/quickstart` byte for byte
//!   (that example is built and run by its own test);
//! - every other block of output is a figure between `<!-- figure NAME: … -->` markers that
//!   `scripts/figures.sh` knows, in the README and in docs/.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The README's length limit.
const MAX_LINES: usize = 250;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// A fenced block: its info string, its lines, and the line before its opening fence.
#[derive(Debug)]
struct Block {
    info: String,
    lines: Vec<String>,
    before: String,
    /// 1-based line of the opening fence.
    line: usize,
}

fn blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    let mut prev = "";
    for (i, l) in md.lines().enumerate() {
        match open.as_mut() {
            None if l.starts_with("```") => {
                open = Some(Block {
                    info: l.trim_start_matches('`').trim().to_owned(),
                    lines: Vec::new(),
                    before: prev.to_owned(),
                    line: i + 1,
                });
            }
            None => {}
            Some(_) if l.starts_with("```") => out.push(open.take().unwrap()),
            Some(b) => b.lines.push(l.to_owned()),
        }
        prev = l;
    }
    assert!(open.is_none(), "an unclosed code fence");
    out
}

/// The one block whose preceding line starts with `marker`.
fn marked<'a>(all: &'a [Block], marker: &str) -> &'a Block {
    let found: Vec<&Block> = all
        .iter()
        .filter(|b| b.before.starts_with(marker))
        .collect();
    assert_eq!(found.len(), 1, "one block after {marker:?} in the README");
    found[0]
}

#[test]
fn readme_is_short_and_starts_with_its_two_commands() {
    let readme = read("README.md");
    let n = readme.lines().count();
    assert!(
        n <= MAX_LINES,
        "README.md has {n} lines, more than {MAX_LINES}"
    );
    let first = &blocks(&readme)[0];
    assert_eq!(first.info, "sh");
    let commands: Vec<&str> = first
        .lines
        .iter()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(
        commands,
        ["cargo run --release -- demo", "cargo test --workspace"]
    );
    // CI runs exactly the README's test command.
    let ci = read(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == "cargo test --workspace"),
        ".ci/run does not run `cargo test --workspace`"
    );
    // No hidden doc-test lines, nor a block the checks below do not know.
    for b in blocks(&readme) {
        assert!(
            !b.lines
                .iter()
                .any(|l| l.starts_with("# ") && b.info.starts_with("rust")),
            "README.md line {}: a Rust block shows a hidden doc-test line",
            b.line
        );
    }
}

/// The library snippet is examples/quickstart's `src/main.rs` (without its leading `//!`
/// lines), and its `[dependencies]` block that example's, with `../redrive/crates/` for the
/// example's `../../crates/`.
#[test]
fn library_snippet_is_the_quickstart_example() {
    let readme = read("README.md");
    let all = blocks(&readme);

    let code = marked(&all, "<!-- library:");
    assert_eq!(code.info, "rust");
    let main = read("examples/quickstart/src/main.rs");
    let main: Vec<&str> = main.lines().skip_while(|l| l.starts_with("//!")).collect();
    assert_eq!(
        code.lines, main,
        "the README's library snippet differs from examples/quickstart/src/main.rs"
    );

    let deps = marked(&all, "<!-- library-deps:");
    assert_eq!(deps.info, "toml");
    let manifest = read("examples/quickstart/Cargo.toml");
    let start = manifest
        .find("[dependencies]")
        .expect("examples/quickstart/Cargo.toml has [dependencies]");
    let end = manifest.find("[lints]").unwrap_or(manifest.len());
    let expected: Vec<String> = manifest[start..end]
        .trim_end()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.replace("\"../../crates/", "\"../redrive/crates/"))
        .collect();
    assert_eq!(
        deps.lines, expected,
        "the README's [dependencies] differ from examples/quickstart/Cargo.toml's"
    );
}

/// One `$ ` command of the quickstart and the lines the README shows under it.
#[derive(Debug)]
struct Step {
    command: String,
    output: Vec<String>,
}

fn steps(block: &Block) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut continued = false;
    for l in &block.lines {
        if continued {
            let s = out.last_mut().unwrap();
            s.command.push('\n');
            s.command.push_str(l);
            continued = l.ends_with('\\');
        } else if let Some(c) = l.strip_prefix("$ ") {
            out.push(Step {
                command: c.to_owned(),
                output: Vec::new(),
            });
            continued = c.ends_with('\\');
        } else {
            out.last_mut()
                .expect("the quickstart starts with a `$ ` command")
                .output
                .push(l.clone());
        }
    }
    out
}

/// Digits that change from run to run, masked: timestamps, `Nms` durations, the simulator's
/// `created_ms`, and the claim counts of `work` (an empty claim more or less); and runs of
/// spaces made one (columns are padded to the width of what is masked).
fn mask(line: &str) -> String {
    let c: Vec<char> = line.chars().collect();
    let digits = |from: usize| c[from..].iter().take_while(|x| x.is_ascii_digit()).count();
    let mut out = String::new();
    let mut i = 0;
    while i < c.len() {
        if !c[i].is_ascii_digit() || (i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_')) {
            out.push(c[i]);
            i += 1;
            continue;
        }
        let n = digits(i);
        let rest: String = c[i + n..].iter().take(40).collect();
        // 2026-12-07T16:06:24.431+00:00 and 16:06:24.937
        let time_len = {
            let t: String = c[i..].iter().take(40).collect();
            let b = t.as_bytes();
            let at = |k: usize, ch: u8| b.get(k) == Some(&ch);
            let d = |k: usize| b.get(k).is_some_and(u8::is_ascii_digit);
            if n == 4 && at(4, b'-') && at(7, b'-') && at(10, b'T') {
                Some(
                    t.find(|x: char| !(x.is_ascii_digit() || "-T:.+Z".contains(x)))
                        .unwrap_or(t.len()),
                )
            } else if n == 2 && at(2, b':') && d(3) && at(5, b':') && d(6) && at(8, b'.') {
                Some(
                    t.find(|x: char| !(x.is_ascii_digit() || ":.".contains(x)))
                        .unwrap_or(t.len()),
                )
            } else {
                None
            }
        };
        if let Some(len) = time_len {
            out.push_str("<time>");
            i += len;
        } else if rest.starts_with("ms") && !rest[2..].starts_with(|x: char| x.is_alphanumeric()) {
            out.push_str("<n>ms");
            i += n + 2;
        } else if out.ends_with("\"created_ms\":")
            || out.ends_with("claims ")
            || rest.starts_with(" empty)")
        {
            out.push_str("<n>");
            i += n;
        } else {
            out.extend(&c[i..i + n]);
            i += n;
        }
    }
    // Columns padded to the width of a masked value: one space between words.
    out.split(' ')
        .filter(|w| !w.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn mask_hides_only_what_changes_between_runs() {
    assert_eq!(
        mask("  #1 16:06:24.937 infrastructure  502      4ms token 1 retry 94ms — x → 502 "),
        "#1 <time> infrastructure 502 <n>ms token 1 retry <n>ms — x → 502"
    );
    assert_eq!(
        mask("  run at     2026-12-07T16:06:24.431+00:00"),
        "run at <time>"
    );
    assert_eq!(
        mask("attempts 2, claims 3 (2 empty)"),
        "attempts 2, claims <n> (<n> empty)"
    );
    assert_eq!(
        mask(r#"{"created_ms":1646,"id":"ch_000001"} 2/15 127.0.0.1:4010"#),
        r#"{"created_ms":<n>,"id":"ch_000001"} 2/15 127.0.0.1:4010"#
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the quickstart's commands in one bash script (so that `&`, `export` and `kill %1`
/// mean what they do in a terminal), in a temporary directory, with the built binary first on
/// `PATH`. The README's port 4010 is replaced by a free one, and back in the output. After a
/// command that ends in `&` the script waits for that port to answer, as a reader would wait
/// for the simulator's `listening on` line.
#[test]
fn quickstart_commands_run_and_print_what_the_readme_shows() {
    const README_PORT: &str = "4010";
    let readme = read("README.md");
    let all = blocks(&readme);
    let block = marked(&all, "<!-- quickstart:");
    assert_eq!(block.info, "console");
    let steps = steps(block);
    let command_lines: usize = steps.iter().map(|s| s.command.lines().count()).sum();
    assert!(
        command_lines <= 10,
        "the quickstart has {command_lines} command lines"
    );

    let port = free_port().to_string();
    let mut script = String::from("set -u\n");
    for (i, s) in steps.iter().enumerate() {
        let cmd = s.command.replace(README_PORT, &port);
        script.push_str(&format!("echo '@@step {i}'\n{cmd}\n"));
        if cmd.trim_end().ends_with('&') {
            script.push_str(&format!(
                "for _ in $(seq 100); do (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.1; done\n"
            ));
        }
    }
    script.push_str("echo '@@end'\nkill $(jobs -p) 2>/dev/null; wait\n");

    let dir = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_redrive")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for v in redrive_testkit::cli::CLEARED_ENV {
        cmd.env_remove(v);
    }
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().expect("bash runs");
    let pgid = child.id();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg(format!("-{pgid}"))
                .status();
            panic!("the quickstart did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out_reader.join().unwrap().replace(&port, README_PORT);
    let stderr = err_reader.join().unwrap();
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");

    let mut sections: Vec<Vec<String>> = Vec::new();
    for l in stdout.lines() {
        if l.starts_with("@@step ") {
            sections.push(Vec::new());
        } else if l == "@@end" {
            break;
        } else {
            sections
                .last_mut()
                .expect("output before the first step")
                .push(mask(l));
        }
    }
    assert_eq!(sections.len(), steps.len(), "{stdout}\n{stderr}");
    for (s, got) in steps.iter().zip(&sections) {
        let want: Vec<String> = s.output.iter().map(|l| mask(l)).collect();
        assert_eq!(
            &want, got,
            "`{}` printed other lines than the README shows\nstderr:\n{stderr}",
            s.command
        );
    }
}

/// Every block of output in the README is a figure between markers, and every figure marker
/// in the README and docs/ names a figure `scripts/figures.sh --list` knows, in that file.
#[test]
fn figures_are_marked_and_known_to_the_figures_script() {
    let listed = Command::new("bash")
        .arg(root().join("scripts/figures.sh"))
        .arg("--list")
        .output()
        .expect("bash runs scripts/figures.sh");
    assert!(listed.status.success(), "{listed:?}");
    let listed = String::from_utf8(listed.stdout).unwrap();
    let known: Vec<(String, String)> = listed
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            (w.next().unwrap().to_owned(), w.next().unwrap().to_owned())
        })
        .collect();

    let mut files = vec!["README.md".to_owned()];
    for e in std::fs::read_dir(root().join("docs")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".md") {
            files.push(format!("docs/{name}"));
        }
    }
    let mut seen = Vec::new();
    for f in &files {
        let text = read(f);
        let mut open: Option<String> = None;
        for (i, l) in text.lines().enumerate() {
            if let Some(rest) = l.strip_prefix("<!-- figure ") {
                assert!(open.is_none(), "{f}:{}: a figure inside a figure", i + 1);
                let name = rest.split(':').next().unwrap().to_owned();
                assert!(
                    known.iter().any(|(n, w)| *n == name && w == f),
                    "{f}:{}: figure {name:?} is not one of scripts/figures.sh's for this file",
                    i + 1
                );
                seen.push((name.clone(), f.clone()));
                open = Some(name);
            } else if l == "<!-- /figure -->" {
                assert!(
                    open.take().is_some(),
                    "{f}:{}: a closing marker alone",
                    i + 1
                );
            }
        }
        assert!(open.is_none(), "{f}: figure {open:?} is not closed");
    }
    for (name, file) in &known {
        if file.ends_with(".md") {
            assert!(
                seen.iter().any(|(n, f)| n == name && f == file),
                "scripts/figures.sh writes {name} into {file}, which has no marker for it"
            );
        } else {
            assert!(
                root().join(file).exists(),
                "{file} (figure {name}) is missing"
            );
        }
    }

    // The README's blocks: commands only, the quickstart, the library, or a figure.
    let readme = read("README.md");
    for b in blocks(&readme) {
        let marked = ["<!-- quickstart:", "<!-- library", "<!-- figure "]
            .iter()
            .any(|m| b.before.starts_with(m));
        let commands_only = b.info == "sh"
            && b.lines
                .iter()
                .all(|l| l.starts_with("cargo ") || l.starts_with("git ") || l.is_empty());
        assert!(
            marked || commands_only,
            "README.md line {}: a block that is neither commands nor checked output",
            b.line
        );
    }
}
