//! Host processes of a container's execs (`exec_kill` kills an exec's whole process tree).

use std::collections::HashMap;

/// SIGKILLs the host process `pid` and all its descendants (found through `/proc`, collected
/// before killing so none is reparented away first).
pub(super) fn kill_tree(pid: i32) {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(p);
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        tree.extend(children.get(&tree[i]).into_iter().flatten());
        i += 1;
    }
    for p in tree {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
}
