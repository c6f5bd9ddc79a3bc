//! The rewrite itself: the agent's Markdown is parsed (CommonMark with GitHub's tables,
//! strikethrough, task lists and footnotes), and every link, image, reference definition, raw
//! HTML fragment and bare URL whose target the [`LinkPolicy`] does not keep is rewritten in place
//! — the URL shown as code (and defanged, so it is no link even where GitHub's parser does not
//! see the span), the link text left as text — and the source as written is swept for what the
//! parser's events did not show. The result is parsed again, and rewritten again, until nothing
//! is left to rewrite; text that still has something after [`MAX_PASSES`] is posted whole as a
//! code block.

use std::ops::Range;

use pulldown_cmark::{
    CodeBlockKind, Event, LinkType, Options, Parser, Tag, TagEnd, TextMergeWithOffset,
};

use super::bare;
use super::fences;
use super::html;
use super::policy::{Change, LinkPolicy, Verdict};
use super::tags;

const MAX_PASSES: usize = 3;
/// The most of an inert URL shown; the rest is cut with "…".
const MAX_SHOWN: usize = 200;

/// What one rewrite did, for the summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A link, image or URL made inert; its host, when it has one.
    Inert { host: Option<String> },
    /// A URL to an allowed host cut to size.
    Cut { host: String },
    /// Text that kept coming back with something to rewrite, posted as a code block.
    Fenced,
}

impl From<&Change> for Finding {
    fn from(c: &Change) -> Finding {
        match c {
            Change::Cut { host, .. } => Finding::Cut { host: host.clone() },
            Change::Inert { host } => Finding::Inert { host: host.clone() },
        }
    }
}

/// The rewritten text and what was done to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    pub text: String,
    pub findings: Vec<Finding>,
}

/// `text` with every link the policy does not keep made inert (see the module's comment).
pub fn rewrite(text: &str, policy: &LinkPolicy) -> Rewritten {
    let mut current = text.to_string();
    let mut findings = Vec::new();
    for _ in 0..MAX_PASSES {
        let pass = plan(&current, policy);
        if pass.edits.is_empty() {
            return Rewritten {
                text: current,
                findings,
            };
        }
        findings.extend(pass.findings);
        match apply(&current, &pass.edits) {
            Some(next) => current = next,
            None => break,
        }
    }
    if plan(&current, policy).edits.is_empty() {
        return Rewritten {
            text: current,
            findings,
        };
    }
    findings.push(Finding::Fenced);
    let fence = "`".repeat(longest_backtick_run(text).max(2) + 1);
    Rewritten {
        text: format!("{fence}text\n{text}\n{fence}"),
        findings,
    }
}

/// One pass: replacements of source ranges, and what they do.
#[derive(Debug, Default)]
struct Pass {
    edits: Vec<(Range<usize>, String)>,
    findings: Vec<Finding>,
}

impl Pass {
    fn edit(&mut self, at: Range<usize>, with: String) {
        self.edits.push((at, with));
    }
}

fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_GFM
}

/// A link or image being read: its target and where its text lies.
struct Open {
    image: bool,
    link_type: LinkType,
    dest: String,
    at: Range<usize>,
    inner: Option<Range<usize>>,
}

impl Open {
    /// The link or image `event` starts, if it starts one.
    fn at_start(event: &Event, at: &Range<usize>) -> Option<Open> {
        let (image, link_type, dest) = match event {
            Event::Start(Tag::Link {
                link_type,
                dest_url,
                ..
            }) => (false, *link_type, dest_url),
            Event::Start(Tag::Image {
                link_type,
                dest_url,
                ..
            }) => (true, *link_type, dest_url),
            _ => return None,
        };
        Some(Open {
            image,
            link_type,
            dest: dest.to_string(),
            at: at.clone(),
            inner: None,
        })
    }
}

