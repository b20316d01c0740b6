//! A unified diff of two texts, line by line (`redrive policy apply` shows what a new version
//! of the policies changes): hunks of changed lines with [`CONTEXT`] lines around them, from
//! a longest common subsequence. Policies files are small; above [`MAX_CELLS`] the diff is
//! every old line removed and every new one added.

use std::fmt::Write;

/// Unchanged lines shown around each change.
const CONTEXT: usize = 3;

/// The largest `old lines × new lines` compared line by line (a table of this many cells).
const MAX_CELLS: usize = 4_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Same,
    Del,
    Add,
}

/// Each line of `old` and `new` in order, tagged kept, removed or added.
fn ops<'a>(old: &[&'a str], new: &[&'a str]) -> Vec<(Op, &'a str)> {
    let (n, m) = (old.len(), new.len());
    if n.saturating_mul(m) > MAX_CELLS {
        return old
            .iter()
            .map(|l| (Op::Del, *l))
            .chain(new.iter().map(|l| (Op::Add, *l)))
            .collect();
    }
    // lcs[i][j]: the longest common subsequence of old[i..] and new[j..].
    let mut lcs = vec![0u32; (n + 1) * (m + 1)];
    let at = |i: usize, j: usize| i * (m + 1) + j;
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[at(i, j)] = if old[i] == new[j] {
                lcs[at(i + 1, j + 1)] + 1
            } else {
                lcs[at(i + 1, j)].max(lcs[at(i, j + 1)])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let mut out = Vec::with_capacity(n + m);
    while i < n || j < m {
        if i < n && j < m && old[i] == new[j] {
            out.push((Op::Same, old[i]));
            i += 1;
            j += 1;
        } else if i < n && (j == m || lcs[at(i + 1, j)] >= lcs[at(i, j + 1)]) {
            // Removals before additions, as `diff -u` shows a changed line.
            out.push((Op::Del, old[i]));
            i += 1;
        } else {
            out.push((Op::Add, new[j]));
            j += 1;
        }
    }
    out
}

/// The unified diff from `old` (named `old_name`) to `new`; empty when they are equal.
pub(crate) fn unified(old_name: &str, old: &str, new_name: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let ops = ops(&a, &b);
    if ops.iter().all(|(op, _)| *op == Op::Same) {
        return String::new();
    }
    let mut out = format!("--- {old_name}\n+++ {new_name}\n");
    // Line numbers (1-based) of each op in the old and new texts.
    let mut pos = Vec::with_capacity(ops.len());
    let (mut ln_old, mut ln_new) = (1usize, 1usize);
    for (op, _) in &ops {
        pos.push((ln_old, ln_new));
        match op {
            Op::Same => {
                ln_old += 1;
                ln_new += 1;
            }
            Op::Del => ln_old += 1,
            Op::Add => ln_new += 1,
        }
    }
    let changed: Vec<usize> = (0..ops.len()).filter(|k| ops[*k].0 != Op::Same).collect();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = changed[k];
        // Changes closer than twice the context share a hunk.
        while k + 1 < changed.len() && changed[k + 1] <= end + 2 * CONTEXT + 1 {
            k += 1;
            end = changed[k];
        }
        let end = (end + CONTEXT + 1).min(ops.len());
        let hunk = &ops[start..end];
        let olds = hunk.iter().filter(|(op, _)| *op != Op::Add).count();
        let news = hunk.iter().filter(|(op, _)| *op != Op::Del).count();
        let (o, n) = pos[start];
        let _ = writeln!(
            out,
            "@@ -{},{olds} +{},{news} @@",
            if olds == 0 { o - 1 } else { o },
            if news == 0 { n - 1 } else { n }
        );
        for (op, line) in hunk {
            let sign = match op {
                Op::Same => ' ',
                Op::Del => '-',
                Op::Add => '+',
            };
            let _ = writeln!(out, "{sign}{line}");
        }
        k += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::unified;

    #[test]
    fn equal_texts_have_no_diff() {
        assert_eq!(unified("a", "x\ny\n", "b", "x\ny\n"), "");
    }

    #[test]
    fn a_changed_line_shows_with_its_context_and_line_numbers() {
        let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n";
        let new = "1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n";
        assert_eq!(
            unified("v1", old, "p.toml", new),
            "--- v1\n+++ p.toml\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
    }

    #[test]
    fn far_apart_changes_make_two_hunks_and_an_empty_old_text_adds_everything() {
        let old: String = (1..=20).map(|i| format!("line {i}\n")).collect();
        let new = old
            .replace("line 2\n", "two\n")
            .replace("line 19\n", "nineteen\n");
        let d = unified("a", &old, "b", &new);
        assert_eq!(d.matches("@@ ").count(), 2, "{d}");
        assert!(
            d.contains("-line 2\n+two\n") && d.contains("-line 19\n+nineteen\n"),
            "{d}"
        );
        assert_eq!(
            unified("(none)", "", "p", "x\ny\n"),
            "--- (none)\n+++ p\n@@ -0,0 +1,2 @@\n+x\n+y\n"
        );
    }
}
