//! The shape of the house, checked from its sources (`cargo test --test architecture`; it runs
//! `cargo metadata` and reads the `.rs` files, and builds nothing):
//!
//! - **Crates depend only downward** along [`LAYERS`] (normal and build dependencies, from
//!   `cargo metadata --no-deps`; dev-dependencies are test code), and no crate of the pure
//!   floor ([`PURE`]) depends on an async runtime.
//! - **No file circle**: within a crate, a file that names an item of another file (a `use`
//!   line, or a `crate::`/`super::`/`self::`/child-module/imported-module path in its code; test
//!   code left out) depends on that file, and no chain of such dependencies between the
//!   submodules of one module comes back to where it started. A submodule counts with everything
//!   under it (`a/b.rs` → `c.rs` → `a.rs` is the circle `a` → `c` → `a`); a file and its own
//!   parent or child module using each other is that module's inside, not a circle. A path
//!   through a re-export (`pub use x::C`) depends on the file that defines `C`.
//!
//! The reader is lexical, not a compiler: it skips comments, literals and `#[cfg(test)]` /
//! `#[test]` items, follows `mod x;` to `x.rs` or `x/mod.rs`, and treats an inline `mod x { }`
//! as part of its file.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The workspace's crates bottom to top: a crate may depend only on crates before it. A crate
/// named here that does not exist is skipped; a workspace crate not named here fails the test.
const LAYERS: &[&str] = &[
    // The pure floor: no I/O, no tasks, no clock.
    "cdnmap-proto",
    "cdnmap-select",
    "cdnmap-mapper",
    "cdnmap-topology",
    "cdnmap-estimator",
    "cdnmap-world",
    "cdnmap-serve",
    "cdnmap-lead",
    // The round engine (over the pure crates) and the store.
    "cdnmap-engine",
    "cdnmap-store",
    // What both processes export beside their own metrics (process_*, build info).
    "cdnmap-telemetry",
    // The processes.
    "cdnmap-dns",
    "cdnmap-api",
    // The benchmarks, the command line, the binary, the end-to-end tests' helpers.
    "cdnmap-bench",
    "cdnmap-ops",
    "cdnmap",
    "cdnmap-tests",
];

/// The crates of the pure floor.
const PURE: &[&str] = &[
    "cdnmap-proto",
    "cdnmap-select",
    "cdnmap-mapper",
    "cdnmap-topology",
    "cdnmap-estimator",
    "cdnmap-world",
    "cdnmap-serve",
    "cdnmap-lead",
];

/// Dependencies no pure crate may have: the async runtime (time and I/O come in from above).
const PURE_FORBIDS: &[&str] = &["tokio", "tokio-stream", "async-trait"];

/// Circles known and left for now: (crate, the modules a circle may take in). A circle is
/// excused when all its modules are listed; an exception no circle needs any more fails the
/// test, so that it is taken out.
const KNOWN_CIRCLES: &[(&str, &[&str])] = &[];