/// What one pass would rewrite in `text`.
fn plan(text: &str, policy: &LinkPolicy) -> Pass {
    let ctx = Ctx {
        text,
        policy,
        fence: "`".repeat(longest_backtick_run(text) + 1),
    };
    let parser = Parser::new_ext(text, options());
    let mut pass = Pass::default();
    ctx.definitions(&parser, &mut pass);
    let mut walk = Walk::default();
    for (event, at) in TextMergeWithOffset::new(parser.into_offset_iter()) {
        walk.event(&ctx, event, at, &mut pass);
    }
    if let Some(group) = walk.html {
        ctx.html(group, &mut pass);
    }
    ctx.sweep(&walk.code, &walk.soft, &mut pass);
    ctx.fences(&walk.soft, &mut pass);
    pass.edits.sort_by_key(|(at, _)| (at.start, at.end));
    pass
}

/// Where [`plan`]'s walk over the parser's events is.
#[derive(Default)]
struct Walk {
    /// The links and images being read, innermost last.
    open: Vec<Open>,
    code_depth: usize,
    code: Vec<Range<usize>>,
    /// Code not every parser may read as code: a URL in it is defanged, not wrapped.
    soft: Vec<Range<usize>>,
    containers: usize,
    /// Raw HTML read so far, checked as one piece when it ends.
    html: Option<Range<usize>>,
}

impl Walk {
    /// One event: a link or image read whole and checked at its end, anything else by
    /// [`Walk::other`].
    fn event(&mut self, ctx: &Ctx<'_>, event: Event<'_>, at: Range<usize>, pass: &mut Pass) {
        let is_html = matches!(event, Event::Html(_) | Event::InlineHtml(_));
        // Raw HTML continues across a line break and a container's `>` markers.
        let continues = |g: &Range<usize>| {
            is_html
                && ctx
                    .text
                    .get(g.end..at.start)
                    .is_some_and(|gap| gap.bytes().all(|b| b.is_ascii_whitespace() || b == b'>'))
        };
        if let Some(group) = self.html.take_if(|g| !continues(g)) {
            ctx.html(group, pass);
        }
        if let Event::End(TagEnd::Link | TagEnd::Image) = event {
            if let Some(o) = self.open.pop() {
                ctx.link(o, pass);
            }
            return;
        }
        if let Some(o) = self.open.last_mut() {
            let inner = o.inner.get_or_insert(at.clone());
            inner.end = inner.end.max(at.end);
        }
        match Open::at_start(&event, &at) {
            Some(o) => self.open.push(o),
            None => self.other(ctx, event, at, pass),
        }
    }

    /// An event outside a link's own start and end: code and containers counted, raw HTML
    /// grouped, text outside code swept for bare URLs.
    fn other(&mut self, ctx: &Ctx<'_>, event: Event<'_>, at: Range<usize>, pass: &mut Pass) {
        match event {
            Event::Start(Tag::CodeBlock(kind)) => {
                self.code_depth += 1;
                match firm_block(ctx.text, &kind, &at, self.containers) {
                    true => self.code.push(at),
                    false => self.soft.push(at),
                }
            }
            Event::Start(
                Tag::BlockQuote(_)
                | Tag::List(_)
                | Tag::Item
                | Tag::Table(_)
                | Tag::FootnoteDefinition(_),
            ) => self.containers += 1,
            Event::End(
                TagEnd::BlockQuote(_)
                | TagEnd::List(_)
                | TagEnd::Item
                | TagEnd::Table
                | TagEnd::FootnoteDefinition,
            ) => self.containers = self.containers.saturating_sub(1),
            // GitHub's parser can miss a span pulldown-cmark sees (after a backtick run without
            // a partner; across a container's line markers): what is in one is defanged.
            Event::Code(_) => self.soft.push(at),
            Event::End(TagEnd::CodeBlock) => self.code_depth = self.code_depth.saturating_sub(1),
            Event::Text(t) if self.code_depth == 0 && !in_autolink(&self.open) => {
                ctx.bare(&t, at, pass);
            }
            Event::Html(_) | Event::InlineHtml(_) => {
                self.html = Some(self.html.take().map_or(at.clone(), |g| g.start..at.end));
            }
            _ => {}
        }
    }
}

