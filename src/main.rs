//! `fro-bot`: the binary. The container runs the `fro-bot-run` link as the main step and the
//! `fro-bot-post` link as the post step (dispatched on argv[0]); both are `fro-bot run`/`post`.
//! The other commands: `local` (the pipeline on a developer's machine), `session-tools` (the
//! agent's MCP server), `inspect` and the hidden `watchdog`; started as OpenCode's `$SHELL`, it is
//! the agent's shell wrapper (`confine::memory_group`).

use std::process::ExitCode;

use std::path::PathBuf;

use clap::{Arg, ArgMatches, Args, Parser, Subcommand};
use fro_bot::config::inputs::{self, InputSpec};
use fro_bot::phases::run_context::Mode;
use fro_bot::runner::{Cancellation, Env};

#[derive(Debug, Parser)]
#[command(
    name = "fro-bot",
    version,
    about = "Run the OpenCode agent on repository events and keep its memory across workflow runs",
    long_about = "Run the OpenCode agent on repository events and keep its memory (OpenCode's session \
database) across workflow runs, in the GitHub Actions cache and optionally an S3-compatible store.\n\n\
In a workflow the container runs `fro-bot run` and `fro-bot post` for you; inputs arrive as \
INPUT_* variables. On your machine, `fro-bot local --prompt \"...\"` runs the same pipeline."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The action's main step: route the event, restore memory, run the agent, save memory.
    Run,
    /// The action's post step: retry a save the main step could not make durable. Always exits 0.
    Post,
    /// Run the whole pipeline on this machine, with memory kept under .fro-bot/ in the repository.
    Local(Box<LocalArgs>),
    /// MCP server over stdio that gives the agent session_list/read/search/info over past sessions.
    SessionTools,
    /// Print what this environment derives: memory paths, cache keys and version, identity, and
    /// the object-store keys. Reads the same variables as `run` and `post`; changes nothing.
    Inspect,
    /// Kills OpenCode's process group if fro-bot dies without releasing it (internal).
    #[command(hide = true)]
    Watchdog,
}

/// Flags mirror the action's inputs (same names); `INPUT_*` variables are read too, flags win.
#[derive(Debug, Args)]
struct LocalArgs {
    /// Conversation thread: runs with the same thread continue the same OpenCode session.
    #[arg(long, default_value = "default")]
    thread: String,
    /// Where memory and the local cache live (default: .fro-bot/ in the repository).
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    #[command(flatten)]
    inputs: InputFlags,
}

/// One `--<input>` flag for each input the table marks as a `local` flag, with the input's
/// description as its help.
#[derive(Debug, Default)]
struct InputFlags(Vec<(&'static InputSpec, String)>);

impl InputFlags {
    fn specs() -> impl Iterator<Item = &'static InputSpec> {
        inputs::INPUTS.iter().filter(|spec| spec.local_flag)
    }

    fn flag(spec: &'static InputSpec) -> Arg {
        let help = match spec.default.value() {
            Some(default) => format!("{} [default: {default}]", spec.description),
            None => spec.description.to_string(),
        };
        // No clap default: an absent flag must leave an `INPUT_*` variable in charge.
        Arg::new(spec.name)
            .long(spec.name)
            .value_name(spec.parser.value_name())
            .help(help)
    }
}

impl clap::FromArgMatches for InputFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let given = Self::specs()
            .filter_map(|spec| Some((spec, matches.get_one::<String>(spec.name)?.clone())))
            .collect();
        Ok(Self(given))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for InputFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.args(Self::specs().map(Self::flag))
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = agent_shell(&args) {
        return code;
    }
    // The sibling container's first process (`fro_bot::confine::sibling::relay`).
    if args
        .get(1)
        .is_some_and(|a| a == fro_bot::confine::sibling::relay::SUBCOMMAND)
    {
        return fro_bot::confine::sibling::relay::serve(&args[2..]);
    }
    // Before anything reads a secret: no process of the agent's uid may read this one's memory or
    // environment, and the agent's orphans stay in this process's tree (`fro_bot::confine`).
    let hardened = fro_bot::confine::harden_self();
    let command = invoked_command(&args);
    let env = fro_bot::runner::Env::from_process();
    if let Command::Watchdog = command {
        return fro_bot::confine::watchdog::serve();
    }
    if let Command::SessionTools = command {
        // stdout is the MCP protocol channel: nothing else may print there.
        return session_tools(&env);
    }
    fro_bot::runner::log::init_tracing(env.is_github_actions());
    if let Err(e) = hardened {
        fro_bot::runner::log::warning(&format!("cannot make fro-bot non-dumpable: {e}"));
    }
    match runtime(&command) {
        Ok(runtime) => dispatch(command, runtime, env),
        Err(code) => code,
    }
}

