//! Finding the `opencode` binary: `OPENCODE_PATH`, then `PATH`, then (local runs) an npm install of
//! the pinned `opencode-ai` package into a cache directory.

use std::path::{Path, PathBuf};

use crate::runner::env::{OPENCODE_PATH, PATH};
use crate::runner::Env;

#[derive(Debug, thiserror::Error)]
pub enum LocateError {
    #[error("{var} points at {}, which is not an executable file", path.display(), var = OPENCODE_PATH)]
    BadOverride { path: PathBuf },
    #[error(
        "opencode was not found on {path_var} and npm is not available to install it; install it \
         with `npm install -g opencode-ai@{version}` (or set {override_var} to the binary)",
        path_var = PATH,
        override_var = OPENCODE_PATH
    )]
    NotFound { version: String },
    #[error("installing opencode-ai@{version} with npm into {} failed: {detail}", dir.display())]
    Install {
        version: String,
        dir: PathBuf,
        detail: String,
    },
    #[error("cannot run npm to install opencode-ai@{version}")]
    Npm {
        version: String,
        #[source]
        source: std::io::Error,
    },
}

/// How the binary was found, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Located {
    Override(PathBuf),
    OnPath(PathBuf),
    Installed(PathBuf),
}

impl Located {
    pub fn path(&self) -> &Path {
        match self {
            Located::Override(p) | Located::OnPath(p) | Located::Installed(p) => p,
        }
    }
}

/// Finds `opencode`: `OPENCODE_PATH` (a file or a directory containing it), then `PATH`. If neither
/// has it and `npm` is on `PATH`, installs `opencode-ai@{version}` into `cache_dir` (reused when
/// already there).
pub async fn locate(env: &Env, version: &str, cache_dir: &Path) -> Result<Located, LocateError> {
    if let Some(p) = env.get(OPENCODE_PATH) {
        let p = PathBuf::from(p);
        let candidate = if p.is_dir() { p.join("opencode") } else { p };
        return if is_executable(&candidate) {
            Ok(Located::Override(candidate))
        } else {
            Err(LocateError::BadOverride { path: candidate })
        };
    }
    if let Some(found) = which("opencode", env.raw(PATH)) {
        return Ok(Located::OnPath(found));
    }
    let installed = installed_binary(cache_dir, version);
    if let Some(bin) = installed.iter().find(|b| is_executable(b)) {
        return Ok(Located::Installed(bin.clone()));
    }
    let Some(npm) = which("npm", env.raw(PATH)) else {
        return Err(LocateError::NotFound {
            version: version.to_string(),
        });
    };
    let dir = cache_dir.join(format!("opencode-{version}"));
    std::fs::create_dir_all(&dir).map_err(|e| LocateError::Install {
        version: version.into(),
        dir: dir.clone(),
        detail: e.to_string(),
    })?;
    let out = tokio::process::Command::new(npm)
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--silent",
            &format!("opencode-ai@{version}"),
        ])
        .current_dir(&dir)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|source| LocateError::Npm {
            version: version.into(),
            source,
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(LocateError::Install {
            version: version.into(),
            dir,
            detail: format!("{}: {}", out.status, tail(&stderr, 600)),
        });
    }
    installed_binary(cache_dir, version)
        .into_iter()
        .find(|b| is_executable(b))
        .map(Located::Installed)
        .ok_or_else(|| LocateError::Install {
            version: version.into(),
            dir: cache_dir.join(format!("opencode-{version}")),
            detail: "the package installed but no platform binary was found in it".into(),
        })
}

/// The platform binaries the npm package may bring (the `.bin` entry is a node wrapper; the
/// platform package carries the real static binary). Baseline last: only for old CPUs.
fn installed_binary(cache_dir: &Path, version: &str) -> Vec<PathBuf> {
    let nm = cache_dir
        .join(format!("opencode-{version}"))
        .join("node_modules");
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => other,
    };
    let os = std::env::consts::OS;
    vec![
        nm.join(format!("opencode-{os}-{arch}/bin/opencode")),
        nm.join(format!("opencode-{os}-{arch}-baseline/bin/opencode")),
        nm.join(".bin/opencode"),
    ]
}