/// Whether every parser reads this code block as code: only a fence at the start of a line
/// outside any container, with no `<` since the last blank line (GitHub's parser may read the
/// fence as part of an HTML block opened there, which pulldown-cmark does not: after a block
/// quote's lazy line, for one); other blocks (indented, in a list, quote or table) are swept like
/// text.
fn firm_block(text: &str, kind: &CodeBlockKind, at: &Range<usize>, containers: usize) -> bool {
    let before = &text[..at.start];
    let line_start = before.is_empty() || before.ends_with('\n');
    let tag_before = before
        .lines()
        .rev()
        .take_while(|l| !l.trim().is_empty())
        .any(|l| l.contains('<'));
    matches!(kind, CodeBlockKind::Fenced(_)) && line_start && containers == 0 && !tag_before
}

/// How many rewrites `text` still calls for (0 for every text [`rewrite`] returns).
#[cfg(test)]
pub(super) fn pending(text: &str, policy: &LinkPolicy) -> usize {
    plan(text, policy).edits.len()
}

fn in_autolink(open: &[Open]) -> bool {
    open.iter()
        .any(|o| matches!(o.link_type, LinkType::Autolink | LinkType::Email))
}

/// What every rule of a pass reads.
struct Ctx<'a> {
    text: &'a str,
    policy: &'a LinkPolicy,
    /// A backtick run longer than any in the text, so an inserted code span pairs only with
    /// itself.
    fence: String,
}

