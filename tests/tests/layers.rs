//! The translator's and the monitor's modules import one way (#39, "Layout"; #56, the path
//! recorder's stages): no cycle among the files of `translator/src` or of `monitor/src`,
//! counting every `crate::…` and `super::…` path in a file's code (comments and `#[cfg(test)]`
//! modules left out) as an import of the module it names. A cycle is reported with the names
//! each edge uses, so the type to move is plain.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`emit`, `linux::signals`, `` for lib.rs) → its source, tests cut off, for the
/// crate whose `src` is `crate_dir/src` (relative to the workspace).
fn modules(crate_dir: &str) -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .join(crate_dir)
        .join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a crate's src") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).unwrap().with_extension("");
            let name = rel
                .to_string_lossy()
                .replace('/', "::")
                .trim_end_matches("::mod")
                .to_string();
            let name = if name == "lib" { String::new() } else { name };
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let code: String = code
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            out.insert(name, code);
        }
    }
    out
}

/// The `a::b::c` paths after each occurrence of `prefix` in `code`.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        let tail = &rest[at + prefix.len()..];
        let len = tail
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(tail.len());
        if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            out.push(tail[..len].trim_end_matches(':'));
        }
        rest = &tail[len..];
    }
    out
}

/// The longest module that `path` (from the crate root) starts with.
fn resolve(mods: &BTreeSet<String>, path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|m| mods.contains(m))
}

/// `crate_dir`'s modules, and its imports: (from, to) → the names `from` uses of `to`.
#[allow(clippy::type_complexity)]
fn imports(
    crate_dir: &str,
) -> (
    BTreeSet<String>,
    BTreeMap<(String, String), BTreeSet<String>>,
) {
    let sources = modules(crate_dir);
    let mods: BTreeSet<String> = sources.keys().cloned().collect();
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (m, code) in &sources {
        let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
        let mut targets = Vec::new();
        for p in paths_after(code, "crate::") {
            targets.push(p.to_string());
        }
        for p in paths_after(code, "super::") {
            targets.push(if parent.is_empty() {
                p.to_string()
            } else {
                format!("{parent}::{p}")
            });
        }
        for t in targets {
            if let Some(to) = resolve(&mods, &t).filter(|to| to != m) {
                let name = t.rsplit("::").next().unwrap_or_default().to_string();
                edges.entry((m.clone(), to)).or_default().insert(name);
            }
        }
    }
    (mods, edges)
}

/// The import cycles among `crate_dir`'s modules, each described edge by edge (none: `[]`).
fn import_cycles(crate_dir: &str) -> Vec<String> {
    let (mods, edges) = imports(crate_dir);
    // A module reaches itself through the import graph: a cycle.
    let mut cycles = Vec::new();
    for start in &mods {
        let mut seen = BTreeSet::new();
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        while let Some((at, path)) = stack.pop() {
            for ((from, to), _) in edges.range((at.clone(), String::new())..) {
                if from != &at {
                    break;
                }
                if to == start {
                    let mut cycle = path.clone();
                    cycle.push(to.clone());
                    cycles.push(cycle);
                } else if seen.insert(to.clone()) {
                    let mut p = path.clone();
                    p.push(to.clone());
                    stack.push((to.clone(), p));
                }
            }
        }
        if !cycles.is_empty() {
            break;
        }
    }
    cycles
        .iter()
        .map(|c| {
            c.windows(2)
                .map(|w| {
                    let names = &edges[&(w[0].clone(), w[1].clone())];
                    format!("{} -> {} ({names:?})", w[0], w[1])
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect()
}

#[test]
fn translator_modules_import_one_way() {
    let cycles = import_cycles("translator");
    assert!(
        cycles.is_empty(),
        "translator/src has import cycles:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn monitor_modules_import_one_way() {
    let cycles = import_cycles("monitor");
    assert!(
        cycles.is_empty(),
        "monitor/src has import cycles:\n{}",
        cycles.join("\n")
    );
}

/// The translator's folders, from the bottom: a module may import modules of its own folder
/// and of folders before it, never of one after it (docs/design.md, "The translator's
/// layers"). `lib.rs` is above them all.
const TRANSLATOR_FOLDERS: [&str; 7] = [
    "host", "frontend", "cache", "backend", "persist", "linux", "runtime",
];

#[test]
fn translator_folders_import_down_the_layers() {
    let (_, edges) = imports("translator");
    let rank = |m: &str| {
        let folder = m.split("::").next().unwrap_or_default();
        TRANSLATOR_FOLDERS.iter().position(|&f| f == folder)
    };
    let up: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| match (rank(from), rank(to)) {
            (Some(a), Some(b)) => a < b,
            _ => false,
        })
        .map(|((from, to), names)| format!("{from} -> {to} ({names:?})"))
        .collect();
    assert!(
        up.is_empty(),
        "translator/src imports up its folders' order {TRANSLATOR_FOLDERS:?}:\n{}",
        up.join("\n")
    );
    // Every folder of translator/src is in the order.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .join("translator/src");
    for entry in std::fs::read_dir(&root).expect("translator/src") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(
                TRANSLATOR_FOLDERS.contains(&name.as_str()),
                "translator/src/{name} is in no layer"
            );
        }
    }
}
