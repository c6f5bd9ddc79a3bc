//! Live progress of a turn: OpenCode's events turned into lines a person can follow while the agent
//! works (tool calls with their titles and outcome, the agent's text, its todo list), each stamped
//! with the time since the turn started. Lines go through the log, which redacts secrets.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::events::{Event, Part, Todo, ToolStatus};

/// Longest stretch of the agent's text printed at once; the rest is counted, not shown (the
/// answer itself is posted whole).
const MAX_TEXT_CHARS: usize = 2000;

/// What a turn's events have shown so far, and the lines they make.
#[derive(Debug)]
pub struct Progress {
    started: Instant,
    assistant_messages: HashSet<String>,
    /// Per tool call: the last status printed, so each transition prints once.
    tools: HashMap<String, Printed>,
    texts_printed: HashSet<String>,
    todos: Vec<Todo>,
    current_step: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Printed {
    Started,
    Finished,
}

impl Progress {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            assistant_messages: HashSet::new(),
            tools: HashMap::new(),
            texts_printed: HashSet::new(),
            todos: Vec::new(),
            current_step: None,
        }
    }

    /// The lines this event adds (often none: most events repeat what was already said).
    pub fn observe(&mut self, event: &Event, now: Instant) -> Vec<String> {
        let stamp = elapsed(now.saturating_duration_since(self.started));
        match event {
            Event::MessageUpdated {
                message_id, role, ..
            } => {
                if role == "assistant" {
                    self.assistant_messages.insert(message_id.clone());
                }
                vec![]
            }
            Event::PartUpdated {
                message_id, part, ..
            } => self.part(message_id, part, &stamp),
            Event::TodoUpdated { todos, .. } => {
                self.todos = todos.clone();
                vec![format!("{stamp} todo: {}", todo_line(todos))]
            }
            Event::ServerConnected
            | Event::SessionIdle { .. }
            | Event::SessionError { .. }
            | Event::SessionStatus { .. }
            | Event::Other { .. } => vec![],
        }
    }

    fn part(&mut self, message_id: &str, part: &Part, stamp: &str) -> Vec<String> {
        match part {
            Part::Tool {
                call_id,
                tool,
                status,
                title,
            } => {
                let what = match title {
                    Some(t) => format!("{tool} — {}", one_line(t)),
                    None => tool.clone(),
                };
                let (mark, printed) = match status {
                    ToolStatus::Pending | ToolStatus::Other { .. } => return vec![],
                    ToolStatus::Running => ("▶", Printed::Started),
                    ToolStatus::Completed => ("✓", Printed::Finished),
                    ToolStatus::Error { .. } => ("✗", Printed::Finished),
                };
                let before = self.tools.insert(call_id.clone(), printed);
                if before == Some(printed) || before == Some(Printed::Finished) {
                    return vec![];
                }
                self.current_step = (printed == Printed::Started).then(|| what.clone());
                let mut line = format!("{stamp} {mark} {what}");
                if let ToolStatus::Error { message } = status {
                    let _ = write!(line, ": {}", one_line(message));
                }
                vec![line]
            }
            Part::Text { id, text, done } => {
                let theirs = self.assistant_messages.contains(message_id);
                if !theirs
                    || !done
                    || text.trim().is_empty()
                    || !self.texts_printed.insert(id.clone())
                {
                    return vec![];
                }
                text_lines(stamp, text)
            }
            Part::StepStart | Part::StepFinish | Part::Other { .. } => vec![],
        }
    }

    pub fn todos(&self) -> &[Todo] {
        &self.todos
    }

    /// The tool call running now, if any.
    pub fn current_step(&self) -> Option<&str> {
        self.current_step.as_deref()
    }
}

/// Where progress lines go: the log in a run, a collector in tests.
#[derive(Clone)]
pub struct ProgressSink {
    state: Arc<Mutex<Progress>>,
    emit: Arc<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

impl ProgressSink {
    pub fn new(emit: impl Fn(&str) + Send + Sync + 'static) -> Self {
        Self {
            state: Arc::new(Mutex::new(Progress::new(Instant::now()))),
            emit: Arc::new(emit),
        }
    }

    /// Plain lines through the log (inside the Agent group on a runner), redacted like every line.
    pub fn log() -> Self {
        Self::new(|line| tracing::info!("{line}"))
    }

    pub fn observe(&self, event: &Event) {
        // A poisoned lock only means an earlier line panicked mid-way: the state is still usable.
        let lines = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.observe(event, Instant::now())
        };
        for line in lines {
            (self.emit)(&line);
        }
    }

    /// The todo list and current step, for a tracking comment.
    pub fn snapshot(&self) -> (Vec<Todo>, Option<String>) {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (state.todos.clone(), state.current_step.clone())
    }
}

fn elapsed(d: Duration) -> String {
    let s = d.as_secs();
    format!("[{}:{:02}]", s / 60, s % 60)
}

fn one_line(text: &str) -> String {
    // Redacted whole first: flattening or cutting could split a secret the log would then miss.
    let flat: String = crate::redact::redact(text)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    truncate(&flat, 200)
}