/// OpenCode's `$SHELL` wrapper: drop the memory group and become the real shell, before anything
/// else runs (`fro_bot::confine::memory_group`). `None`: fro-bot was not started as the shell.
fn agent_shell(args: &[std::ffi::OsString]) -> Option<ExitCode> {
    let (real, rest) = fro_bot::confine::memory_group::invoked_as_shell(args)?;
    if let Some(code) = fro_bot::confine::sibling::shell::forward_if_sibling(&real, &rest) {
        return Some(code);
    }
    let e = fro_bot::confine::memory_group::exec_agent_shell(&real, &rest);
    fro_bot::runner::log::print_err(&format!(
        "fro-bot: cannot start the shell {}: {e}",
        real.to_string_lossy()
    ));
    Some(ExitCode::from(126))
}

/// The command to run. `runs.using: docker` passes the same (no) args to main and post, so the post
/// step is started through a second entrypoint path: dispatch on its name, else on the arguments.
fn invoked_command(args: &[std::ffi::OsString]) -> Command {
    let invoked_as = args
        .first()
        .and_then(|a| {
            std::path::Path::new(a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    match invoked_as.as_str() {
        "fro-bot-run" => Command::Run,
        "fro-bot-post" => Command::Post,
        _ => Cli::parse().command,
    }
}

/// The async runtime, or the exit when it cannot start: post still exits 0 (a failing post step
/// fails the whole job).
fn runtime(command: &Command) -> Result<tokio::runtime::Runtime, ExitCode> {
    let built = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build();
    built.map_err(|e| {
        let message = format!("cannot start the async runtime: {e}");
        if let Command::Post = command {
            fro_bot::runner::log::warning(&message);
            return ExitCode::SUCCESS;
        }
        fro_bot::runner::log::error(&message);
        ExitCode::FAILURE
    })
}

/// Runs `command` on `runtime`.
fn dispatch(command: Command, runtime: tokio::runtime::Runtime, env: Env) -> ExitCode {
    match command {
        Command::Post => {
            // A failing post step fails the whole job: post always exits 0, whatever happens.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                runtime.block_on(post(&env))
            }));
            if outcome.is_err() {
                fro_bot::runner::log::warning("post: an internal error stopped the retry");
            }
            ExitCode::SUCCESS
        }
        Command::Run => run_to_the_end(runtime, env, Mode::Action),
        Command::Local(args) => match local_env(env, &args) {
            Ok((env, mode)) => run_to_the_end(runtime, env, mode),
            Err(message) => {
                fro_bot::runner::log::error(&message);
                ExitCode::FAILURE
            }
        },
        Command::SessionTools | Command::Watchdog => ExitCode::SUCCESS,
        Command::Inspect => match fro_bot::phases::inspect::describe(&env) {
            Ok(text) => {
                fro_bot::runner::log::print(&text);
                ExitCode::SUCCESS
            }
            Err(message) => {
                fro_bot::runner::log::error(&message);
                ExitCode::FAILURE
            }
        },
    }
}

/// The post step, stopped cleanly by SIGINT/SIGTERM (as PID 1 nothing else would handle them).
async fn post(env: &Env) {
    let cancel = Cancellation::new();
    if let Err(e) = cancel.install_signal_handlers() {
        tracing::warn!("cannot handle SIGINT/SIGTERM: {e}");
    }
    tokio::select! {
        _ = fro_bot::phases::post::run_post(env) => {}
        () = cancel.cancelled() => {
            fro_bot::runner::log::warning("post: cancelled; memory from before this run is intact");
        }
    }
}

/// The main step, then the exit at once: blocking work a cancel cut off (a restore's extraction, a
/// save's scrub) is abandoned, not waited for past the runner's kill (dropping the runtime would).
fn run_to_the_end(runtime: tokio::runtime::Runtime, env: Env, mode: Mode) -> ExitCode {
    let code = runtime.block_on(run(env, mode));
    runtime.shutdown_background();
    code
}

async fn run(env: Env, mode: Mode) -> ExitCode {
    let cancel = Cancellation::new();
    if let Err(e) = cancel.install_signal_handlers() {
        fro_bot::runner::log::warning(&format!("cannot handle SIGINT/SIGTERM: {e}"));
    }
    let local = matches!(mode, Mode::Local { .. });
    let exit = fro_bot::phases::run::run(env, mode, cancel).await;
    if local {
        match &exit.answer {
            Some(answer) => fro_bot::runner::log::print(&format!("\n{answer}\n")),
            None => fro_bot::runner::log::print("\n(the agent gave no answer)\n"),
        }
    }
    ExitCode::from(exit.status.code())
}

