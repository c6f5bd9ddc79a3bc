//! The archive reader/extractor on arbitrary tar bytes, confined to the action's three cache paths
//! under small caps. Besides not panicking: whatever the outcome, nothing exists outside the data
//! dir, and a refused entry leaves the data dir as it was.
#![no_main]

use std::path::Path;
use std::time::Duration;

use fro_bot::cache::{extract_tar, CacheError, Limits};
use fro_bot::memory::state_paths::StatePaths;
use libfuzzer_sys::fuzz_target;

fn tree(dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        out.push(e.path().to_string_lossy().into_owned());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            tree(&e.path(), out);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let root = tempfile::tempdir().unwrap();
    let workspace = root.path().join("github/workspace");
    let data_dir = root.path().join("github/home/.local/share/opencode");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::write(data_dir.join("opencode.db"), b"local").unwrap();
    let paths = StatePaths::new(data_dir.clone());
    let limits = Limits {
        max_extension_header_bytes: 4096,
        max_headers: 64,
        max_name_bytes: 512,
        max_total_bytes: 1 << 20,
        max_trailing_bytes: 16 * 1024,
        max_duration: Duration::from_secs(10),
    };
    let result = extract_tar(data, paths.restore_targets(), &workspace, limits);
    if let Err(e) = &result {
        let _ = e.to_string();
        if matches!(e, CacheError::Rejected { .. }) {
            assert_eq!(std::fs::read(data_dir.join("opencode.db")).unwrap(), b"local");
        }
    }
    let mut all = Vec::new();
    tree(root.path(), &mut all);
    let data_prefix = data_dir.to_string_lossy().into_owned();
    let ws = workspace.to_string_lossy().into_owned();
    for p in all {
        let inside = p == data_prefix || p.starts_with(&format!("{data_prefix}/"));
        let ancestor = data_prefix.starts_with(&format!("{p}/"));
        // The (empty) workspace itself is ours; nothing may appear in it.
        assert!(inside || ancestor || p == ws, "{p} outside the data dir ({result:?})");
    }
});
