//! Every surface that names the eviction policies names exactly the
//! registry's (`EvictionPolicyKind::ALL`): the C header's enum (in the
//! registry's order and values), the Python stubs' and bindings' docs of
//! `CacheConfig.eviction`, the README's policy table and a section of
//! docs/eviction.md per policy. (The CLI, Python's `EVICTION_POLICIES` and
//! the SGLang backend take their names from the registry itself.)

use std::collections::BTreeSet;

use mla_cache::EvictionPolicyKind;

fn read(path: &str) -> String {
    std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn registry() -> Vec<&'static str> {
    EvictionPolicyKind::ALL
        .map(EvictionPolicyKind::name)
        .to_vec()
}

/// The names between `open` and `close` on the lines of `text` that `keep`.
fn quoted(text: &str, keep: impl Fn(&str) -> bool, open: &str, close: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| keep(l))
        .flat_map(|l| {
            l.split(open)
                .skip(1)
                .map(|s| s.split(close).next().unwrap_or("").to_owned())
        })
        .collect()
}

fn as_set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

#[test]
fn the_c_enum_lists_the_registry_in_order() {
    let header = read("include/mla_cache.h");
    let listed: Vec<(String, u32)> = header
        .lines()
        .filter_map(|l| l.trim().strip_prefix("MLA_EVICTION_POLICY_KIND_"))
        .map(|l| {
            let (name, value) = l.split_once(" = ").expect("NAME = value");
            (
                name.to_lowercase(),
                value.trim_end_matches(',').parse().expect("a value"),
            )
        })
        .collect();
    let expected: Vec<(String, u32)> = EvictionPolicyKind::ALL
        .iter()
        .map(|&p| (p.name().to_owned(), p as u32))
        .collect();
    assert_eq!(listed, expected);
}

#[test]
fn the_python_docs_of_eviction_name_the_registry() {
    let stub = read("python/mla_cache/_native.pyi");
    let in_stub = quoted(
        &stub,
        |l| l.contains("Eviction policy name"),
        "``\"",
        "\"``",
    );
    assert_eq!(in_stub, as_set(&registry()), "python/mla_cache/_native.pyi");
    let bindings = read("pyext/src/config.rs");
    let start = bindings
        .find("``eviction``")
        .expect("the eviction argument's doc");
    let doc: String = bindings[start..]
        .lines()
        .take_while(|l| !l.contains("``hash_seed``"))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        quoted(&doc, |_| true, "``\"", "\"``"),
        as_set(&registry()),
        "pyext/src/config.rs"
    );
}

#[test]
fn the_docs_give_every_registered_policy_and_no_other() {
    let readme = read("README.md");
    let table = quoted(
        &readme,
        |l| l.starts_with("| `") && !l.contains(" | 1,") && !l.contains("bytes"),
        "| `",
        "` |",
    );
    let formats: BTreeSet<String> = mla_cache::Dtype::ALL
        .iter()
        .map(|d| d.name().to_owned())
        .collect();
    let policies: BTreeSet<String> = table.difference(&formats).cloned().collect();
    assert_eq!(policies, as_set(&registry()), "README.md's policy table");
    let design = read("docs/eviction.md");
    let sections = quoted(&design, |l| l.starts_with("## `"), "## `", "`");
    assert_eq!(sections, as_set(&registry()), "docs/eviction.md's sections");
}