#[test]
fn crates_depend_only_downward() {
    let problems = layering_problems(&workspace_packages());
    assert!(
        problems.is_empty(),
        "layering:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn no_file_imports_in_a_circle() {
    let mut problems = Vec::new();
    let mut excused = BTreeSet::new();
    for p in workspace_packages() {
        for root in &p.roots {
            for circle in Tree::read(root).circles() {
                let known = KNOWN_CIRCLES.iter().position(|(krate, modules)| {
                    *krate == p.name && circle.modules.iter().all(|m| modules.contains(&&**m))
                });
                match known {
                    Some(k) => drop(excused.insert(k)),
                    None => problems.push(format!("{}: {}", p.name, circle.shown)),
                }
            }
        }
    }
    for (k, (krate, modules)) in KNOWN_CIRCLES.iter().enumerate() {
        if !excused.contains(&k) {
            problems.push(format!(
                "{krate}: no circle among {modules:?} any more: take it out of KNOWN_CIRCLES"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "file circles:\n{}",
        problems.join("\n")
    );
}

/// The layering rule on made-up packages: upward, unknown and impure are each told.
#[test]
fn the_layering_rule_tells_each_kind_of_problem() {
    let package = |name: &str, deps: &[&str]| Package {
        name: name.to_string(),
        deps: deps.iter().map(|d| d.to_string()).collect(),
        roots: Vec::new(),
    };
    let members = [
        package("cdnmap-mapper", &["cdnmap-serve", "serde"]),
        package("cdnmap-serve", &["cdnmap-mapper", "tokio"]),
        package("cdnmap-api", &["cdnmap-engine", "cdnmap-gadget"]),
        package("cdnmap-engine", &[]),
        package("cdnmap-gadget", &[]),
    ];
    assert_eq!(
        layering_problems(&members),
        [
            "cdnmap-mapper depends on cdnmap-serve, which is not below it in LAYERS",
            "cdnmap-serve is a pure crate and depends on tokio",
            "cdnmap-api depends on cdnmap-gadget, which is not below it in LAYERS",
            "cdnmap-gadget is not in LAYERS: give it its floor",
        ]
    );
}

/// The import reader on a crate made for it: a circle through a re-export, a `use` group and
/// `super` in code is found; a module and its child using each other, and test code, are not.
#[test]
fn the_import_reader_finds_a_planted_circle_and_only_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let files = [
        ("lib.rs", "mod a; mod b; mod c; mod d; pub use c::Cee;\n"),
        (
            "a.rs",
            "use crate::{b::Bee, c};\nmod inner;\npub struct A(Bee);\n",
        ),
        ("a/inner.rs", "pub fn f() -> super::A { todo!() }\n"),
        ("b.rs", "pub struct Bee;\nfn g() { let _ = crate::Cee; }\n"),
        (
            "c.rs",
            "pub struct Cee;\nfn h(_: super::a::A) {}\n// crate::b::Bee\n",
        ),
        ("d.rs", "#[cfg(test)]\nmod tests { use crate::a::A; }\n"),
    ];
    for (name, text) in files {
        let path = dir.path().join("src").join(name);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a directory");
        std::fs::write(path, text).expect("a file");
    }
    let circles = Tree::read(&dir.path().join("src/lib.rs")).circles();
    let modules: Vec<_> = circles.iter().map(|c| c.modules.clone()).collect();
    assert_eq!(modules, [["a", "b", "c"]], "{}", circles[0].shown);
}

// ---------------------------------------------------------------------------------------------
// The workspace, from `cargo metadata`.

/// A workspace package: its name, what it depends on outside its tests, its lib and bin roots.
struct Package {
    name: String,
    deps: Vec<String>,
    roots: Vec<PathBuf>,
}

/// What is wrong with the dependencies of `members` (the workspace's packages) by [`LAYERS`]
/// and [`PURE_FORBIDS`].
fn layering_problems(members: &[Package]) -> Vec<String> {
    let rank = |name: &str| LAYERS.iter().position(|l| *l == name);
    let names: BTreeSet<&str> = members.iter().map(|p| p.name.as_str()).collect();
    let mut problems = Vec::new();
    for p in members {
        let Some(own) = rank(&p.name) else {
            problems.push(format!("{} is not in LAYERS: give it its floor", p.name));
            continue;
        };
        for d in &p.deps {
            if names.contains(d.as_str()) && rank(d).is_none_or(|r| r >= own) {
                problems.push(format!(
                    "{} depends on {d}, which is not below it in LAYERS",
                    p.name
                ));
            }
            if PURE.contains(&p.name.as_str()) && PURE_FORBIDS.contains(&d.as_str()) {
                problems.push(format!("{} is a pure crate and depends on {d}", p.name));
            }
        }
    }
    problems
}

fn workspace_packages() -> Vec<Package> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata's JSON");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(String::from)
            .collect()
    };
    let members = strings(&meta["workspace_members"]);
    let packages = meta["packages"].as_array().expect("packages");
    let package = |p: &Value| Package {
        name: p["name"].as_str().expect("a package's name").to_string(),
        deps: (p["dependencies"].as_array().into_iter().flatten())
            .filter(|d| d["kind"].as_str() != Some("dev"))
            .filter_map(|d| d["name"].as_str().map(String::from))
            .collect(),
        roots: (p["targets"].as_array().into_iter().flatten())
            .filter(|t| strings(&t["kind"]).iter().any(|k| k == "lib" || k == "bin"))
            .filter_map(|t| t["src_path"].as_str().map(PathBuf::from))
            .collect(),
    };
    (packages.iter())
        .filter(|p| members.iter().any(|m| p["id"].as_str() == Some(m)))
        .map(package)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A crate's files as a graph.

/// A crate target's files: the module each is, and the modules (by path) each file holds.
struct Tree {
    files: Vec<ModFile>,
    modules: BTreeMap<Vec<String>, usize>,
}

struct ModFile {
    path: PathBuf,
    module: Vec<String>,
    /// What each name it `use`s refers to from the crate root (`None`: outside the crate).
    imports: HashMap<String, Option<Vec<String>>>,
    /// The in-crate paths it names (from the crate root), each with its line and as written.
    refs: Vec<(Vec<String>, usize, String)>,
}

/// A circle: the submodules it takes in (sorted), and how it is shown.
struct Circle {
    modules: Vec<String>,
    shown: String,
}

impl Tree {
    fn read(root: &Path) -> Tree {
        let mut tree = Tree {
            files: Vec::new(),
            modules: BTreeMap::new(),
        };
        tree.visit(root, Vec::new(), true);
        tree
    }

    /// Adds the file of `module` and, depth first, those of its submodules. `owns_dir`: its
    /// submodules' files are beside it (`lib.rs`, `mod.rs`), not in a directory named after it.
    fn visit(&mut self, path: &Path, module: Vec<String>, owns_dir: bool) {
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let toks = without_tests(tokens(&text));
        let (files, inline) = declared_modules(&toks);
        let index = self.files.len();
        self.modules.insert(module.clone(), index);
        for name in &inline {
            self.modules
                .insert([module.clone(), vec![name.clone()]].concat(), index);
        }
        let children: BTreeSet<String> = files.iter().chain(&inline).cloned().collect();
        let uses = use_items(&toks);
        let imports = (uses.iter())
            .filter(|(_, _, name)| name != "*")
            .map(|(_, p, name)| (name.clone(), absolute(&module, p, &children, None)))
            .collect();
        let mut file = ModFile {
            path: path.to_path_buf(),
            module: module.clone(),
            imports,
            refs: Vec::new(),
        };
        let written = uses
            .into_iter()
            .map(|(line, p, _)| (line, p))
            .chain(code_paths(&toks));
        for (line, p) in written.collect::<Vec<_>>() {
            if let Some(abs) = absolute(&module, &p, &children, Some(&file.imports)) {
                file.refs.push((abs, line, p.join("::")));
            }
        }
        self.files.push(file);
        let dir = match owns_dir {
            true => path.parent().map(Path::to_path_buf),
            false => path.parent().zip(path.file_stem()).map(|(d, s)| d.join(s)),
        };
        for name in files {
            let Some(dir) = &dir else { break };
            let flat = dir.join(format!("{name}.rs"));
            let nested = dir.join(&name).join("mod.rs");
            let child = [module.clone(), vec![name]].concat();
            if flat.exists() {
                self.visit(&flat, child, false);
            } else if nested.exists() {
                self.visit(&nested, child, true);
            } // else generated (`include!`) or missing: the compiler tells
        }
    }

    /// The file a path from the crate root names (`None`: outside the crate); through a name
    /// a module re-exports, the file that defines it.
    fn file_of(&self, path: &[String], hops: usize) -> Option<usize> {
        let n = (0..=path.len())
            .take_while(|&n| self.modules.contains_key(&path[..n]))
            .last()?;
        let file = self.modules[&path[..n]];
        let Some(name) = path.get(n) else {
            return Some(file);
        };
        match self.files[file].imports.get(name) {
            Some(Some(target)) if hops < 16 && self.files[file].module == path[..n] => {
                self.file_of(&[target.as_slice(), &path[n + 1..]].concat(), hops + 1)
            }
            Some(None) => None,
            _ => Some(file),
        }
    }

    /// The circles among the submodules of each module.
    fn circles(&self) -> Vec<Circle> {
        // Per module: for each step between two of its submodules, the first reference making it.
        type Steps = BTreeMap<(String, String), (usize, usize)>;
        let mut levels: BTreeMap<Vec<String>, Steps> = BTreeMap::new();
        for (from, f) in self.files.iter().enumerate() {
            for (r, (path, _, _)) in f.refs.iter().enumerate() {
                let Some(to) = self.file_of(path, 0) else {
                    continue;
                };
                let (a, b) = (&f.module, &self.files[to].module);
                let common = a.iter().zip(b).take_while(|(x, y)| x == y).count();
                if common == a.len() || common == b.len() {
                    continue; // a module and what is under it
                }
                let step = (a[common].clone(), b[common].clone());
                levels
                    .entry(a[..common].to_vec())
                    .or_default()
                    .entry(step)
                    .or_insert((from, r));
            }
        }
        let mut out = Vec::new();
        for (module, steps) in &levels {
            let reach = |start: &String| -> BTreeSet<String> {
                let mut seen = BTreeSet::from([start.clone()]);
                let mut todo = vec![start.clone()];
                while let Some(n) = todo.pop() {
                    for ((x, y), _) in steps.range((n.clone(), String::new())..) {
                        if *x != n {
                            break;
                        }
                        if seen.insert(y.clone()) {
                            todo.push(y.clone());
                        }
                    }
                }
                seen
            };
            let mut done = BTreeSet::new();
            for node in steps.keys().map(|(x, _)| x) {
                let component: Vec<String> = (reach(node).into_iter())
                    .filter(|m| reach(m).contains(node))
                    .collect();
                if component.len() > 1 && done.insert(component.clone()) {
                    out.push(self.circle(module, component, steps));
                }
            }
        }
        out
    }

    fn circle(
        &self,
        module: &[String],
        modules: Vec<String>,
        steps: &BTreeMap<(String, String), (usize, usize)>,
    ) -> Circle {
        let prefix = module.iter().map(|m| format!("{m}::")).collect::<String>();
        let mut shown = format!("{prefix}{{{}}}", modules.join(", "));
        for ((x, y), &(file, r)) in steps {
            if modules.contains(x) && modules.contains(y) {
                let (path, line, written) = &self.files[file].refs[r];
                let to = self.file_of(path, 0).unwrap_or(file);
                let show = |f: usize| self.files[f].path.display().to_string();
                shown += &format!(
                    "\n    {x} -> {y}: {}:{line} `{written}` -> {}",
                    show(file),
                    show(to)
                );
            }
        }
        Circle { modules, shown }
    }
}

/// The path `p`, written in `module` (with child modules `children` and `imports`), from the
/// crate root; `None` when it leads outside the crate or is not a path into it.
fn absolute(
    module: &[String],
    p: &[String],
    children: &BTreeSet<String>,
    imports: Option<&HashMap<String, Option<Vec<String>>>>,
) -> Option<Vec<String>> {
    let first = p.first()?;
    let mut base = module.to_vec();
    let rest = match first.as_str() {
        "crate" => {
            base.clear();
            &p[1..]
        }
        "self" => &p[1..],
        "super" => {
            let ups = p.iter().take_while(|s| *s == "super").count();
            base.truncate(base.len().checked_sub(ups)?);
            &p[ups..]
        }
        _ if children.contains(first) => p,
        _ => match imports.and_then(|i| i.get(first)) {
            Some(Some(target)) if p.len() > 1 => {
                return Some([target.as_slice(), &p[1..]].concat())
            }
            _ => return None,
        },
    };
    Some([base.as_slice(), rest].concat())
}

// ---------------------------------------------------------------------------------------------
// A file's tokens.

/// A token of code with its line (from 1): an identifier or keyword, `::`, or one other mark.
type Tok = (usize, String);

/// The tokens of `text`, without comments, string and character literals, and lifetimes.
fn tokens(text: &str) -> Vec<Tok> {
    let s: Vec<char> = text.chars().collect();
    let (mut out, mut line, mut i) = (Vec::new(), 1, 0);
    let skip_to = |i: &mut usize, line: &mut usize, end: usize| {
        *line += s[*i..end.min(s.len())]
            .iter()
            .filter(|c| **c == '\n')
            .count();
        *i = end;
    };
    while i < s.len() {
        let at = |k: usize| s.get(i + k).copied().unwrap_or(' ');
        let c = s[i];
        if c == '/' && at(1) == '/' {
            let end = (i..s.len()).find(|&k| s[k] == '\n').unwrap_or(s.len());
            skip_to(&mut i, &mut line, end);
        } else if c == '/' && at(1) == '*' {
            let (mut depth, mut k) = (0, i);
            while k < s.len() {
                match (s[k], s.get(k + 1)) {
                    ('/', Some('*')) => (depth, k) = (depth + 1, k + 2),
                    ('*', Some('/')) if depth == 1 => break,
                    ('*', Some('/')) => (depth, k) = (depth - 1, k + 2),
                    _ => k += 1,
                }
            }
            skip_to(&mut i, &mut line, k + 2);
        } else if c == '"' || (c == 'b' && at(1) == '"') {
            let mut k = i + if c == 'b' { 2 } else { 1 };
            while k < s.len() && s[k] != '"' {
                k += if s[k] == '\\' { 2 } else { 1 };
            }
            skip_to(&mut i, &mut line, k + 1);
        } else if let Some(hashes) = raw_string_at(&s[i..]) {
            // r"..", r#".."#, br"..": to the quote followed by as many hashes.
            let body = i + 2 + usize::from(c == 'b') + hashes;
            let mut close = vec!['"'];
            close.extend(std::iter::repeat_n('#', hashes));
            let end = (body..s.len()).find(|&k| s[k..].starts_with(&close));
            skip_to(&mut i, &mut line, end.map_or(s.len(), |e| e + close.len()));
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}') or a lifetime or label ('a).
            let len = if at(1) == '\\' {
                (i + 3..s.len())
                    .find(|&k| s[k] == '\'')
                    .map_or(1, |k| k + 1 - i)
            } else if at(2) == '\'' {
                3
            } else {
                1 + s[i + 1..].iter().take_while(|c| is_word(**c)).count()
            };
            let end = i + len;
            skip_to(&mut i, &mut line, end);
        } else if is_word(c) {
            let len = s[i..].iter().take_while(|c| is_word(**c)).count();
            out.push((line, s[i..i + len].iter().collect()));
            i += len;
        } else if c == ':' && at(1) == ':' {
            out.push((line, "::".to_string()));
            i += 2;
        } else {
            if !c.is_whitespace() {
                out.push((line, c.to_string()));
            }
            let end = i + 1;
            skip_to(&mut i, &mut line, end);
        }
    }
    out
}

