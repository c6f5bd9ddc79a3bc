//! The memory group (docs/security.md#who-it-runs-as): only OpenCode reads and writes fro-bot's
//! memory dir during the turn, not the agent's shell, although both run as the agent's uid (the
//! one that can edit the checkout).
//!
//! - OpenCode starts with its *effective* gid [`MEMORY_GID`] and its real gid the agent's
//!   ([`crate::confine::AgentUser::confine_opencode`]); the memory dir is `root:MEMORY_GID 2770`
//!   for the turn ([`crate::confine::handover::Handover::give_dir_to_group`]), so only a process
//!   holding that gid can enter it.
//! - A process whose effective and real gids differ is not dumpable after `exec`, so no process of
//!   the agent's uid can attach to OpenCode or to anything it starts (ripgrep, the session tools),
//!   nor read their `/proc/<pid>/fd`.
//! - OpenCode runs its shell tool's commands with `$SHELL`: a script whose interpreter is fro-bot
//!   ([`wrapper_script`]). It sets all three gids to the real one (an unprivileged process may),
//!   drops OpenCode's own variables ([`OPENCODE_ONLY`]) and only then executes the real shell
//!   ([`exec_agent_shell`]). Everything the agent runs descends from that shell.
//! - OpenCode's own git (its snapshots are off, but it still runs git) reads no global or system
//!   config ([`opencode_git_env`]): the agent's shell writes its home's `.gitconfig`, and a filter
//!   named there would otherwise run with the memory group.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::runner::env;

/// The memory group: a gid no user of an image or runner is given (65534 is `nogroup`).
pub const MEMORY_GID: u32 = 65533;

/// The first argument fro-bot gets as the wrapper's interpreter (`#!<fro-bot> --agent-shell=<sh>`).
pub const AGENT_SHELL_ARG: &str = "--agent-shell=";

/// Variables OpenCode holds that its shell tool's commands must not inherit: its own secrets, and
/// the git settings meant only for its own git.
pub const OPENCODE_ONLY: &[&str] = &[
    env::OPENCODE_SERVER_PASSWORD,
    env::OPENCODE_CONFIG_CONTENT,
    env::GIT_CONFIG_GLOBAL,
    env::GIT_CONFIG_NOSYSTEM,
    env::FRO_BOT_AGENT_NETWORK,
    env::FRO_BOT_AGENT_SIBLING,
];

/// The Linux limit on a `#!` line, with its newline.
const SHEBANG_MAX: usize = 255;

/// OpenCode's own git reads neither the agent's `~/.gitconfig` nor the system's.
pub fn opencode_git_env() -> Vec<(String, String)> {
    vec![
        (env::GIT_CONFIG_GLOBAL.to_string(), "/dev/null".to_string()),
        (env::GIT_CONFIG_NOSYSTEM.to_string(), "1".to_string()),
    ]
}

/// The `$SHELL` script that has fro-bot drop the memory group before `real_shell` runs; `None`
/// when the `#!` line would be too long or either path is not plain UTF-8 without spaces at its
/// ends (the kernel would split or trim it).
pub fn wrapper_script(fro_bot: &Path, real_shell: &Path) -> Option<String> {
    let (exe, shell) = (fro_bot.to_str()?, real_shell.to_str()?);
    let clean = |s: &str| !s.is_empty() && s.trim() == s && !s.contains(['\n', '\0']);
    let line = format!("#!{exe} {AGENT_SHELL_ARG}{shell}");
    (clean(exe) && !exe.contains([' ', '\t']) && clean(shell) && line.len() < SHEBANG_MAX)
        .then(|| format!("{line}\n"))
}

/// When fro-bot was started as the wrapper's interpreter: the real shell, and the arguments for
/// it (OpenCode's `-c <command>`). `args` are the process's, program name first.
pub fn invoked_as_shell(args: &[OsString]) -> Option<(OsString, Vec<OsString>)> {
    let first = args.get(1)?.as_bytes();
    let real = first.strip_prefix(AGENT_SHELL_ARG.as_bytes())?;
    // args[2] is the script's own path, which the kernel passes after the `#!` argument.
    let rest = args.get(3..).unwrap_or_default().to_vec();
    Some((std::ffi::OsStr::from_bytes(real).to_os_string(), rest))
}

