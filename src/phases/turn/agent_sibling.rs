//! Where the agent's commands run this turn (docs/security.md#the-agents-network): in the sibling
//! container with no network (`confine::sibling`) when `agent-isolation` asks for it and the
//! Docker socket works, else in fro-bot's container under the port-based rules. Before the agent
//! starts, the sibling is started and its id kept in main's state; after the turn it is removed
//! before anything the agent touched is taken back; post removes one a killed main left.

use std::sync::Arc;

use crate::confine::sibling::{self, AgentIsolation, Sibling, SiblingPlan};
use crate::confine::AgentUser;
use crate::egress::{AgentReach, Commands};
use crate::phases::run_context::{Admitted, Mode};
use crate::runner::env::state;
use crate::runner::{log, Env, FileCommands};

/// Where the agent's commands run. `Err`: the one line that fails the run before the agent
/// starts (`agent-isolation: container` that cannot be had).
pub(crate) async fn commands(ctx: &Admitted, reach: &AgentReach) -> Result<Commands, String> {
    let wanted = ctx.settings.network.isolation;
    if wanted == AgentIsolation::Process {
        return Ok(Commands::Process { why: None });
    }
    match start(ctx, reach).await {
        Ok(s) => {
            tracing::info!(
                "the agent's commands run in container {} with no network (started in {} ms)",
                &s.id()[..12.min(s.id().len())],
                s.started_in.as_millis()
            );
            Ok(Commands::Sibling(Arc::new(s)))
        }
        Err(why) => match wanted {
            AgentIsolation::Auto => {
                tracing::info!("the agent's commands run in fro-bot's container: {why}");
                Ok(Commands::Process { why: Some(why) })
            }
            AgentIsolation::Container | AgentIsolation::Process => Err(format!(
                "agent-isolation: container cannot be had: {why}. Set `agent-isolation: auto` \
                 to fall back to the port-based rules"
            )),
        },
    }
}

async fn start(ctx: &Admitted, reach: &AgentReach) -> Result<Sibling, String> {
    let own_id = sibling::own_container().map_err(|e| e.to_string())?;
    let user = match ctx.mode {
        Mode::Action => AgentUser::choose(&ctx.workspace),
        Mode::Local { .. } => AgentUser::choose_local(&ctx.workspace),
    };
    let AgentUser::Switched { uid, gid, .. } = user else {
        return Err(format!(
            "{}, and the sibling runs commands only as another uid",
            user.describe()
        ));
    };
    let plan = reach.plan(None);
    let spec = plan
        .commands_spec()
        .ok_or("the agent's network is open: nothing to isolate")?;
    let exe = std::env::current_exe().map_err(|e| format!("fro-bot's own path: {e}"))?;
    let plan = SiblingPlan {
        uid,
        gid,
        spec,
        proxy_port: plan.egress_port,
        exe,
    };
    let files = ctx.files.clone();
    let sibling = Sibling::start(&own_id, &plan, |id| {
        files.save_state_or_warn(state::AGENT_SIBLING, id)
    })
    .await
    .map_err(|e| crate::opencode::client::error_chain(&e))?;
    if let Some(proxy) = &reach.proxy {
        proxy
            .listen_unix(&sibling.egress_socket())
            .map_err(|e| format!("the egress proxy cannot listen for the sibling: {e}"))?;
    }
    Ok(sibling)
}

/// After OpenCode stopped: every process of the sibling ends and the engine removes it. Whether
/// it is gone (a failure is said; its lifeline is cut either way, which ends it too).
pub(crate) async fn remove(sibling: &Sibling, files: &FileCommands) -> bool {
    match sibling.remove().await {
        Ok(_) => {
            files.save_state_or_warn(state::AGENT_SIBLING, "");
            true
        }
        Err(e) => {
            log::warning(&format!(
                "the agent's container could not be removed: {}",
                crate::opencode::client::error_chain(&e)
            ));
            false
        }
    }
}

/// Post: the sibling a killed main left is removed first, before anything the agent touched is
/// put back. The summary's line when there was one.
pub(crate) async fn post_remove(env: &Env) -> Option<String> {
    let id = env
        .state(state::AGENT_SIBLING)
        .filter(|id| !id.is_empty())?;
    match sibling::remove_recorded(id).await {
        Ok(true) => Some("Removed the agent's container the main step left running.".into()),
        Ok(false) => None,
        Err(e) => {
            let text = format!(
                "Could not remove the agent's container: {}",
                crate::opencode::client::error_chain(&e)
            );
            log::warning(&text);
            Some(text)
        }
    }
}
