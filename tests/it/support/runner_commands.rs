//! The GitHub Actions runner's workflow-command parser, reimplemented from its behaviour
//! (`ActionCommandManager.TryProcessCommand`, `ActionCommand.TryParseV2`/`TryParse`) to read a
//! step's log as the runner does: lines end at `\n`, a bare `\r` or `\r\n` (.NET's `ReadLine`);
//! a line is a command when, after leading whitespace, it starts `::name …::data` (v2), or when it
//! holds `##[name …]data` anywhere (v1); names are case-insensitive and must be registered;
//! `stop-commands` pauses every command until a line names its token. The runner compares with
//! .NET's culture-sensitive `StartsWith`/`IndexOf`, which can skip invisible characters, so
//! [`Reading::SkippingInvisibles`] also tries each line with those removed (a superset).
//!
//! Kept independent of fro-bot's own line splitting on purpose: it is the judge of it.

/// Every command the runner registers (plus `stop-commands`, which it handles itself).
const REGISTERED: &[&str] = &[
    "stop-commands",
    "set-env",
    "set-output",
    "save-state",
    "add-mask",
    "add-path",
    "add-matcher",
    "remove-matcher",
    "debug",
    "warning",
    "error",
    "notice",
    "group",
    "endgroup",
    "echo",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    /// Lower-cased, as the runner matches it.
    pub name: String,
    pub properties: Vec<(String, String)>,
    pub data: String,
    /// The log line it came from.
    pub line: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Ordinal comparison (the runner with invariant globalization).
    Ordinal,
    /// Invisible characters removed first (the runner comparing with ICU's culture rules).
    SkippingInvisibles,
}

/// The lines of a step's output as the runner reads them.
pub fn lines(output: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = output;
    while !rest.is_empty() {
        match rest.find(['\r', '\n']) {
            None => {
                out.push(rest);
                break;
            }
            Some(at) => {
                out.push(&rest[..at]);
                let skip = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
                rest = &rest[at + skip..];
            }
        }
    }
    out
}

/// The commands the runner would carry out for this output, in order, with `stop-commands` and
/// its resume token honoured.
pub fn commands(output: &str, reading: Reading) -> Vec<Command> {
    let mut stopped: Option<String> = None;
    let mut found = Vec::new();
    for line in lines(output) {
        let Some(command) = parse(line, reading, stopped.as_deref()) else {
            continue;
        };
        match &stopped {
            Some(token) if command.name == *token => stopped = None,
            Some(_) => continue,
            None if command.name == "stop-commands" => {
                stopped = Some(command.data.to_lowercase());
            }
            None => {}
        }
        found.push(command);
    }
    found
}

fn parse(line: &str, reading: Reading, token: Option<&str>) -> Option<Command> {
    let registered = |name: &str| {
        let name = name.to_lowercase();
        REGISTERED.contains(&name.as_str()) || token == Some(name.as_str())
    };
    let seen = match reading {
        Reading::Ordinal => line.to_string(),
        Reading::SkippingInvisibles => line.chars().filter(|c| !invisible(*c)).collect(),
    };
    let mut command = parse_v2(&seen, &registered).or_else(|| parse_v1(&seen, &registered))?;
    command.line = line.to_string();
    Some(command)
}

/// `::name k=v,k=v::data` after leading whitespace.
fn parse_v2(line: &str, registered: &dyn Fn(&str) -> bool) -> Option<Command> {
    let line = line.trim_start();
    let rest = line.strip_prefix("::")?;
    let end = rest.find("::")?;
    let info = &rest[..end];
    let (name, props) = match info.find(' ') {
        Some(at) => (&info[..at], Some(info[at + 1..].trim())),
        None => (info, None),
    };
    if !registered(name) {
        return None;
    }
    let properties = props.map_or_else(Vec::new, |p| pairs(p, ','));
    Some(Command {
        name: name.to_lowercase(),
        properties,
        data: unescape_data(&rest[end + 2..]),
        line: String::new(),
    })
}

/// `##[name k=v;k=v]data` anywhere in the line.
fn parse_v1(line: &str, registered: &dyn Fn(&str) -> bool) -> Option<Command> {
    let start = line.find("##[")?;
    let close = start + line[start..].find(']')?;
    let info = &line[start + 3..close];
    let (name, props) = match info.find(' ') {
        Some(at) => (&info[..at], Some(&info[at + 1..])),
        None => (info, None),
    };
    if !registered(name) {
        return None;
    }
    Some(Command {
        name: name.to_lowercase(),
        properties: props.map_or_else(Vec::new, |p| pairs(p, ';')),
        data: unescape_data(&line[close + 1..]),
        line: String::new(),
    })
}

fn pairs(props: &str, separator: char) -> Vec<(String, String)> {
    props
        .split(separator)
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.split_once('='))
        .filter(|(k, v)| !k.is_empty() && !v.is_empty())
        .map(|(k, v)| (k.to_string(), unescape_data(v)))
        .collect()
}

fn unescape_data(s: &str) -> String {
    s.replace("%0D", "\r")
        .replace("%0A", "\n")
        .replace("%3A", ":")
        .replace("%2C", ",")
        .replace("%25", "%")
}

/// Characters a culture-sensitive comparison may pass over: controls that are not whitespace,
/// format characters (zero widths, bidi controls, soft hyphen, tags), variation selectors and
/// combining marks.
fn invisible(c: char) -> bool {
    let u = c as u32;
    (c.is_control() && !c.is_whitespace())
        || matches!(u,
            0x00AD | 0x034F | 0x061C | 0x115F | 0x1160 | 0x180B..=0x180F | 0x200B..=0x200F
            | 0x202A..=0x202E | 0x2060..=0x206F | 0x3164 | 0xFE00..=0xFE0F | 0xFEFF
            | 0xFFA0 | 0xFFF0..=0xFFFB | 0xE0000..=0xE0FFF | 0x0300..=0x036F)
}
