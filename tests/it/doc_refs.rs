//! The documentation's cross references hold (no services): every `README "…"` / `docs/<page>.md "…"` named in
//! the code, scripts, examples and reference files points at a heading that exists, and every link between
//! README.md, ARCHITECTURE.md and the `docs/` pages reaches an existing file and heading.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The markdown pages cross references may name: README.md, ARCHITECTURE.md and every `docs/*.md`.
fn pages() -> Vec<String> {
    let mut out = vec!["README.md".to_string(), "ARCHITECTURE.md".to_string()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("a docs/ folder")
        .map(|e| {
            e.expect("a docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// The headings (`##` and deeper) of a markdown text, outside code fences.
fn headings(text: &str) -> Vec<String> {
    let mut fence = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with("##") {
            let t = line.trim_start_matches('#');
            if let Some(t) = t.strip_prefix(' ') {
                out.push(t.to_string());
            }
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Whether `name` names `heading`: the whole heading, or its part before `: ` or ` (`
/// (`"Bounded waits"` names "Bounded waits: PostgreSQL timeouts and shutdown").
fn names(name: &str, heading: &str) -> bool {
    heading == name
        || heading
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with(": ") || rest.starts_with(" ("))
}

/// The text with Rust string continuations (`\` + newline + indentation) and comment continuations (a newline,
/// indentation and `///`, `//!`, `//` or `#`) joined, so a reference wrapped over two lines reads as one.
fn joined(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(['\\', '\n']) {
        out.push_str(&rest[..i]);
        let (c, after) = (&rest[i..i + 1], &rest[i + 1..]);
        let trimmed = after.trim_start_matches([' ', '\t']);
        if c == "\\" && after.starts_with('\n') {
            rest = after[1..].trim_start_matches([' ', '\t']);
        } else if c == "\n" {
            let mut next = trimmed;
            for marker in ["///", "//!", "//", "#"] {
                if let Some(n) = trimmed.strip_prefix(marker) {
                    next = n.trim_start_matches(' ');
                    break;
                }
            }
            out.push(if next.len() != trimmed.len() {
                ' '
            } else {
                '\n'
            });
            rest = if next.len() != trimmed.len() {
                next
            } else {
                after
            };
        } else {
            out.push_str(c);
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The `(page, heading)` references of a text: `README "H"`, `README's "H"`, `README, "H"` and the same with
/// `docs/<page>.md`; also `(page, "")` for a `docs/<page>.md` named without a heading.
fn references(text: &str) -> Vec<(String, String)> {
    let text = joined(text).replace("\\\"", "\"");
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(['R', 'd']).map(|i| i + at) {
        at = i + 1;
        let rest = &text[i..];
        let page = if rest.starts_with("README")
            && !text[..i].ends_with(|c: char| c.is_alphanumeric() || c == '/')
        {
            "README.md".to_string()
        } else if let Some(tail) = rest.strip_prefix("docs/") {
            let stem: String = tail
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
                .collect();
            if stem.is_empty() || !tail[stem.len()..].starts_with(".md") {
                continue;
            }
            format!("docs/{stem}.md")
        } else {
            continue;
        };
        let mut after = &rest[if page == "README.md" { 6 } else { page.len() }..];
        if page == "README.md" && after.starts_with(".md") {
            after = &after[3..];
        }
        let after = after
            .strip_prefix("'s")
            .or_else(|| after.strip_prefix(','))
            .unwrap_or(after);
        let heading = after.strip_prefix(" \"").and_then(|q| {
            q.find('"')
                .map(|end| q[..end].split_whitespace().collect::<Vec<_>>().join(" "))
        });
        match heading {
            Some(h) => out.push((page, h)),
            None if page != "README.md" => out.push((page, String::new())),
            None => {}
        }
    }
    out
}

/// The files whose text may name the docs: sources, scripts, tests, examples, benches and the reference files.
fn scanned() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries {
            let p = e.expect("a directory entry").path();
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if p.is_dir() {
                // Hidden directories (`.git`, the chaos harness's `bench/.venv`) hold no text of ours.
                if !name.starts_with('.')
                    && !matches!(
                        name.as_str(),
                        "fixtures" | "results" | "runs" | "target" | "lib"
                    )
                {
                    walk(&p, out);
                }
            } else if !name.contains('.')
                || [".rs", ".toml", ".py", ".sh", ".xml"]
                    .iter()
                    .any(|x| name.ends_with(x))
            {
                out.push(p);
            }
        }
    }
    let mut out = vec![
        root().join("reference.toml"),
        root().join("reference-debezium.toml"),
        root().join("ARCHITECTURE.md"),
    ];
    for d in [
        "src",
        "scripts",
        "tests",
        "examples",
        "benches",
        "bench",
        ".ci",
        "kafka",
        "debezium",
        "debezium-jdbc",
        "registry",
    ] {
        walk(&root().join(d), &mut out);
    }
    out.sort();
    out
}

#[test]
fn every_readme_and_docs_reference_in_the_code_names_an_existing_heading() {
    let headings: BTreeMap<String, Vec<String>> = pages()
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(root().join(&p)).expect("a page");
            (p, headings(&text))
        })
        .collect();
    let (mut seen, mut wrong) = (0, BTreeSet::new());
    for file in scanned() {
        if file.ends_with("tests/it/doc_refs.rs") {
            continue; // this checker's own comments show the forms it reads
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let shown = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for (page, heading) in references(&text) {
            seen += 1;
            match headings.get(&page) {
                None => {
                    wrong.insert(format!("{shown}: {page} does not exist"));
                }
                Some(hs) if !heading.is_empty() && !hs.iter().any(|h| names(&heading, h)) => {
                    wrong.insert(format!("{shown}: {page} has no heading \"{heading}\""));
                }
                Some(_) => {}
            }
        }
    }
    assert!(
        seen >= 50,
        "only {seen} references found: is the scan still reading the sources?"
    );
    assert!(
        wrong.is_empty(),
        "references to missing pages or headings:\n{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_link_between_the_docs_pages_resolves() {
    let pages = pages();
    let anchors: BTreeMap<String, BTreeSet<String>> = pages
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(root().join(p)).expect("a page");
            (
                p.clone(),
                headings(&text).iter().map(|h| anchor(h)).collect(),
            )
        })
        .collect();
    let mut wrong = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(root().join(page)).expect("a page");
        let dir = Path::new(page).parent().unwrap_or(Path::new(""));
        for (n, line) in text.lines().enumerate() {
            for part in line.split("](").skip(1) {
                let Some(target) = part.split(')').next() else {
                    continue;
                };
                if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                    continue;
                }
                let (file, frag) = target.split_once('#').unwrap_or((target, ""));
                let path = if file.is_empty() {
                    PathBuf::from(page)
                } else {
                    normalize(&dir.join(file))
                };
                let key = path.display().to_string();
                if !root().join(&path).exists() {
                    wrong.push(format!("{page}:{}: {target}: no file {key}", n + 1));
                } else if !frag.is_empty() && anchors.get(&key).is_some_and(|a| !a.contains(frag)) {
                    wrong.push(format!(
                        "{page}:{}: {target}: no heading #{frag} in {key}",
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

/// `docs/../README.md` as `README.md`.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Issue 42 (a first hour's stumble): a script that runs a build reads it where cargo put it — `CARGO_TARGET_DIR`
/// when set — never a hard-coded `target/`: each script names its builds through `$TARGET`
/// (`TARGET=${CARGO_TARGET_DIR:-$ROOT/target}`), the chaos harness through `CARGO_TARGET_DIR`.
#[test]
fn scripts_find_their_builds_under_cargo_target_dir() {
    let dir = root().join("scripts");
    let mut bad = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let live: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with('#'))
            .collect();
        let builds = live
            .iter()
            .any(|(_, l)| l.contains("release/replaysafe") || l.contains("debug/replaysafe"));
        if !builds {
            continue;
        }
        checked += 1;
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".py") {
            if !text.contains("CARGO_TARGET_DIR") {
                bad.push(format!("{name}: no CARGO_TARGET_DIR"));
            }
            continue;
        }
        if !text.contains("TARGET=${CARGO_TARGET_DIR:-$ROOT/target}") {
            bad.push(format!(
                "{name}: no TARGET=${{CARGO_TARGET_DIR:-$ROOT/target}}"
            ));
        }
        for (n, l) in live {
            let hard = l.match_indices("target/").any(|(i, _)| {
                let before = &l[..i];
                !before.ends_with("$ROOT/")
                    && !before.ends_with('"')
                    && !before.ends_with('$')
                    && !before.ends_with("TARGET}/")
                    && (l[i..].starts_with("target/release/")
                        || l[i..].starts_with("target/debug/"))
            });
            if hard {
                bad.push(format!("{name}:{}: {l}", n + 1));
            }
        }
    }
    assert!(checked >= 7, "only {checked} scripts run a build");
    assert!(
        bad.is_empty(),
        "hard-coded target/ paths:\n{}",
        bad.join("\n")
    );
}