/// The agent's text as indented lines, split where the runner splits them (a bare `\r` too); the
/// log's writer makes each inert (`runner::lines`).
fn text_lines(stamp: &str, text: &str) -> Vec<String> {
    // Redacted whole first: each line is logged on its own, and a PEM block or a multi-line secret
    // is only recognizable whole.
    let shown = truncate(crate::redact::redact(text).trim(), MAX_TEXT_CHARS);
    let mut out = vec![format!("{stamp} agent:")];
    out.extend(
        crate::runner::lines::split(&shown)
            .into_iter()
            .map(|l| format!("    {l}")),
    );
    out
}

fn todo_line(todos: &[Todo]) -> String {
    if todos.is_empty() {
        return "(empty)".into();
    }
    let items: Vec<String> = todos
        .iter()
        .map(|t| {
            let mark = match t.status.as_str() {
                "completed" => "[x]",
                "in_progress" => "[~]",
                "cancelled" => "[-]",
                _ => "[ ]",
            };
            format!("{mark} {}", one_line(&t.content))
        })
        .collect();
    items.join(" · ")
}

fn truncate(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        None => text.to_string(),
        Some((cut, _)) => {
            let rest = text[cut..].chars().count();
            format!("{}… ({rest} more characters)", &text[..cut])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(call: &str, status: ToolStatus, title: Option<&str>) -> Event {
        Event::PartUpdated {
            session_id: "s".into(),
            message_id: "m".into(),
            part: Part::Tool {
                call_id: call.into(),
                tool: "bash".into(),
                status,
                title: title.map(str::to_string),
            },
        }
    }

    fn text(message: &str, id: &str, body: &str, done: bool) -> Event {
        Event::PartUpdated {
            session_id: "s".into(),
            message_id: message.into(),
            part: Part::Text {
                id: id.into(),
                text: body.into(),
                done,
            },
        }
    }

    #[test]
    fn each_tool_transition_prints_once_with_the_elapsed_time() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let at = |s| t0 + Duration::from_secs(s);
        assert!(p
            .observe(&tool("c1", ToolStatus::Pending, None), at(1))
            .is_empty());
        assert_eq!(
            p.observe(&tool("c1", ToolStatus::Running, Some("List files")), at(2)),
            ["[0:02] ▶ bash — List files"]
        );
        assert_eq!(p.current_step(), Some("bash — List files"));
        // OpenCode repeats `running` as output streams in: nothing new to say.
        assert!(p
            .observe(&tool("c1", ToolStatus::Running, Some("List files")), at(3))
            .is_empty());
        assert_eq!(
            p.observe(&tool("c1", ToolStatus::Completed, Some("ls -la")), at(75)),
            ["[1:15] ✓ bash — ls -la"]
        );
        assert_eq!(p.current_step(), None);
        assert!(p
            .observe(&tool("c1", ToolStatus::Completed, Some("ls")), at(76))
            .is_empty());
        let failed = ToolStatus::Error {
            message: "exit 2\nno such file".into(),
        };
        assert_eq!(
            p.observe(&tool("c2", failed, None), at(80)),
            ["[1:20] ✗ bash: exit 2 no such file"]
        );
    }

    #[test]
    fn only_the_agents_finished_text_is_printed_and_it_cannot_issue_workflow_commands() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let assistant = Event::MessageUpdated {
            session_id: "s".into(),
            message_id: "m2".into(),
            role: "assistant".into(),
        };
        assert!(p.observe(&assistant, t0).is_empty());
        // The user's prompt is a text part too, of a user message.
        assert!(p
            .observe(&text("m1", "p1", "the prompt", true), t0)
            .is_empty());
        assert!(p.observe(&text("m2", "p2", "half", false), t0).is_empty());
        let lines = p.observe(
            &text("m2", "p2", "Done.\n::add-mask::x\r  ::error::y", true),
            t0,
        );
        assert_eq!(
            lines,
            [
                "[0:00] agent:",
                "    Done.",
                "    ::add-mask::x",
                "      ::error::y"
            ]
        );
        assert!(p.observe(&text("m2", "p2", "Done.", true), t0).is_empty());
    }

    #[test]
    fn todos_are_kept_and_listed() {
        let t0 = Instant::now();
        let mut p = Progress::new(t0);
        let todos = vec![
            Todo {
                content: "Read the issue".into(),
                status: "completed".into(),
            },
            Todo {
                content: "Fix it".into(),
                status: "in_progress".into(),
            },
        ];
        let ev = Event::TodoUpdated {
            session_id: "s".into(),
            todos: todos.clone(),
        };
        assert_eq!(
            p.observe(&ev, t0),
            ["[0:00] todo: [x] Read the issue · [~] Fix it"]
        );
        assert_eq!(p.todos(), todos.as_slice());
    }

    #[test]
    fn a_multi_line_secret_is_redacted_whole_before_lines_are_split() {
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEAprogressKeyBody0\n-----END RSA PRIVATE KEY-----";
        let lines = text_lines("[0:01]", &format!("Here:\n{pem}\ndone"));
        assert_eq!(lines, ["[0:01] agent:", "    Here:", "    ***", "    done"]);
        assert!(!one_line(pem).contains("progressKeyBody"));
    }

    #[test]
    fn long_text_is_cut_with_a_count() {
        assert_eq!(truncate("abcdef", 4), "abcd… (2 more characters)");
        assert_eq!(truncate("ab", 4), "ab");
    }
}
