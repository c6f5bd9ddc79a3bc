//! Before the turn: is any model usable? OpenCode with no usable provider does not fail, it
//! retries for minutes; fro-bot asks `GET /config/providers` (the providers OpenCode can call,
//! each with its models) and fails at once, naming the fix.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::ModelRef;

/// The answer of `GET /config/providers`, as far as the check reads it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Providers {
    #[serde(default)]
    pub providers: Vec<Provider>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Provider {
    pub id: String,
    #[serde(default)]
    pub options: serde_json::Value,
    #[serde(default)]
    pub models: BTreeMap<String, serde_json::Value>,
}

/// OpenCode's own hosted provider is always listed, with a public key and no credentials of the
/// user's: it is not what anyone configured, and offline it never answers.
const BUILT_IN: &str = "opencode";

impl Provider {
    fn has_user_credentials(&self) -> bool {
        !(self.id == BUILT_IN && self.options["apiKey"].as_str() == Some("public"))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreflightError {
    #[error(
        "no model provider has credentials: give them with `auth-json` (locally `--auth-json '{{\"anthropic\":{{\"type\":\"api\",\"key\":\"...\"}}}}'`), a provider's API key variable (e.g. ANTHROPIC_API_KEY) or `opencode-config`, and choose a model with `model` (`--model provider/model`)"
    )]
    NoProvider,
    #[error("model `{provider}/{model}`: provider `{provider}` has no credentials (usable: {usable}); give its key with `auth-json` or its API key variable")]
    ProviderNotUsable {
        provider: String,
        model: String,
        usable: String,
    },
    #[error(
        "model `{provider}/{model}` is unknown to OpenCode (provider `{provider}` has: {known})"
    )]
    UnknownModel {
        provider: String,
        model: String,
        known: String,
    },
}

/// `Ok` when the requested model (or, with none requested, some provider) can be called.
pub fn check(providers: &Providers, model: Option<&ModelRef>) -> Result<(), PreflightError> {
    let Some(model) = model else {
        return match providers
            .providers
            .iter()
            .any(Provider::has_user_credentials)
        {
            true => Ok(()),
            false => Err(PreflightError::NoProvider),
        };
    };
    let Some(provider) = providers.providers.iter().find(|p| p.id == model.provider) else {
        let usable: Vec<&str> = providers
            .providers
            .iter()
            .filter(|p| p.has_user_credentials())
            .map(|p| p.id.as_str())
            .collect();
        return Err(PreflightError::ProviderNotUsable {
            provider: model.provider.clone(),
            model: model.model.clone(),
            usable: list(&usable),
        });
    };
    if provider.models.contains_key(&model.model) {
        return Ok(());
    }
    let known: Vec<&str> = provider.models.keys().map(String::as_str).collect();
    Err(PreflightError::UnknownModel {
        provider: model.provider.clone(),
        model: model.model.clone(),
        known: list(&known),
    })
}

fn list(items: &[&str]) -> String {
    const SHOWN: usize = 12;
    match items.len() {
        0 => "none".into(),
        n if n <= SHOWN => items.join(", "),
        n => format!("{}, … ({} more)", items[..SHOWN].join(", "), n - SHOWN),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn providers(json: serde_json::Value) -> Providers {
        serde_json::from_value(json).unwrap()
    }

    fn model(p: &str, m: &str) -> ModelRef {
        ModelRef {
            provider: p.into(),
            model: m.into(),
        }
    }

    /// What OpenCode 1.18.33 answers with no credentials at all: only its own hosted provider.
    fn bare() -> Providers {
        providers(serde_json::json!({"providers": [
            {"id": "opencode", "options": {"apiKey": "public"}, "models": {"big-pickle": {}}}
        ]}))
    }

    fn configured() -> Providers {
        providers(serde_json::json!({"providers": [
            {"id": "opencode", "options": {"apiKey": "public"}, "models": {"big-pickle": {}}},
            {"id": "anthropic", "options": {}, "models": {"claude-sonnet-4": {}, "claude-opus-4": {}}}
        ]}))
    }

    #[test]
    fn no_credentials_fails_naming_the_inputs_that_fix_it() {
        let e = check(&bare(), None).unwrap_err();
        assert_eq!(e, PreflightError::NoProvider);
        let text = e.to_string();
        assert!(
            text.contains("auth-json") && text.contains("--model"),
            "{text}"
        );
        assert!(check(&Providers::default(), None).is_err());
    }

    #[test]
    fn a_configured_provider_passes_with_or_without_a_model() {
        assert_eq!(check(&configured(), None), Ok(()));
        assert_eq!(
            check(&configured(), Some(&model("anthropic", "claude-sonnet-4"))),
            Ok(())
        );
        // Asking for OpenCode's hosted models on purpose is allowed.
        assert_eq!(
            check(&bare(), Some(&model("opencode", "big-pickle"))),
            Ok(())
        );
    }

    #[test]
    fn a_model_of_a_provider_without_credentials_or_an_unknown_model_fails() {
        let e = check(&configured(), Some(&model("openai", "gpt-5"))).unwrap_err();
        assert!(
            matches!(&e, PreflightError::ProviderNotUsable { usable, .. } if usable == "anthropic"),
            "{e}"
        );
        let e = check(&configured(), Some(&model("anthropic", "claude-9"))).unwrap_err();
        assert!(
            matches!(&e, PreflightError::UnknownModel { known, .. } if known == "claude-opus-4, claude-sonnet-4"),
            "{e}"
        );
    }
}