fn which(name: &str, path: Option<&str>) -> Option<PathBuf> {
    std::env::split_paths(path?)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn tail(s: &str, max: usize) -> &str {
    let s = s.trim();
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exe(dir: &Path, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[tokio::test]
    async fn override_then_path_then_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let oc = exe(&bin, "opencode");
        let cache = dir.path().join("cache");

        let env = Env::from_pairs([(OPENCODE_PATH, oc.to_str().unwrap())]);
        assert_eq!(
            locate(&env, "1.0.0", &cache).await.unwrap(),
            Located::Override(oc.clone())
        );
        // A directory override means the binary inside it.
        let env = Env::from_pairs([(OPENCODE_PATH, bin.to_str().unwrap())]);
        assert_eq!(
            locate(&env, "1.0.0", &cache).await.unwrap(),
            Located::Override(oc.clone())
        );
        let env = Env::from_pairs([(OPENCODE_PATH, "/nonexistent/opencode")]);
        assert!(matches!(
            locate(&env, "1.0.0", &cache).await,
            Err(LocateError::BadOverride { .. })
        ));

        let env = Env::from_pairs([(PATH, format!("/nonexistent:{}", bin.display()))]);
        assert_eq!(
            locate(&env, "1.0.0", &cache).await.unwrap(),
            Located::OnPath(oc)
        );

        // Neither opencode nor npm: the error says how to install it.
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        let env = Env::from_pairs([(PATH, empty.to_str().unwrap())]);
        let err = locate(&env, "1.18.33", &cache).await.unwrap_err();
        assert!(matches!(err, LocateError::NotFound { .. }));
        assert!(err
            .to_string()
            .contains("npm install -g opencode-ai@1.18.33"));
    }

    #[tokio::test]
    async fn missing_opencode_is_installed_with_npm_into_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let arch = match std::env::consts::ARCH {
            "x86_64" => "x64",
            "aarch64" => "arm64",
            other => other,
        };
        // A stand-in npm that lays out what `npm install opencode-ai@V` brings, and records its args.
        let npm = exe(&bin, "npm");
        std::fs::write(
            &npm,
            format!(
                "#!/bin/sh\necho \"$@\" > args.txt\n\
                 mkdir -p node_modules/opencode-{os}-{arch}/bin\n\
                 printf '#!/bin/sh\\n' > node_modules/opencode-{os}-{arch}/bin/opencode\n\
                 chmod +x node_modules/opencode-{os}-{arch}/bin/opencode\n",
                os = std::env::consts::OS
            ),
        )
        .unwrap();
        let cache = dir.path().join("cache");
        let path = format!("{}:/usr/bin:/bin", bin.display());
        let env = Env::from_pairs([(PATH, path.as_str())]);
        let found = locate(&env, "1.18.33", &cache).await.unwrap();
        assert!(matches!(found, Located::Installed(_)), "{found:?}");
        assert!(found.path().starts_with(cache.join("opencode-1.18.33")));
        let args = std::fs::read_to_string(cache.join("opencode-1.18.33/args.txt")).unwrap();
        assert!(
            args.contains("install") && args.contains("opencode-ai@1.18.33"),
            "{args}"
        );

        // A failing npm is an install error carrying npm's message.
        std::fs::write(&npm, "#!/bin/sh\necho 'E404 no such package' >&2\nexit 1\n").unwrap();
        let err = locate(&env, "0.0.1", &cache).await.unwrap_err();
        assert!(matches!(err, LocateError::Install { .. }));
        assert!(err.to_string().contains("E404"), "{err}");
    }

    #[tokio::test]
    async fn a_previous_install_in_the_cache_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let arch = match std::env::consts::ARCH {
            "x86_64" => "x64",
            "aarch64" => "arm64",
            other => other,
        };
        let bin_dir = cache.join(format!(
            "opencode-9.9.9/node_modules/opencode-{}-{arch}/bin",
            std::env::consts::OS
        ));
        std::fs::create_dir_all(&bin_dir).unwrap();
        let oc = exe(&bin_dir, "opencode");
        let env = Env::from_pairs([(PATH, "/nonexistent")]);
        assert_eq!(
            locate(&env, "9.9.9", &cache).await.unwrap(),
            Located::Installed(oc)
        );
    }
}
