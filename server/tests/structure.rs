//! halo-server's module structure, checked from its source: the top-level modules import
//! one another without a cycle, the shared leaves (`http`, `auth`, `token`, `policy`,
//! `sigv4`) import only leaves, and no module but `main` knows `server`, the composition.
//!
//! An import is any `crate::<module>` path outside a comment (a `use`, or a path in
//! code); a submodule's imports are its top-level module's.

// An unreadable source file fails the test, with the reason: clippy.toml allows expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LEAVES: &[&str] = &["http", "auth", "token", "policy", "sigv4"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Top-level module -> the top-level modules it imports.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" || module == "main" || module == "tests" {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read file");
        let deps = graph.entry(module.clone()).or_default();
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for part in code.split("crate::").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
        }
    }
    graph
}

fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_modules_import_each_other_without_a_cycle() {
    let graph = imports();
    assert!(
        graph.contains_key("server") && graph.contains_key("http"),
        "{graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("an import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_shared_leaves_import_no_feature_and_only_main_knows_the_composition() {
    let graph = imports();
    for leaf in LEAVES {
        let deps = &graph[*leaf];
        let features: Vec<_> = deps
            .iter()
            .filter(|d| !LEAVES.contains(&d.as_str()))
            .collect();
        assert!(features.is_empty(), "{leaf} imports {features:?}");
    }
    for (module, deps) in &graph {
        assert!(
            module == "server" || !deps.contains("server"),
            "{module} imports server"
        );
    }
}

#[test]
fn a_cycle_is_found_when_there_is_one() {
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["c".to_string()]));
    graph.insert("c".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    graph.insert("c".to_string(), BTreeSet::new());
    assert_eq!(find_cycle(&graph), None);
}