/// How many hashes the raw string starting at `s[0]` has, or `None` if none starts there.
fn raw_string_at(s: &[char]) -> Option<usize> {
    let after_r = match s {
        ['r', ..] => 1,
        ['b', 'r', ..] => 2,
        _ => return None,
    };
    let hashes = s[after_r..].iter().take_while(|c| **c == '#').count();
    (s.get(after_r + hashes) == Some(&'"')).then_some(hashes)
}

fn is_word(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The tokens without test code: an item under `#[test]` or a `#[cfg(..)]` naming `test` or
/// `fuzzing` (and not `not`) goes, attributes and all, to its `;` or its closing brace.
fn without_tests(toks: Vec<Tok>) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].1 == "#" && toks.get(i + 1).is_some_and(|t| t.1 == "[") {
            let end = matching(&toks, i + 1);
            let words: Vec<&str> = toks[i + 2..end].iter().map(|t| t.1.as_str()).collect();
            let test = words == ["test"]
                || (words.first() == Some(&"cfg")
                    && words.iter().any(|w| *w == "test" || *w == "fuzzing")
                    && !words.contains(&"not"));
            if test {
                i = item_end(&toks, end + 1);
                continue;
            }
        }
        out.push(toks[i].clone());
        i += 1;
    }
    out
}

