//! A configuration's documented keys against the keys its parser accepts, for the tests that
//! hold a configuration reference (`docs/operations.md`, `docs/dns.md`) to the code.
//!
//! The accepted keys are not listed by hand: [`accepted_keys`] asks the parser. Every table of
//! the configurations is a serde struct with `deny_unknown_fields`, so a key it does not know is
//! refused with serde's "unknown field `k`, expected one of `a`, `b`, ..." — which names every
//! field the table has. Each field is then probed in turn to tell a nested table (a struct: the
//! same error again), a map of tables (`[field.NAME]`), an array of tables (`[[field]]`) and a
//! map of values from a plain value.
//!
//! Keys are written as dotted paths: `*` for a name of the operator's choosing (a map's key)
//! and `[]` after an array of tables (`class_rules[].pattern`). In a document, a segment in
//! upper case (`bypass.CLASS.cname`) is such a name.

use std::collections::BTreeSet;

/// The probe key, which no configuration has.
const PROBE: &str = "zz_probe_key";
/// A map's key in a probe.
const ANY: &str = "zz_any";
/// Nested tables deeper than this are not followed (no configuration comes near).
const MAX_DEPTH: usize = 8;

#[derive(Clone, Debug, PartialEq)]
enum Seg {
    /// A field of a struct.
    Key(String),
    /// Any key of a map.
    Any,
    /// The tables of an array of tables.
    Array,
}

/// Every key `parse` accepts, as dotted paths. `parse` parses a TOML document into the whole
/// configuration without validating the values, and returns the parser's message (without
/// the position: `toml::de::Error::message`) when it refuses it.
pub fn accepted_keys(parse: impl Fn(&str) -> Result<(), String>) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    let fields = table_fields(&parse, &[])
        .expect("the configuration's top level is a struct that refuses unknown keys");
    walk(&parse, &[], fields, &mut keys, 0);
    keys
}

fn walk(
    parse: &impl Fn(&str) -> Result<(), String>,
    at: &[Seg],
    fields: Vec<String>,
    keys: &mut BTreeSet<String>,
    depth: usize,
) {
    assert!(depth < MAX_DEPTH, "tables nested deeper than {MAX_DEPTH}");
    for field in fields {
        let mut path = at.to_vec();
        path.push(Seg::Key(field));
        let nested = [None, Some(Seg::Any), Some(Seg::Array)]
            .into_iter()
            .find_map(|extra| {
                let mut p = path.clone();
                p.extend(extra);
                table_fields(parse, &p).map(|f| (p, f))
            });
        match nested {
            Some((p, f)) => walk(parse, &p, f, keys, depth + 1),
            None if is_map_of_values(parse, &path) => {
                path.push(Seg::Any);
                keys.insert(render(&path));
            }
            None => {
                keys.insert(render(&path));
            }
        }
    }
}

/// The fields of the struct at `path`, when there is one there that refuses unknown keys.
fn table_fields(parse: &impl Fn(&str) -> Result<(), String>, path: &[Seg]) -> Option<Vec<String>> {
    let text = format!("{}{PROBE} = 1\n", headers(path));
    let message = parse(&text).err()?;
    let unknown = format!("unknown field `{PROBE}`");
    let rest = message.split_once(&unknown)?.1;
    let expected = rest.split_once("expected").map_or("", |(_, e)| e);
    Some(
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// Whether the value at `path` is a table that takes any key with a string value.
fn is_map_of_values(parse: &impl Fn(&str) -> Result<(), String>, path: &[Seg]) -> bool {
    parse(&format!("{}{PROBE} = \"x\"\n", headers(path))).is_ok()
}

/// The table headers that open the table at `path`.
fn headers(path: &[Seg]) -> String {
    let mut out = String::new();
    let mut prefix: Vec<&str> = Vec::new();
    for (i, seg) in path.iter().enumerate() {
        match seg {
            Seg::Key(k) => prefix.push(k),
            Seg::Any => prefix.push(ANY),
            Seg::Array => out.push_str(&format!("[[{}]]\n", prefix.join("."))),
        }
        let last = i + 1 == path.len();
        if last && *seg != Seg::Array {
            out.push_str(&format!("[{}]\n", prefix.join(".")));
        }
    }
    out
}

fn render(path: &[Seg]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Seg::Array => out.push_str("[]"),
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Any => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('*');
            }
        }
    }
    out
}

/// The keys a document's reference lists: between `<!-- {section}:begin -->` and
/// `<!-- {section}:end -->`, the first code span of every table row (`| \`key\` | ...`), a
/// segment in upper case read as `*`. Panics when the section is missing or lists a key twice.
pub fn documented_keys(markdown: &str, section: &str) -> BTreeSet<String> {
    let begin = format!("<!-- {section}:begin -->");
    let end = format!("<!-- {section}:end -->");
    let body = markdown
        .split_once(&begin)
        .and_then(|(_, rest)| rest.split_once(&end))
        .unwrap_or_else(|| panic!("no {begin} ... {end} section"))
        .0;
    let mut keys = BTreeSet::new();
    for line in body.lines() {
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let key = row.split('`').next().unwrap_or_default();
        let key = key
            .split('.')
            .map(|seg| {
                let name = seg.trim_end_matches("[]");
                if !name.is_empty() && name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') {
                    seg.replacen(name, "*", 1)
                } else {
                    seg.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join(".");
        assert!(keys.insert(key.clone()), "{key} is documented twice");
    }
    keys
}

/// Panics naming the keys the document lacks and the keys it has that the code does not.
pub fn assert_same_keys(documented: &BTreeSet<String>, accepted: &BTreeSet<String>, doc: &str) {
    let missing: Vec<_> = accepted.difference(documented).collect();
    let unknown: Vec<_> = documented.difference(accepted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "{doc}: keys the configuration accepts but the reference does not list: {missing:?}; \
         keys the reference lists but the configuration does not accept: {unknown:?}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_open_maps_and_arrays_of_tables() {
        let k = |s: &str| Seg::Key(s.into());
        assert_eq!(headers(&[]), "");
        assert_eq!(headers(&[k("tls")]), "[tls]\n");
        assert_eq!(
            headers(&[k("health"), k("clusters"), Seg::Any]),
            "[health.clusters.zz_any]\n"
        );
        assert_eq!(
            headers(&[k("class_rules"), Seg::Array]),
            "[[class_rules]]\n"
        );
        assert_eq!(
            render(&[k("class_rules"), Seg::Array, k("pattern")]),
            "class_rules[].pattern"
        );
        assert_eq!(
            render(&[k("bypass"), Seg::Any, k("cname")]),
            "bypass.*.cname"
        );
    }

    #[test]
    fn documented_keys_read_placeholders_as_any() {
        let doc = "x\n<!-- r:begin -->\n| key | d |\n|---|---|\n| `a` | 1 |\n\
                   | `bypass.CLASS.cname` | |\n| `class_rules[].class` | |\n\
                   text | `not` |\n<!-- r:end -->\n| `after` |\n";
        let keys = documented_keys(doc, "r");
        let want: BTreeSet<String> = ["a", "bypass.*.cname", "class_rules[].class"]
            .into_iter()
            .map(String::from)
            .collect();
        assert_eq!(keys, want);
    }
}