/// The wrapper: every gid becomes the real one, the agent's commands get their narrower network
/// ([`crate::confine::network::narrow_commands`]), OpenCode's variables go, then the real shell
/// replaces this process. Returns only on failure, having run nothing.
pub fn exec_agent_shell(real: &OsString, rest: &[OsString]) -> std::io::Error {
    use std::os::unix::process::CommandExt;
    if let Err(e) = drop_memory_group() {
        return e;
    }
    if let Some(spec) = std::env::var_os(env::FRO_BOT_AGENT_NETWORK) {
        let narrowed = spec
            .to_str()
            .ok_or_else(|| std::io::Error::other("the agent's network setting is not UTF-8"))
            .and_then(|s| {
                crate::confine::network::narrow_commands(s).map_err(std::io::Error::other)
            });
        if let Err(e) = narrowed {
            return e;
        }
    }
    let mut cmd = std::process::Command::new(real);
    cmd.args(rest);
    for name in OPENCODE_ONLY {
        cmd.env_remove(name);
    }
    cmd.exec()
}

/// What OpenCode made in the checkout during the turn carries the memory group: it gets
/// `agent_gid` back, as if the agent's shell had made it. Call with no process of the agent left.
/// Returns how many entries changed.
pub fn regroup(root: &Path, group: u32, agent_gid: u32) -> std::io::Result<usize> {
    use std::os::unix::fs::MetadataExt;
    let mut changed = 0;
    super::handover::walk(root, &mut |p, m| {
        if m.gid() == group {
            std::os::unix::fs::lchown(p, None, Some(agent_gid))?;
            changed += 1;
        }
        Ok(())
    })?;
    Ok(changed)
}

/// Every gid becomes the real one (the wrapper, before anything of the agent's runs).
pub(crate) fn drop_memory_group() -> std::io::Result<()> {
    // SAFETY: plain id syscalls on integers and out-pointers to locals.
    unsafe {
        let gid = libc::getgid();
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let (mut r, mut e, mut s) = (0, 0, 0);
        if libc::getresgid(&mut r, &mut e, &mut s) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Never run the agent's command with the group by accident.
        if (r, e, s) != (gid, gid, gid) {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_names_fro_bot_as_interpreter_and_the_real_shell_as_its_argument() {
        let s = wrapper_script(Path::new("/usr/local/bin/fro-bot"), Path::new("/bin/bash"));
        assert_eq!(
            s.as_deref(),
            Some("#!/usr/local/bin/fro-bot --agent-shell=/bin/bash\n")
        );
        let args: Vec<OsString> = [
            "/usr/local/bin/fro-bot",
            "--agent-shell=/bin/bash",
            "/tmp/x/bash",
            "-c",
            "echo hi",
        ]
        .map(OsString::from)
        .to_vec();
        let (real, rest) = invoked_as_shell(&args).unwrap();
        assert_eq!(real, "/bin/bash");
        assert_eq!(rest, ["-c", "echo hi"].map(OsString::from).to_vec());
        assert!(invoked_as_shell(&args[..1]).is_none());
        assert!(invoked_as_shell(&["fro-bot", "run"].map(OsString::from)).is_none());
    }

    #[test]
    fn what_opencode_made_in_the_checkout_gets_the_agents_gid_and_no_link_is_followed() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to chown");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::os::unix::fs::chown(&outside, None, Some(MEMORY_GID)).unwrap();
        let ws = t.path().join("ws");
        std::fs::create_dir_all(ws.join("src")).unwrap();
        for (name, gid) in [("src/new.rs", MEMORY_GID), ("old.rs", 1001)] {
            std::fs::write(ws.join(name), "x").unwrap();
            std::os::unix::fs::chown(ws.join(name), Some(1001), Some(gid)).unwrap();
        }
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        std::os::unix::fs::lchown(ws.join("link"), None, Some(MEMORY_GID)).unwrap();
        assert_eq!(regroup(&ws, MEMORY_GID, 1001).unwrap(), 2);
        let gid = |p: &Path| std::fs::symlink_metadata(p).unwrap().gid();
        assert_eq!(gid(&ws.join("src/new.rs")), 1001);
        assert_eq!(gid(&ws.join("link")), 1001);
        assert_eq!(gid(&outside), MEMORY_GID, "a link is never followed");
    }

    #[test]
    fn a_path_the_kernel_would_split_or_cut_gets_no_wrapper() {
        let long = format!("/{}", "a".repeat(300));
        assert!(wrapper_script(Path::new(&long), Path::new("/bin/bash")).is_none());
        assert!(wrapper_script(Path::new("/opt/my bin/fro-bot"), Path::new("/bin/sh")).is_none());
        assert!(wrapper_script(Path::new("/fro-bot"), Path::new("/bin/sh ")).is_none());
    }
}