/// The index of the bracket closing the one at `open`.
fn matching(toks: &[Tok], open: usize) -> usize {
    let mut depth = 0;
    for (k, (_, t)) in toks.iter().enumerate().skip(open) {
        match t.as_str() {
            "(" | "[" | "{" => depth += 1,
            ")" | "]" | "}" => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            return k;
        }
    }
    toks.len()
}

/// Where the item starting at `from` ends (just after its `;` or its body's closing brace).
fn item_end(toks: &[Tok], from: usize) -> usize {
    let mut k = from;
    while k < toks.len() {
        match toks[k].1.as_str() {
            ";" => return k + 1,
            "{" => return matching(toks, k) + 1,
            "(" | "[" => k = matching(toks, k) + 1,
            _ => k += 1,
        }
    }
    k
}

/// The modules a file declares: with files (`mod x;`) and inline (`mod x { }`).
fn declared_modules(toks: &[Tok]) -> (Vec<String>, Vec<String>) {
    let (mut files, mut inline) = (Vec::new(), Vec::new());
    for w in toks.windows(3) {
        if w[0].1 == "mod" && w[1].1.chars().all(is_word) {
            match w[2].1.as_str() {
                ";" => files.push(w[1].1.clone()),
                "{" => inline.push(w[1].1.clone()),
                _ => {}
            }
        }
    }
    (files, inline)
}