/// `fro-bot local`: the action's inputs from flags (which win) and `INPUT_*`, and a synthesized
/// manual-dispatch run of this repository, with everything kept under the state dir.
fn local_env(mut env: Env, args: &LocalArgs) -> Result<(Env, Mode), String> {
    let cwd =
        std::env::current_dir().map_err(|e| format!("cannot read the current directory: {e}"))?;
    let checkout = LocalCheckout::of(&cwd);
    let state_dir = match &args.state_dir {
        Some(d) if d.is_absolute() => d.clone(),
        Some(d) => cwd.join(d),
        None => checkout.root.join(".fro-bot"),
    };
    std::fs::create_dir_all(&state_dir)
        .map_err(|e| format!("cannot create the state dir {}: {e}", state_dir.display()))?;
    for (spec, value) in &args.inputs.0 {
        env.set(spec.var(), value.clone());
    }
    if env.input(inputs::PROMPT.name).is_none() {
        return Err(format!(
            "fro-bot local needs a task: pass --{} \"...\" (or set {})",
            inputs::PROMPT.name,
            inputs::PROMPT.var()
        ));
    }
    as_local_run(&mut env, &checkout, &state_dir);
    Ok((
        env,
        Mode::Local {
            thread: args.thread.clone(),
            state_dir,
        },
    ))
}

/// The repository a local run works on: its root and branch (the current directory and `local`
/// outside a git checkout).
struct LocalCheckout {
    root: PathBuf,
    branch: String,
}

impl LocalCheckout {
    fn of(cwd: &std::path::Path) -> LocalCheckout {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(cwd)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                .filter(|s| !s.is_empty())
        };
        LocalCheckout {
            root: git(&["rev-parse", "--show-toplevel"])
                .map(PathBuf::from)
                .unwrap_or_else(|| cwd.to_path_buf()),
            branch: git(&["rev-parse", "--abbrev-ref", "HEAD"]).unwrap_or_else(|| "local".into()),
        }
    }
}

/// `env` made a manual-dispatch run of `checkout` on no runner: no file commands, no Actions
/// cache service, and memory under the state dir, not the user's OpenCode.
fn as_local_run(env: &mut Env, checkout: &LocalCheckout, state_dir: &std::path::Path) {
    use fro_bot::runner::env as names;
    for var in [
        names::GITHUB_ACTIONS,
        names::GITHUB_OUTPUT,
        names::GITHUB_STATE,
        names::GITHUB_ENV,
        names::GITHUB_STEP_SUMMARY,
        names::GITHUB_JOB,
        names::ACTIONS_RESULTS_URL,
        names::ACTIONS_CACHE_URL,
        names::ACTIONS_CACHE_SERVICE_V2,
        names::ACTIONS_RUNTIME_TOKEN,
        names::XDG_DATA_HOME,
        names::XDG_CONFIG_HOME,
        names::XDG_CACHE_HOME,
        names::XDG_STATE_HOME,
    ] {
        env.remove(var);
    }
    let name = checkout
        .root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "repo".into());
    let home = state_dir.join("home");
    for (k, v) in [
        (names::HOME, home.to_string_lossy().into_owned()),
        (
            names::GITHUB_WORKSPACE,
            checkout.root.to_string_lossy().into_owned(),
        ),
        (names::GITHUB_REPOSITORY, format!("local/{name}")),
        (names::GITHUB_REF_NAME, checkout.branch.clone()),
        (names::RUNNER_OS, std::env::consts::OS.to_string()),
        (names::GITHUB_RUN_ID, fro_bot::runner::now_ms().to_string()),
        (names::GITHUB_RUN_ATTEMPT, "1".to_string()),
        (names::GITHUB_EVENT_NAME, "workflow_dispatch".to_string()),
    ] {
        env.set(k, v);
    }
}

/// The MCP server OpenCode starts for the agent. stdout is the protocol channel: nothing else may
/// print there. Tool failures are tool results; only a broken stdin/stdout ends it with an error.
fn session_tools(env: &fro_bot::runner::Env) -> ExitCode {
    let config = fro_bot::tools::ToolsConfig::from_env(env);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            fro_bot::runner::log::print_err(&format!(
                "fro-bot session-tools: cannot start the async runtime: {e}"
            ));
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(fro_bot::tools::serve_stdio(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            fro_bot::runner::log::print_err(&format!("fro-bot session-tools: {e}"));
            ExitCode::FAILURE
        }
    }
}