impl Ctx<'_> {
    /// `shown` as an inline code span.
    fn code(&self, shown: &str) -> String {
        let mut s: String = shown
            .chars()
            .filter(|c| !c.is_control())
            .map(|c| match c {
                '`' => "%60".to_string(),
                '|' => "%7C".to_string(),
                c => c.to_string(),
            })
            .collect();
        if let Some((i, _)) = s.char_indices().nth(MAX_SHOWN) {
            s.truncate(i);
            s.push('…');
        }
        format!("{f} {} {f}", defang(&s), f = self.fence)
    }

    /// Reference definitions (`[label]: url`) the policy does not keep, shown as code.
    fn definitions(&self, parser: &Parser, pass: &mut Pass) {
        for (_, def) in parser.reference_definitions().iter() {
            let Verdict::Change(change) = self.policy.judge(&def.dest) else {
                continue;
            };
            let source = &self.text[def.span.clone()];
            let flat = source.split_whitespace().collect::<Vec<_>>().join(" ");
            let newline = if source.ends_with('\n') { "\n" } else { "" };
            pass.edit(def.span.clone(), format!("{}{newline}", self.code(&flat)));
            pass.findings.push(Finding::from(&change));
        }
    }

    /// A link or image: kept, cut (its target replaced) or made inert (its text stays, the URL
    /// follows as code).
    fn link(&self, o: Open, pass: &mut Pass) {
        let auto = matches!(o.link_type, LinkType::Autolink | LinkType::Email);
        let dest = match o.link_type {
            LinkType::Email => format!("mailto:{}", o.dest),
            _ => o.dest.clone(),
        };
        let Verdict::Change(change) = self.policy.judge(&dest) else {
            return;
        };
        pass.findings.push(Finding::from(&change));
        let inner = o.inner.filter(|i| !i.is_empty() && !auto);
        let bang = if o.image { "!" } else { "" };
        match (change, inner) {
            (Change::Cut { url, .. }, Some(inner)) => {
                pass.edit(inner.end..o.at.end, format!("]({})", angle(&url)));
            }
            (Change::Cut { url, .. }, None) if auto => pass.edit(o.at, angle(&url)),
            (Change::Cut { url, .. }, None) => {
                pass.edit(o.at, format!("{bang}[]({})", angle(&url)));
            }
            (Change::Inert { .. }, Some(inner)) => {
                let label = if o.image { "image: " } else { "" };
                pass.edit(o.at.start..inner.start, String::new());
                pass.edit(
                    inner.end..o.at.end,
                    format!(" ({label}{})", self.code(&dest)),
                );
            }
            (Change::Inert { .. }, None) => {
                let label = if o.image { "image: " } else { "" };
                pass.edit(o.at, format!("{label}{}", self.code(&dest)));
            }
        }
    }

    /// Bare URLs in one run of text (`decoded`, as the parser read the source at `at`).
    fn bare(&self, decoded: &str, at: Range<usize>, pass: &mut Pass) {
        let changed: Vec<(bare::Found, Change)> = bare::find(decoded)
            .into_iter()
            .filter_map(|f| match self.policy.judge(&f.url) {
                Verdict::Keep => None,
                Verdict::Change(c) => Some((f, c)),
            })
            .collect();
        if changed.is_empty() {
            return;
        }
        pass.findings
            .extend(changed.iter().map(|(_, c)| Finding::from(c)));
        let source = &self.text[at.clone()];
        if source == decoded {
            for (f, c) in changed {
                let with = self.bare_shown(&decoded[f.at.clone()], &c);
                pass.edit(at.start + f.at.start..at.start + f.at.end, with);
            }
            return;
        }
        // Escapes or references in the source: the whole run is written out again, escaped
        // (once: the escaped form reads back as the same text, so a later pass leaves it).
        let mut with = String::new();
        let mut from = 0;
        for (f, c) in changed {
            with.push_str(&escape(&decoded[from..f.at.start]));
            with.push_str(&self.bare_shown(&decoded[f.at.clone()], &c));
            from = f.at.end;
        }
        with.push_str(&escape(&decoded[from..]));
        if with != source {
            pass.edit(at, with);
        }
    }

    /// What the parser's events did not show: text it dropped (a table row's cells past the
    /// header's count, which GitHub may read as no table at all) is scanned as written, outside
    /// code and what this pass already rewrites. A tag holding a URL not kept, and a URL not
    /// kept, are shown as code.
    fn sweep(&self, code: &[Range<usize>], soft: &[Range<usize>], pass: &mut Pass) {
        let overlaps = |r: &Range<usize>, c: &Range<usize>| c.start < r.end && r.start < c.end;
        let taken = |r: &Range<usize>, pass: &Pass| {
            code.iter()
                .chain(pass.edits.iter().map(|(at, _)| at))
                .any(|c| overlaps(r, c))
        };
        // In code that may be code, the text is only defanged: wrapping it would show backticks.
        let shown = |r: &Range<usize>, inert: String| match soft.iter().any(|c| overlaps(r, c)) {
            true => defang(&self.text[r.clone()]),
            false => inert,
        };
        for lt in tags::starts(self.text) {
            let at = lt..lt + 1;
            if taken(&at, pass) {
                continue;
            }
            let Some(findings) = self.tag_findings(tags::reach(self.text, lt)) else {
                continue;
            };
            pass.findings.extend(findings);
            // As code is shown, a `&lt;` would show: there the `<` gets an invisible break.
            let with = match soft.iter().any(|c| overlaps(&at, c)) {
                true => format!("<{ZWSP}"),
                false => "&lt;".to_string(),
            };
            pass.edit(at, with);
        }
        for f in bare::find(self.text) {
            if taken(&f.at, pass) {
                continue;
            }
            if let Verdict::Change(c) = self.policy.judge(&f.url) {
                pass.findings.push(Finding::from(&c));
                let with = match c {
                    Change::Inert { .. } => shown(&f.at, self.code(&self.text[f.at.clone()])),
                    Change::Cut { .. } => self.bare_shown(&self.text[f.at.clone()], &c),
                };
                pass.edit(f.at, with);
            }
        }
        self.sweep_referenced(code, soft, pass);
    }

    /// Words written with character references (`https&#58;//…`) that spell a URL the policy
    /// does not keep, where the parser's events did not show them as text (code it reads and
    /// GitHub's parser may not, a definition it did not see): shown as code, or in code with the
    /// references broken (`defang`).
    fn sweep_referenced(&self, code: &[Range<usize>], soft: &[Range<usize>], pass: &mut Pass) {
        let overlaps = |r: &Range<usize>, c: &Range<usize>| c.start < r.end && r.start < c.end;
        for word in words(self.text).filter(|w| self.text[w.clone()].contains('&')) {
            let edited = pass.edits.iter().any(|(at, _)| overlaps(&word, at));
            if edited || code.iter().any(|c| overlaps(&word, c)) {
                continue;
            }
            let decoded = html::decode_known(&self.text[word.clone()]);
            let changes: Vec<Change> = bare::find(&decoded)
                .into_iter()
                .filter_map(|f| match self.policy.judge(&f.url) {
                    Verdict::Keep => None,
                    Verdict::Change(c) => Some(c),
                })
                .collect();
            if changes.is_empty() {
                continue;
            }
            pass.findings.extend(changes.iter().map(Finding::from));
            let source = &self.text[word.clone()];
            let with = match soft.iter().any(|c| overlaps(&word, c)) {
                true => defang(source),
                false => self.code(source),
            };
            pass.edit(word, with);
        }
    }

    fn bare_shown(&self, token: &str, change: &Change) -> String {
        match change {
            Change::Cut { url, .. } => angle(url),
            Change::Inert { .. } => self.code(token),
        }
    }

    /// A run of raw HTML holding a URL the policy does not keep as it is (or one it cannot
    /// read): every line of it shown as code.
    fn html(&self, group: Range<usize>, pass: &mut Pass) {
        let source = &self.text[group.clone()];
        let changes = self.html_changes(source);
        if changes.is_empty() {
            return;
        }
        pass.findings.extend(changes.iter().map(Finding::from));
        // Line by line: a code span cannot hold a blank line, and a container's markers
        // (`> `, list indents) at the start of each line stay outside it.
        let mut at = group.start;
        for line in source.split_inclusive('\n') {
            let body = line.trim_end_matches(['\n', '\r']);
            let lead = body.len() - body.trim_start().len();
            let shown = body.trim();
            if !shown.is_empty() {
                let start = at + lead;
                pass.edit(start..start + shown.len(), self.code(shown));
            }
            at += line.len();
        }
    }
}

