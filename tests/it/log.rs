//! The job log (docs/security.md#what-fro-bot-prints): the runner's command parser the tests judge
//! with reads as the runner does, and no text, however hostile, printed through fro-bot's one
//! writer carries a workflow command.

use proptest::prelude::*;

use crate::support::runner_commands::{commands, lines, Reading};

#[test]
fn reads_commands_as_the_runner_does() {
    let log = "plain\r  ::set-output name=a::x%0Ay\r\nsay ##[add-mask]s3cret\n::unknown::x";
    let found = commands(log, Reading::Ordinal);
    let names: Vec<_> = found.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["set-output", "add-mask"]);
    assert_eq!(found[0].properties, [("name".into(), "a".into())]);
    assert_eq!(found[0].data, "x\ny");
    assert_eq!(found[1].data, "s3cret");
}

#[test]
fn stop_commands_pauses_until_its_token() {
    let log = "::stop-commands::tok\n::add-mask::a\n::TOK::\n::add-mask::b";
    let found = commands(log, Reading::Ordinal);
    let data: Vec<_> = found
        .iter()
        .map(|c| (c.name.as_str(), c.data.as_str()))
        .collect();
    assert_eq!(
        data,
        [("stop-commands", "tok"), ("tok", ""), ("add-mask", "b")]
    );
}

#[test]
fn invisible_characters_are_skipped_only_when_reading_as_a_culture() {
    let log = "#\u{200b}#[add-mask]x";
    assert!(commands(log, Reading::Ordinal).is_empty());
    assert_eq!(commands(log, Reading::SkippingInvisibles).len(), 1);
}

/// Pieces an attacker combines: every line terminator, whitespace the runner trims, invisible
/// characters a culture-sensitive comparison passes over, and both command forms.
fn hostile_piece() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "\r",
        "\n",
        "\r\n",
        " ",
        "\t",
        "\u{a0}",
        "\u{3000}",
        "\u{85}",
        "\u{2028}",
        "\u{200b}",
        "\u{feff}",
        "\u{ad}",
        "\u{301}",
        "\u{1b}",
        ":",
        "::",
        "#",
        "##",
        "[",
        "]",
        "##[",
        "add-mask",
        "set-output name=x",
        "stop-commands",
        "save-state name=y",
        "tok",
        "%0A",
        "ok",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn no_text_printed_through_the_writer_carries_a_command(
        pieces in prop::collection::vec(hostile_piece(), 0..40)
    ) {
        let text: String = pieces.concat();
        let mut log = String::new();
        for line in fro_bot::runner::lines::inert(&text) {
            prop_assert!(!line.contains(['\r', '\n']), "{line:?}");
            log.push_str(&line);
            log.push('\n');
        }
        for reading in [Reading::Ordinal, Reading::SkippingInvisibles] {
            let found = commands(&log, reading);
            prop_assert!(found.is_empty(), "{text:?} printed as {log:?} carries {found:?}");
        }
    }
}

#[test]
fn the_runners_line_split_and_fro_bots_agree() {
    for text in ["a\rb\r\nc\nd", "\r\r\n\n", "x\r", "", "\n\ny"] {
        assert_eq!(lines(text), fro_bot::runner::lines::split(text), "{text:?}");
    }
}
