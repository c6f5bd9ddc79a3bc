//! The agent's system-call filter (docs/security.md#the-agents-network), on top of the runner's
//! own (Docker's default profile). Landlock's TCP rules cover TCP only, so the sockets it cannot
//! judge are refused here, with `EPERM`:
//!
//! - IP sockets other than TCP streams: no UDP (so no DNS or QUIC from the agent), no raw or ICMP
//!   sockets, no SCTP or other protocols behind `SOCK_STREAM`; families other than Unix, IPv4,
//!   IPv6 and netlink;
//! - a TCP Fast Open send (`MSG_FASTOPEN`), which connects without `connect(2)`;
//! - `io_uring_*`, whose requests do not pass through these checks; `ptrace` and
//!   `process_vm_readv`/`writev`;
//! - any other architecture's calls (the i386 `int 0x80` entry) and x32 numbers.
//!
//! [`Filter::no_ip`] is stacked on the agent's commands when `agent-network: none`: no IP socket
//! at all. The program is compiled before `fork`; [`Filter::install`] is one `prctl`.

use std::collections::BTreeMap;

use seccompiler::{
    SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond,
    SeccompFilter, SeccompRule, TargetArch,
};

#[derive(Debug, thiserror::Error)]
#[error("cannot build the agent's system-call filter")]
pub struct FilterError {
    #[source]
    source: seccompiler::BackendError,
}

impl From<seccompiler::BackendError> for FilterError {
    fn from(source: seccompiler::BackendError) -> Self {
        FilterError { source }
    }
}

/// A compiled filter.
#[derive(Debug, Clone)]
pub struct Filter {
    program: Vec<libc::sock_filter>,
}

#[cfg(target_arch = "x86_64")]
const ARCH: (TargetArch, u32) = (TargetArch::x86_64, 0xC000_003E);
#[cfg(target_arch = "aarch64")]
const ARCH: (TargetArch, u32) = (TargetArch::aarch64, 0xC000_00B7);

const EPERM: u32 = libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA);

fn cond(arg: u8, op: Op, value: u64) -> Result<Cond, seccompiler::BackendError> {
    Cond::new(arg, Len::Dword, op, value)
}

fn rule(conds: Vec<Cond>) -> Result<SeccompRule, seccompiler::BackendError> {
    SeccompRule::new(conds)
}

/// `socket(2)` calls refused to every process of the agent.
fn socket_rules() -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let fam = |f: i32| cond(0, Op::Eq, f as u64);
    let mut rules = vec![rule(vec![
        cond(0, Op::Ne, libc::AF_UNIX as u64)?,
        cond(0, Op::Ne, libc::AF_INET as u64)?,
        cond(0, Op::Ne, libc::AF_INET6 as u64)?,
        cond(0, Op::Ne, libc::AF_NETLINK as u64)?,
    ])?];
    for f in [libc::AF_INET, libc::AF_INET6] {
        // The type's low nibble (the flags above it are SOCK_NONBLOCK/SOCK_CLOEXEC) must be
        // SOCK_STREAM, 0b0001: refused when any of bits 1-3 is set or the nibble is 0.
        for bit in [0x2, 0x4, 0x8] {
            rules.push(rule(vec![fam(f)?, cond(1, Op::MaskedEq(bit), bit)?])?);
        }
        rules.push(rule(vec![fam(f)?, cond(1, Op::MaskedEq(0xf), 0)?])?);
        // Behind SOCK_STREAM only TCP (0 or IPPROTO_TCP): SCTP and MPTCP are not Landlock's TCP.
        rules.push(rule(vec![
            fam(f)?,
            cond(2, Op::Ne, 0)?,
            cond(2, Op::Ne, libc::IPPROTO_TCP as u64)?,
        ])?);
    }
    Ok(rules)
}

fn fast_open(flags_arg: u8) -> Result<Vec<SeccompRule>, seccompiler::BackendError> {
    let bit = libc::MSG_FASTOPEN as u64;
    Ok(vec![rule(vec![cond(flags_arg, Op::MaskedEq(bit), bit)?])?])
}

/// Refuses every call of another architecture, and x32 numbers, before the compiled rules.
fn prologue() -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
    let mut p = vec![
        stmt(ld, 4), // seccomp_data.arch
        jump(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, ARCH.1, 1, 0),
        stmt(libc::BPF_RET | libc::BPF_K, EPERM),
    ];
    if cfg!(target_arch = "x86_64") {
        p.extend([
            stmt(ld, 0), // seccomp_data.nr
            jump(
                libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K,
                0x4000_0000,
                0,
                1,
            ),
            stmt(libc::BPF_RET | libc::BPF_K, EPERM),
        ]);
    }
    p
}

impl Filter {
    fn compile(rules: BTreeMap<i64, Vec<SeccompRule>>) -> Result<Filter, FilterError> {
        let filter = SeccompFilter::new(
            rules,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            ARCH.0,
        )?;
        let compiled: seccompiler::BpfProgram = filter.try_into()?;
        let mut program = prologue();
        program.extend(compiled.iter().map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        }));
        Ok(Filter { program })
    }

    /// The filter of every process of the agent: OpenCode and all it starts.
    pub fn agent() -> Result<Filter, FilterError> {
        let mut rules = BTreeMap::new();
        rules.insert(libc::SYS_socket, socket_rules()?);
        rules.insert(
            libc::SYS_socketpair,
            vec![rule(vec![cond(0, Op::Ne, libc::AF_UNIX as u64)?])?],
        );
        rules.insert(libc::SYS_sendto, fast_open(3)?);
        rules.insert(libc::SYS_sendmsg, fast_open(2)?);
        rules.insert(libc::SYS_sendmmsg, fast_open(3)?);
        for call in [
            libc::SYS_io_uring_setup,
            libc::SYS_io_uring_enter,
            libc::SYS_io_uring_register,
            libc::SYS_ptrace,
            libc::SYS_process_vm_readv,
            libc::SYS_process_vm_writev,
        ] {
            rules.insert(call, Vec::new());
        }
        Self::compile(rules)
    }

    /// Stacked on the agent's commands under `agent-network: none`: no IPv4 or IPv6 socket.
    pub fn no_ip() -> Result<Filter, FilterError> {
        let mut rules = BTreeMap::new();
        rules.insert(
            libc::SYS_socket,
            vec![
                rule(vec![cond(0, Op::Eq, libc::AF_INET as u64)?])?,
                rule(vec![cond(0, Op::Eq, libc::AF_INET6 as u64)?])?,
            ],
        );
        Self::compile(rules)
    }

    /// Installs the filter on the calling thread; `no_new_privs` must be set. Async-signal-safe
    /// (no allocation), for use between `fork` and `exec`.
    pub fn install(&self) -> std::io::Result<()> {
        let prog = libc::sock_fprog {
            len: self.program.len() as u16,
            filter: self.program.as_ptr() as *mut libc::sock_filter,
        };
        // SAFETY: `prog` points at a live program of `len` instructions; the kernel copies it.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &prog as *const libc::sock_fprog,
                0,
                0,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}
