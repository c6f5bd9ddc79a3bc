//! Landlock's TCP rules (ABI 4, Linux 6.7): after [`restrict`], the process and everything it
//! starts may connect to and bind only the TCP ports a ruleset lists, whatever the address — the
//! kernel's rules know ports, not hosts (docs/security.md#the-agents-network). From ABI 6 the
//! domain also may not reach abstract Unix sockets made outside it.
//!
//! Raw system calls rather than a crate: the ruleset is made before `fork`, and the child only
//! calls `landlock_restrict_self` between `fork` and `exec`, where nothing may allocate.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The first ABI with TCP rules.
pub const MIN_ABI: i64 = 4;
/// The first ABI that scopes abstract Unix sockets.
const SCOPE_ABI: i64 = 6;

const CREATE_RULESET_VERSION: u32 = 1;
const RULE_NET_PORT: u32 = 2;
const ACCESS_NET_BIND_TCP: u64 = 1;
const ACCESS_NET_CONNECT_TCP: u64 = 2;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

/// What the kernel offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// Landlock at this ABI.
    Abi(i64),
    /// No Landlock: not built in, not enabled at boot, or a seccomp profile refuses its calls.
    Missing { errno: i32 },
}

impl Support {
    /// Whether TCP rules can be enforced.
    pub fn enforces_tcp(self) -> bool {
        matches!(self, Support::Abi(v) if v >= MIN_ABI)
    }

    /// For the one-line error: "Landlock ABI 3" / "no Landlock (…)".
    pub fn describe(self) -> String {
        match self {
            Support::Abi(v) => format!("the kernel's Landlock ABI is {v}"),
            Support::Missing { errno } => format!(
                "the kernel has no Landlock ({})",
                std::io::Error::from_raw_os_error(errno)
            ),
        }
    }
}

/// The running kernel's Landlock ABI. `lowered_to` (a test's failpoint) can only make it look
/// older, never newer.
pub fn support(lowered_to: Option<i64>) -> Support {
    // SAFETY: the version query takes no pointer (NULL, size 0).
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return Support::Missing { errno };
    }
    Support::Abi(lowered_to.map_or(v, |l| l.min(v)))
}

/// The TCP ports a domain may connect to and bind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetRules {
    pub connect: Vec<u16>,
    pub bind: Vec<u16>,
}

impl NetRules {
    /// A ruleset fd for these rules, to hand to [`restrict`]; made before `fork`.
    pub fn create(&self, abi: i64) -> std::io::Result<OwnedFd> {
        let attr = RulesetAttr {
            handled_access_fs: 0,
            handled_access_net: ACCESS_NET_BIND_TCP | ACCESS_NET_CONNECT_TCP,
            scoped: if abi >= SCOPE_ABI {
                SCOPE_ABSTRACT_UNIX_SOCKET
            } else {
                0
            },
        };
        // An older kernel knows a shorter struct: pass only what it knows.
        let size = if abi >= SCOPE_ABI {
            std::mem::size_of::<RulesetAttr>()
        } else {
            2 * std::mem::size_of::<u64>()
        };
        // SAFETY: `attr` is a live, properly laid out struct of at least `size` bytes.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const RulesetAttr,
                size,
                0u32,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the kernel returned a new fd (close-on-exec) that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let mut ports: Vec<(u16, u64)> = Vec::new();
        for (list, access) in [
            (&self.connect, ACCESS_NET_CONNECT_TCP),
            (&self.bind, ACCESS_NET_BIND_TCP),
        ] {
            for &port in list {
                match ports.iter_mut().find(|(p, _)| *p == port) {
                    Some((_, a)) => *a |= access,
                    None => ports.push((port, access)),
                }
            }
        }
        for (port, access) in ports {
            let rule = NetPortAttr {
                allowed_access: access,
                port: u64::from(port),
            };
            // SAFETY: `rule` is a live, properly laid out struct; the fd is ours.
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_landlock_add_rule,
                    fd.as_raw_fd(),
                    RULE_NET_PORT,
                    &rule as *const NetPortAttr,
                    0u32,
                )
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(fd)
    }
}

/// Restricts the calling thread (and what it executes) to `ruleset`. `no_new_privs` must be set.
/// Async-signal-safe: one system call, for use between `fork` and `exec`.
pub fn restrict(ruleset: RawFd) -> std::io::Result<()> {
    // SAFETY: a plain system call on an fd and a flag.
    let rc = unsafe { libc::syscall(libc::SYS_landlock_restrict_self, ruleset, 0u32) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lowered_abi_is_never_raised() {
        match support(None) {
            Support::Abi(v) => {
                assert_eq!(support(Some(2)), Support::Abi(2.min(v)));
                assert_eq!(support(Some(99)), Support::Abi(v));
                assert!(!support(Some(3)).enforces_tcp());
            }
            Support::Missing { .. } => panic!(
                "the suite needs a kernel with Landlock: {}",
                support(None).describe()
            ),
        }
    }
}