impl Ctx<'_> {
    /// A fenced block GitHub renders itself (`fences::rendered`: Mermaid, GeoJSON, TopoJSON, STL,
    /// math) holding a URL the policy does not keep as it is: `text ` goes before its info
    /// string, so GitHub shows its source as code. Counted unless it sits in code the sweep
    /// already counts the URLs of (`soft`).
    fn fences(&self, soft: &[Range<usize>], pass: &mut Pass) {
        for fence in fences::rendered(self.text) {
            let at = fence.info;
            let changes: Vec<Change> = fences::urls(&self.text[fence.body])
                .iter()
                .filter_map(|u| match self.policy.judge(u) {
                    Verdict::Keep => None,
                    Verdict::Change(c) => Some(c),
                })
                .collect();
            // An edit over the info string: the next pass reads the fence again.
            let inside = |r: &Range<usize>| r.start < at && at < r.end;
            if changes.is_empty() || pass.edits.iter().any(|(r, _)| inside(r)) {
                continue;
            }
            if !soft.iter().any(|r| r.contains(&at)) {
                pass.findings.extend(changes.iter().map(Finding::from));
            }
            pass.edit(at..at, "text ".to_string());
        }
    }

    /// A tag as GitHub's parser may hand it to the browser (`tags::reach`, from its `<`): `None`
    /// when every URL in it stays as it is; else what to count when its `<` is escaped (a tag
    /// past `tags::MAX_REACH` is not read, and escaped). The URLs in it written out plainly are
    /// not counted here: the rewrite shows them as code on their own.
    fn tag_findings(&self, at: Range<usize>) -> Option<Vec<Finding>> {
        if at.len() > tags::MAX_REACH {
            return Some(Vec::new());
        }
        let source = &self.text[at];
        let unmarked = tags::unmarked(source);
        let mut urls = html::urls(source);
        for u in html::urls(&unmarked) {
            if !urls.contains(&u) {
                urls.push(u);
            }
        }
        let plain: Vec<String> = bare::find(source).into_iter().map(|f| f.url).collect();
        let mut changed = false;
        let mut findings = Vec::new();
        for url in urls {
            let (change, written) = match url {
                html::Url::Unreadable => (Change::Inert { host: None }, None),
                html::Url::Written(u) => match self.policy.judge(&u) {
                    Verdict::Keep => continue,
                    Verdict::Change(c) => (c, Some(u)),
                },
            };
            changed = true;
            if written.is_none_or(|u| !plain.contains(&u)) {
                findings.push(Finding::from(&change));
            }
        }
        changed.then_some(findings)
    }

    /// What the policy would change of the URLs in a fragment of raw HTML.
    fn html_changes(&self, source: &str) -> Vec<Change> {
        let mut changes = Vec::new();
        for url in html::urls(source) {
            match url {
                html::Url::Unreadable => changes.push(Change::Inert { host: None }),
                html::Url::Written(u) => match self.policy.judge(&u) {
                    Verdict::Keep => {}
                    // A URL in an attribute is not rewritten: too long is as bad as elsewhere.
                    Verdict::Change(c) => changes.push(c),
                },
            }
        }
        changes
    }
}

