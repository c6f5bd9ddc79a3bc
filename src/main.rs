//! `fro-bot`: the action's entry point. The container runs the `fro-bot-run` link as the main step
//! and the `fro-bot-post` link as the post step (dispatched on argv[0]); both are `fro-bot run`/`post`.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

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
    Local(LocalArgs),
    /// MCP server over stdio that gives the agent session_list/read/search/info over past sessions.
    SessionTools,
}

/// Flags mirror the action's inputs (same names); `INPUT_*` variables are read too, flags win.
#[derive(Debug, Args)]
struct LocalArgs {
    /// What the agent should do.
    #[arg(long)]
    prompt: Option<String>,
    /// Conversation thread: runs with the same thread continue the same OpenCode session.
    #[arg(long, default_value = "default")]
    thread: String,
    /// Where memory and the local cache live (default: .fro-bot/ in the repository).
    #[arg(long)]
    state_dir: Option<std::path::PathBuf>,
    /// Model as provider/model.
    #[arg(long)]
    model: Option<String>,
    /// OpenCode agent to use.
    #[arg(long)]
    agent: Option<String>,
    /// Provider credentials: a JSON object, provider id → OpenCode auth entry.
    #[arg(long = "auth-json")]
    auth_json: Option<String>,
    /// JSON merged over the baseline OpenCode config.
    #[arg(long = "opencode-config")]
    opencode_config: Option<String>,
    /// Turn deadline in milliseconds (0 = none).
    #[arg(long)]
    timeout: Option<String>,
}

fn main() -> ExitCode {
    // The post step is started through a second entrypoint path; dispatch on its name.
    let invoked_as = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    // `runs.using: docker` passes the same (no) args to main and post, so each has its own path.
    let command = match invoked_as.as_str() {
        "fro-bot-run" => Command::Run,
        "fro-bot-post" => Command::Post,
        _ => Cli::parse().command,
    };
    let env = fro_bot::runner::Env::from_process();
    fro_bot::runner::log::init_tracing(env.is_github_actions());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            fro_bot::runner::log::error(&format!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    match command {
        Command::Post => {
            runtime.block_on(fro_bot::phases::post::post(&env, async {}));
            // A failing post step fails the whole job: post always exits 0.
            ExitCode::SUCCESS
        }
        Command::Run => not_implemented("run"),
        Command::Local(_args) => not_implemented("local"),
        Command::SessionTools => session_tools(&env),
    }
}

/// The MCP server OpenCode starts for the agent. stdout is the protocol channel: nothing else may
/// print there. Tool failures are tool results; only a broken stdin/stdout ends it with an error.
fn session_tools(env: &fro_bot::runner::Env) -> ExitCode {
    let config = fro_bot::opencode::session_tools::ToolsConfig::from_env(env);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fro-bot session-tools: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(fro_bot::opencode::session_tools::serve_stdio(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fro-bot session-tools: {e}");
            ExitCode::FAILURE
        }
    }
}

fn not_implemented(what: &str) -> ExitCode {
    fro_bot::runner::log::error(&format!("`fro-bot {what}` is not implemented yet"));
    ExitCode::FAILURE
}
