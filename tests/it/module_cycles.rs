//! No import cycles among the library's modules (`src/`, one module per file).
//!
//! Reads every `.rs` file under `src/` (the binary's `main.rs` aside), strips comments, string
//! literals and `#[cfg(test)]` modules, and collects each module's references to other modules
//! of the crate: `use` trees and qualified paths starting with `crate::`, `super::`, `self::` or
//! one of the module's own submodules. A reference to an item a module re-exports (`pub use`) is
//! followed to the module that defines it, so a facade `mod.rs` does not tie its users to all
//! its children; a reference that stays in an ancestor (a child naming an item of its parent) is
//! not an edge, since a parent and its children are one namespace by design. The test fails naming every cycle (a strongly connected component of more
//! than one module) with the references that make it.
//!
//! Run alone: `cargo test --test it module_cycles:: -- --nocapture` (prints the module count and edges).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A module path as segments after `crate` (`[]` is the crate root).
type ModPath = Vec<String>;

struct Module {
    file: PathBuf,
    /// Code with comments, strings and test modules removed.
    code: String,
    /// `pub use` re-exports: exported name → full path of what it names.
    reexports: HashMap<String, ModPath>,
}

fn module_path(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_owned()),
    }
    parts
}

/// Removes comments, string and char literals (keeping newlines).
fn strip_comments_and_strings(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
            && !ident_before(b, i)
        {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(b[i] as char);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= b.len() {
                    break;
                }
                if b[j] == b'"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&b'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): skip only the former.
            let close = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                // A multi-byte UTF-8 char literal.
                let s = &text[i + 1..];
                s.chars().next().and_then(|c| {
                    let n = c.len_utf8();
                    (s.as_bytes().get(n) == Some(&b'\'')).then_some(i + 1 + n)
                })
            };
            match close {
                Some(c) => {
                    out.push_str("' '");
                    i = c + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = text[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

fn ident_before(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Removes `#[cfg(test)] mod name { ... }` blocks (test code may use anything).
fn strip_test_modules(code: &str) -> String {
    let mut out = code.to_owned();
    while let Some(at) = out.find("#[cfg(test)]") {
        let rest = &out[at + "#[cfg(test)]".len()..];
        let trimmed = rest.trim_start();
        let skip_ws = rest.len() - trimmed.len();
        let body_start = at + "#[cfg(test)]".len() + skip_ws;
        let end = if trimmed.starts_with("mod ") || trimmed.starts_with("pub mod ") {
            // `mod x;` (a test-only file module: keep it out too) or `mod x { ... }`.
            let semi = trimmed.find(';');
            let brace = trimmed.find('{');
            match (semi, brace) {
                (Some(s), Some(b)) if s < b => body_start + s + 1,
                (Some(s), None) => body_start + s + 1,
                (_, Some(b)) => body_start + matching_brace(&trimmed[b..]) + b + 1,
                (None, None) => out.len(),
            }
        } else {
            // `#[cfg(test)]` on an item: drop only the attribute.
            at + "#[cfg(test)]".len()
        };
        out.replace_range(at..end, "");
    }
    out
}

fn matching_brace(s: &str) -> usize {
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    s.len() - 1
}

/// Expands a `use` tree (`a::{b, c::{d as e}, self}`) into full paths (aliases dropped).
fn expand_use_tree(prefix: &[String], tree: &str, out: &mut Vec<ModPath>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = split_path(&tree[..open]);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut base = prefix.to_vec();
        base.extend(head);
        for part in split_top_level(inner) {
            expand_use_tree(&base, &part, out);
        }
    } else {
        let tree = tree.split(" as ").next().unwrap().trim();
        let mut path = prefix.to_vec();
        for seg in split_path(tree) {
            if seg != "self" || path.is_empty() {
                path.push(seg);
            }
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
}

fn split_path(s: &str) -> Vec<String> {
    s.split("::")
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '{' => {
                depth += 1;
                cur.push(c)
            }
            '}' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    parts
}

/// `use` statements of a module: (is `pub`, expanded paths).
fn use_statements(code: &str) -> Vec<(bool, Vec<ModPath>)> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = find_keyword(rest, "use") {
        let before = rest[..at].trim_end();
        let is_pub = before.ends_with("pub") || before.ends_with(')') && before.contains("pub(");
        let after = &rest[at + 3..];
        let Some(end) = after.find(';') else { break };
        let mut paths = Vec::new();
        expand_use_tree(&[], &after[..end], &mut paths);
        found.push((is_pub, paths));
        rest = &after[end..];
    }
    found
}

/// The code with its `use` statements blanked out (they are read by [`use_statements`]).
fn without_use_statements(code: &str) -> String {
    let mut out = code.to_owned();
    while let Some(at) = find_keyword(&out, "use") {
        let end = out[at..].find(';').map_or(out.len(), |e| at + e + 1);
        out.replace_range(at..end, "");
    }
    out
}

/// Byte offset of `word` as a whole word followed by whitespace.
fn find_keyword(s: &str, word: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(p) = s[from..].find(word) {
        let at = from + p;
        let end = at + word.len();
        let boundary_before = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let ws_after = b.get(end).is_some_and(|c| c.is_ascii_whitespace());
        if boundary_before && ws_after {
            return Some(at);
        }
        from = end;
    }
    None
}

/// Qualified paths in code outside `use`: `crate::a::b`, `super::x`, `self::y`, `child::z`.
fn inline_paths(code: &str, children: &BTreeSet<String>) -> Vec<ModPath> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if (c.is_ascii_alphabetic() || c == b'_')
            && !ident_before(b, i)
            && (i == 0 || b[i - 1] != b':')
        {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let path = split_path(&code[start..i]);
            if path.len() >= 2 {
                let head = path[0].as_str();
                if matches!(head, "crate" | "super" | "self") || children.contains(head) {
                    out.push(path);
                }
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Resolves a path written in module `from` to the module it names, or `None` if it leaves
/// the crate. Returns the longest prefix that is a module, and the rest.
fn resolve(
    from: &ModPath,
    path: &ModPath,
    modules: &BTreeMap<ModPath, Module>,
) -> Option<(ModPath, Vec<String>)> {
    let mut base: ModPath;
    let mut segs = path.as_slice();
    match segs.first().map(String::as_str) {
        Some("crate") => {
            base = Vec::new();
            segs = &segs[1..];
        }
        Some("self") => {
            base = from.clone();
            segs = &segs[1..];
        }
        Some("super") => {
            base = from.clone();
            while segs.first().map(String::as_str) == Some("super") {
                base.pop();
                segs = &segs[1..];
            }
        }
        Some(_) => {
            // Relative to `from` (a child module).
            base = from.clone();
        }
        None => return None,
    }
    let mut resolved = base.clone();
    let mut i = 0;
    while i < segs.len() {
        let mut next = resolved.clone();
        next.push(segs[i].clone());
        if modules.contains_key(&next) {
            resolved = next;
            i += 1;
        } else {
            break;
        }
    }
    if !modules.contains_key(&resolved) {
        return None;
    }
    Some((resolved, segs[i..].to_vec()))
}

fn is_ancestor_or_self(a: &ModPath, b: &ModPath) -> bool {
    a.len() <= b.len() && b[..a.len()] == a[..]
}

/// Follows an item named in an ancestor through its `pub use` re-exports (a few hops).
fn follow_reexport(
    module: &ModPath,
    rest: &[String],
    modules: &BTreeMap<ModPath, Module>,
    hops: usize,
) -> Option<ModPath> {
    if hops == 0 || rest.is_empty() {
        return None;
    }
    let target = modules[module].reexports.get(&rest[0])?;
    let (m, r) = resolve(module, target, modules)?;
    let mut full_rest = r;
    full_rest.extend_from_slice(&rest[1..]);
    if &m == module {
        return None;
    }
    match follow_reexport(&m, &full_rest, modules, hops - 1) {
        Some(deeper) => Some(deeper),
        None => Some(m),
    }
}

#[test]
fn no_import_cycles_among_src_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") && p != src.join("main.rs") {
                files.push(p);
            }
        }
    }
    let mut modules: BTreeMap<ModPath, Module> = BTreeMap::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = strip_test_modules(&strip_comments_and_strings(&text));
        modules.insert(
            module_path(&src, &file),
            Module {
                file,
                code,
                reexports: HashMap::new(),
            },
        );
    }
    // Re-exports, with paths made absolute relative to the exporting module.
    let keys: Vec<ModPath> = modules.keys().cloned().collect();
    for m in &keys {
        let mut reexports = HashMap::new();
        for (is_pub, paths) in use_statements(&modules[m].code) {
            if is_pub {
                for p in paths {
                    if let Some(name) = p.last() {
                        reexports.insert(name.clone(), p);
                    }
                }
            }
        }
        modules.get_mut(m).unwrap().reexports = reexports;
    }

    // Edges: module → module, with one example of the reference.
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
    for m in &keys {
        let children: BTreeSet<String> = keys
            .iter()
            .filter(|k| k.len() == m.len() + 1 && k.starts_with(m))
            .map(|k| k.last().unwrap().clone())
            .collect();
        let code = &modules[m].code;
        // `pub use` re-exports are aliases, followed where they are used, not dependencies.
        let used: Vec<ModPath> = use_statements(code)
            .into_iter()
            .filter(|(is_pub, _)| !is_pub)
            .flat_map(|(_, p)| p)
            .collect();
        // Names brought in by `use` (`use super::kernel::stages;` then `stages::scratch::x`).
        let aliases: HashMap<String, ModPath> = used
            .iter()
            .filter_map(|p| Some((p.last()?.clone(), p.clone())))
            .collect();
        let mut paths: Vec<ModPath> = Vec::new();
        for p in used {
            // A module brought into scope is not a dependency on its facade by itself: the
            // items used through it are (the inline paths below).
            if let Some((target, rest)) = resolve(m, &p, &modules) {
                if rest.is_empty() && target != *m {
                    continue;
                }
            }
            paths.push(p);
        }
        let heads: BTreeSet<String> = children.iter().chain(aliases.keys()).cloned().collect();
        for p in inline_paths(&without_use_statements(code), &heads) {
            match aliases.get(&p[0]) {
                Some(full) if !children.contains(&p[0]) => {
                    let mut expanded = full.clone();
                    expanded.extend_from_slice(&p[1..]);
                    paths.push(expanded);
                }
                _ => paths.push(p),
            }
        }
        for p in paths {
            let head = p[0].as_str();
            if !(matches!(head, "crate" | "super" | "self") || children.contains(head)) {
                continue;
            }
            let Some((mut target, rest)) = resolve(m, &p, &modules) else {
                continue;
            };
            if let Some(t) = follow_reexport(&target, &rest, &modules, 4) {
                target = t;
            }
            if is_ancestor_or_self(&target, m) {
                continue;
            }
            edges
                .entry(m.clone())
                .or_default()
                .entry(target)
                .or_insert_with(|| p.join("::"));
        }
    }

    let cycles = strongly_connected(&keys, &edges);
    let name = |p: &ModPath| {
        if p.is_empty() {
            "crate".to_owned()
        } else {
            p.join("::")
        }
    };
    let edge_count: usize = edges.values().map(BTreeMap::len).sum();
    println!("{} modules, {} edges", keys.len(), edge_count);
    let mut report = String::new();
    for scc in &cycles {
        report.push_str(&format!(
            "cycle among {}:\n",
            scc.iter().map(&name).collect::<Vec<_>>().join(", ")
        ));
        for a in scc {
            for (b, via) in edges.get(a).into_iter().flatten() {
                if scc.contains(b) {
                    report.push_str(&format!(
                        "  {} → {}  ({} in {})\n",
                        name(a),
                        name(b),
                        via,
                        modules[a].file.strip_prefix(&src).unwrap().display()
                    ));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles among src/ modules:\n{report}"
    );
}

/// Tarjan's strongly connected components of more than one node.
fn strongly_connected(
    nodes: &[ModPath],
    edges: &BTreeMap<ModPath, BTreeMap<ModPath, String>>,
) -> Vec<Vec<ModPath>> {
    struct State<'a> {
        edges: &'a BTreeMap<ModPath, BTreeMap<ModPath, String>>,
        index: HashMap<ModPath, usize>,
        low: HashMap<ModPath, usize>,
        on_stack: BTreeSet<ModPath>,
        stack: Vec<ModPath>,
        next: usize,
        out: Vec<Vec<ModPath>>,
    }
    fn visit(s: &mut State, v: &ModPath) {
        s.index.insert(v.clone(), s.next);
        s.low.insert(v.clone(), s.next);
        s.next += 1;
        s.stack.push(v.clone());
        s.on_stack.insert(v.clone());
        let targets: Vec<ModPath> = s
            .edges
            .get(v)
            .map(|e| e.keys().cloned().collect())
            .unwrap_or_default();
        for w in targets {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut scc = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(&w);
                let done = &w == v;
                scc.push(w);
                if done {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                s.out.push(scc);
            }
        }
    }
    let mut s = State {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        on_stack: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for n in nodes {
        if !s.index.contains_key(n) {
            visit(&mut s, n);
        }
    }
    s.out
}
