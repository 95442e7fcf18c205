//! The shape of `api`'s imports, read from its sources: no two files import each other, and
//! the dashboard is a reader of the service, never imported by it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a source file (`dashboard/mod.rs` → `dashboard`, `lib.rs` → ``).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts.join("::")
}

/// The text of a file before its test module (tests may reach anywhere).
fn non_test(text: &str) -> &str {
    text.find("#[cfg(test)]\nmod tests")
        .map_or(text, |i| &text[..i])
}

/// The crate's modules `text` (of module `me`) names: `crate::a::b` paths, the names inside
/// `use crate::{...}`, and `super::x`.
fn imports(text: &str, me: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    let mut add = |first: String, second: String| {
        let nested = format!("{first}::{second}");
        if modules.contains(&nested) {
            out.insert(nested);
        } else if modules.contains(&first) {
            out.insert(first);
        }
    };
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for name in group.split(',') {
                add(word(name.trim()), String::new());
            }
            continue;
        }
        let first = word(rest);
        let second = rest[first.len()..]
            .strip_prefix("::")
            .map(word)
            .unwrap_or_default();
        add(first, second);
    }
    let parent = me.rsplit_once("::").map_or("", |(p, _)| p);
    for (i, _) in text.match_indices("super::") {
        let name = word(&text[i + "super::".len()..]);
        let module = if parent.is_empty() {
            name
        } else {
            format!("{parent}::{name}")
        };
        add(module, String::new());
    }
    out.remove(me);
    out
}

/// Each module of `api` with the modules it imports (outside its tests).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    files
        .iter()
        .map(|f| {
            let me = module_of(&src, f);
            let text = std::fs::read_to_string(f).expect("a readable source file");
            let imported = imports(non_test(&text), &me, &modules);
            (me, imported)
        })
        .collect()
}

#[test]
fn no_two_files_import_each_other() {
    let g = graph();
    let circles: Vec<(&String, &String)> = g
        .iter()
        .flat_map(|(a, bs)| bs.iter().map(move |b| (a, b)))
        .filter(|(a, b)| a < b && g.get(*b).is_some_and(|back| back.contains(*a)))
        .collect();
    assert!(
        circles.is_empty(),
        "files that import each other: {circles:?}"
    );
}

#[test]
fn the_service_does_not_import_the_dashboard() {
    let g = graph();
    assert!(g.contains_key("dashboard"), "the modules read: {g:?}");
    for module in [
        "admin", "service", "topology", "feedback", "mapping", "watch",
    ] {
        let imported = g.get(module).expect("a module of api");
        assert!(
            !imported.iter().any(|m| m.starts_with("dashboard")),
            "{module} imports {imported:?}"
        );
    }
}