/// Each path a `use` item names, with its line and the name it binds (`*` for a glob).
fn use_items(toks: &[Tok]) -> Vec<(usize, Vec<String>, String)> {
    let mut out = Vec::new();
    for (k, (line, t)) in toks.iter().enumerate() {
        if t == "use" && toks.get(k.wrapping_sub(1)).is_none_or(|p| p.1 != "::") {
            use_tree(toks, k + 1, Vec::new(), *line, &mut out);
        }
    }
    out
}

/// Reads the use tree at `k` under `prefix` into `out`; returns the index after it.
fn use_tree(
    toks: &[Tok],
    mut k: usize,
    mut prefix: Vec<String>,
    line: usize,
    out: &mut Vec<(usize, Vec<String>, String)>,
) -> usize {
    while k < toks.len() {
        match toks[k].1.as_str() {
            "::" => k += 1,
            "{" => {
                k += 1;
                while k < toks.len() && toks[k].1 != "}" {
                    k = use_tree(toks, k, prefix.clone(), line, out).max(k + 1);
                    if toks.get(k).is_some_and(|t| t.1 == ",") {
                        k += 1;
                    }
                }
                return k + 1;
            }
            "*" => {
                out.push((line, prefix, "*".to_string()));
                return k + 1;
            }
            w if w.chars().all(is_word) => {
                prefix.push(w.to_string());
                k += 1;
                if toks.get(k).is_some_and(|t| t.1 == "::") {
                    continue;
                }
                let mut name = w.to_string();
                if toks.get(k).is_some_and(|t| t.1 == "as") {
                    name = toks.get(k + 1).map_or(name, |t| t.1.clone());
                    k += 2;
                }
                if name == "self" {
                    prefix.pop();
                    name = prefix.last().cloned().unwrap_or(name);
                }
                out.push((line, prefix, name));
                return k;
            }
            _ => return k,
        }
    }
    k
}

/// The paths of two or more segments in code outside `use` items (`a::b::C`), with their lines.
fn code_paths(toks: &[Tok]) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < toks.len() {
        if toks[k].1 == "use" {
            k = item_end(toks, k);
            continue;
        }
        let mut path = Vec::new();
        let mut j = k;
        while j < toks.len() && toks[j].1.chars().all(is_word) {
            path.push(toks[j].1.clone());
            if toks.get(j + 1).is_none_or(|t| t.1 != "::") {
                break;
            }
            j += 2;
        }
        let after_colons = k > 0 && toks[k - 1].1 == "::";
        if path.len() >= 2 && !after_colons {
            out.push((toks[k].0, path));
        }
        k = j.max(k) + 1;
    }
    out
}