/// The runs of `text` between white space.
fn words(text: &str) -> impl Iterator<Item = Range<usize>> + '_ {
    let b = text.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while i < b.len() && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        (i > start).then_some(start..i)
    })
}

/// An invisible break (U+200B) after each `:`, `<` and `&`, inside `www.` and between `]` and
/// `(`: the text reads the same, but no parser finds a scheme, a `www.` link, a tag, a character
/// reference or a link in it — so it stays inert even where GitHub's parser does not see the
/// code span around it.
fn defang(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut prev = '\0';
    for c in text.chars() {
        if (prev == ']' && c == '(') || (c == '.' && out.to_ascii_lowercase().ends_with("www")) {
            out.push(ZWSP);
        }
        out.push(c);
        if matches!(c, ':' | '<' | '&') {
            out.push(ZWSP);
        }
        prev = c;
    }
    out
}

const ZWSP: char = '\u{200B}';

/// A URL as a link destination: in angle brackets, so spaces and parentheses cannot end it.
fn angle(url: &str) -> String {
    let clean: String = url
        .chars()
        .filter(|c| !c.is_control())
        .map(|c| match c {
            '<' => "%3C".to_string(),
            '>' => "%3E".to_string(),
            c => c.to_string(),
        })
        .collect();
    format!("<{clean}>")
}

/// Text escaped so it reads as itself: a backslash before each character Markdown gives a
/// meaning. `@` is left alone (a backslash before it would escape the backtick that makes a
/// mention inert).
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_punctuation() && c != '@' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn longest_backtick_run(text: &str) -> usize {
    let (mut best, mut run) = (0, 0);
    for b in text.bytes() {
        run = if b == b'`' { run + 1 } else { 0 };
        best = best.max(run);
    }
    best
}

/// The text with each edit made; `None` when two overlap (the caller then fences the text).
fn apply(text: &str, edits: &[(Range<usize>, String)]) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 64);
    let mut from = 0;
    for (at, with) in edits {
        if at.start < from || !text.is_char_boundary(at.start) || !text.is_char_boundary(at.end) {
            return None;
        }
        out.push_str(&text[from..at.start]);
        // GitHub's autolinks run to whitespace, backticks included: an inserted code span right
        // after a URL would be swallowed into it.
        if with.starts_with('`') && out.chars().next_back().is_some_and(|c| !c.is_whitespace()) {
            out.push(' ');
        }
        out.push_str(with);
        from = at.end;
    }
    out.push_str(&text[from..]);
    Some(out)
}
