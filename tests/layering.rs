//! The runtime's layering, checked on its source: every `crate::` path in `src/` (outside
//! `src/bin` and unit-test modules) must point to a module in the same or a lower layer of
//! [`LAYERS`], and no group of modules may import each other in a circle at any depth of the
//! module tree. A new top-level module must be given a layer here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The top-level modules of `src/`, bottom layer first. A module may import its own layer
/// and the layers below it.
const LAYERS: &[&[&str]] = &[
    &["error", "tuning", "launcher"],
    &["dtype", "reduce", "copy"],
    &["config"],
    // The records that cross the wire: imported by everything that talks to a peer.
    &["wire"],
    // The device layer (CUDA driver, memory, streams, kernels).
    &["gpu"],
    // One folder per transport and the table that lists them.
    &["transport"],
    &["bootstrap"],
    // The listener and connection setup, over the transport table.
    &["connection"],
    &["watchdog", "executor"],
    &["diagnosis", "metrics", "status"],
    &["comm"],
    &["check"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// Every `.rs` file under `dir`, except the binaries.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "bin") {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file: `src/transport/tcp/mod.rs` is `transport::tcp`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file
        .strip_prefix(src)
        .expect("under src/")
        .with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The code of a file without comments and without its `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]")
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod tests"))
        {
            break;
        }
        let code = line.split("//").next().unwrap_or("");
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// The module paths after each `crate::` in `code` (`crate::wire::Msg` gives `[wire, Msg]`),
/// including those inside `crate::{a::B, c}`.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut at = 0;
    while let Some(found) = code[at..].find("crate::") {
        let start = at + found;
        at = start + "crate::".len();
        if start > 0 && ident(bytes[start - 1]) {
            continue; // e.g. `mycrate::`
        }
        let read_path = |mut i: usize| {
            let mut parts = Vec::new();
            loop {
                let s = i;
                while i < bytes.len() && ident(bytes[i]) {
                    i += 1;
                }
                if i == s {
                    break;
                }
                parts.push(code[s..i].to_string());
                if code[i..].starts_with("::") && !code[i + 2..].starts_with('{') {
                    i += 2;
                } else {
                    break;
                }
            }
            parts
        };
        if code[at..].starts_with('{') {
            // `crate::{a::B, c::{D, E}}`: the first segment of each item.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in code[at..].char_indices() {
                match c {
                    '{' => {
                        depth += 1;
                        item_start = depth == 1;
                    }
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 1 => {
                        out.push(read_path(at + i));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(read_path(at));
        }
    }
    out
}

struct Graph {
    /// Every module of the crate, by path.
    modules: BTreeSet<Vec<String>>,
    /// (importing module, imported module) pairs, full paths.
    edges: BTreeSet<(Vec<String>, Vec<String>)>,
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges = BTreeSet::new();
    for file in &files {
        let from = module_of(&src, file);
        let text = std::fs::read_to_string(file).expect("a source file is readable");
        for path in crate_paths(&code_of(&text)) {
            // The longest prefix of the path that is a module.
            let to = (1..=path.len())
                .rev()
                .map(|n| path[..n].to_vec())
                .find(|p| modules.contains(p));
            if let Some(to) = to {
                edges.insert((from.clone(), to));
            }
        }
    }
    Graph { modules, edges }
}

/// The modules, cut to `depth` segments, that import each other in a circle.
fn circles(g: &Graph, depth: usize) -> Vec<Vec<String>> {
    let cut = |p: &Vec<String>| p[..p.len().min(depth)].join("::");
    let mut next: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, to) in &g.edges {
        let (a, b) = (cut(from), cut(to));
        // A module importing its own descendants (or they it) is no circle between modules.
        if a != b && !b.starts_with(&format!("{a}::")) && !a.starts_with(&format!("{b}::")) {
            next.entry(a).or_default().insert(b);
        }
    }
    // Strongly connected components (Tarjan).
    struct Tarjan<'a> {
        next: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        found: Vec<Vec<String>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: &str) {
            let i = self.index.len();
            self.index.insert(v.to_string(), i);
            self.low.insert(v.to_string(), i);
            self.stack.push(v.to_string());
            self.on_stack.insert(v.to_string());
            let next = self.next;
            for w in next.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(&w);
                    let done = w == v;
                    component.push(w);
                    if done {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut t = Tarjan {
        next: &next,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in next.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.found
}

#[test]
fn no_module_imports_a_higher_layer() {
    let g = graph();
    let mut wrong = Vec::new();
    for module in g.modules.iter().filter(|m| !m.is_empty()) {
        if layer_of(&module[0]).is_none() {
            wrong.push(format!(
                "src/{}: a top-level module with no layer in LAYERS",
                module[0]
            ));
        }
    }
    for (from, to) in &g.edges {
        let (Some(a), Some(b)) = (from.first(), to.first()) else {
            continue;
        };
        if let (Some(la), Some(lb)) = (layer_of(a), layer_of(b))
            && lb > la
        {
            wrong.push(format!(
                "{} (layer {la}) imports {} (layer {lb})",
                from.join("::"),
                to.join("::")
            ));
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn no_import_circle_at_any_depth() {
    let g = graph();
    let deepest = g.modules.iter().map(Vec::len).max().unwrap_or(1);
    let found: Vec<String> = (1..=deepest)
        .flat_map(|d| circles(&g, d))
        .map(|c| c.join(" <-> "))
        .collect();
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_checker_sees_imports_and_circles() {
    // The parser reads plain, nested and grouped paths, and skips comments and tests.
    let code = code_of(
        "use crate::wire::{Msg, Route};\nuse crate::{config::Config, gpu};\n\
         // crate::comm in a comment\nfn f() { crate::transport::tcp::X; }\n\
         #[cfg(test)]\nmod tests { use crate::comm::Communicator; }\n",
    );
    let firsts: BTreeSet<String> = crate_paths(&code)
        .into_iter()
        .map(|p| p[0].clone())
        .collect();
    let want: BTreeSet<String> = ["wire", "config", "gpu", "transport"]
        .map(String::from)
        .into();
    assert_eq!(firsts, want);
    // A circle of two modules is found; a parent importing its child is not a circle.
    let m = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let g = Graph {
        modules: ["a", "b", "a::c"].map(m).into(),
        edges: [(m("a"), m("b")), (m("b"), m("a::c")), (m("a"), m("a::c"))].into(),
    };
    assert_eq!(circles(&g, 1), vec![vec!["a".to_string(), "b".to_string()]]);
    assert!(circles(&g, 2).is_empty());
    // The real tree has both layers and edges to check.
    let real = graph();
    assert!(real.modules.len() > 20 && real.edges.len() > 50);
}
