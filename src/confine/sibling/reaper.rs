//! The relay is the sibling's PID 1: every process there whose parent ends becomes its child, so
//! one thread reaps them all (`waitpid(-1)`) and tells each command's connection how its own
//! shell ended. A command is registered under the table's lock while it is spawned, so its end
//! is never reaped before someone waits for it.

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::wire::Note;

#[derive(Clone)]
pub struct Reaper {
    inner: Arc<Inner>,
}

struct Inner {
    table: Mutex<Table>,
    spawned: Condvar,
}

#[derive(Default)]
struct Table {
    waiting: HashMap<i32, Sender<Note>>,
    /// Bumped at each spawn: a reaper that found no child knows whether one came since.
    generation: u64,
}

impl Reaper {
    pub fn start() -> Reaper {
        let reaper = Reaper {
            inner: Arc::new(Inner {
                table: Mutex::new(Table::default()),
                spawned: Condvar::new(),
            }),
        };
        let r = reaper.clone();
        std::thread::spawn(move || r.reap());
        reaper
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        // A poisoned table still holds valid senders: nothing panics while holding it.
        self.inner.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Spawns `cmd`; the receiver gets how it ended.
    pub fn spawn(&self, cmd: &mut std::process::Command) -> std::io::Result<(i32, Receiver<Note>)> {
        let mut table = self.lock();
        let child = cmd.spawn()?;
        let pid = child.id() as i32;
        let (tx, rx) = channel();
        table.waiting.insert(pid, tx);
        table.generation += 1;
        drop(table);
        self.inner.spawned.notify_all();
        Ok((pid, rx))
    }

    /// Kills the process group of every command still running.
    pub fn kill_all(&self) {
        for pid in self.lock().waiting.keys() {
            // SAFETY: a plain kill of a command's process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }

    fn reap(&self) {
        loop {
            let generation = self.lock().generation;
            let mut status = 0;
            // SAFETY: waitpid with an out-pointer to a local.
            let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
            if pid > 0 {
                if let Some(tx) = self.lock().waiting.remove(&pid) {
                    let _ = tx.send(note(status));
                }
                continue;
            }
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            // No child: wait for the next spawn.
            let table = self.lock();
            if table.generation == generation {
                let _ = self
                    .inner
                    .spawned
                    .wait_timeout(table, Duration::from_secs(1));
            }
        }
    }
}

fn note(status: i32) -> Note {
    if libc::WIFEXITED(status) {
        Note::Exited(libc::WEXITSTATUS(status))
    } else {
        Note::Killed(libc::WTERMSIG(status))
    }
}
