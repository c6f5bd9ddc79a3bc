//! Where GitHub is: the REST and GraphQL APIs every call goes to, and the server every link and
//! git fetch names. On github.com these are `https://api.github.com`, `.../graphql` and
//! `https://github.com`; on GitHub Enterprise Server `https://HOST/api/v3`, `https://HOST/api/graphql`
//! and `https://HOST`. The runner sets all three; the defaults serve runs that do not.

use crate::runner::env;
use crate::runner::Env;

pub const DEFAULT_API_URL: &str = "https://api.github.com";
pub const DEFAULT_SERVER_URL: &str = "https://github.com";

/// The API's two base URLs, without a trailing slash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// REST: `GITHUB_API_URL`.
    pub api: String,
    /// GraphQL, the full URL requests are posted to: `GITHUB_GRAPHQL_URL`.
    pub graphql: String,
}

impl Endpoints {
    /// `GITHUB_API_URL` and `GITHUB_GRAPHQL_URL`; GraphQL beside the REST base when unset.
    pub fn from_env(env: &Env) -> Endpoints {
        let api = env.get(env::GITHUB_API_URL).unwrap_or(DEFAULT_API_URL);
        let mut endpoints = Endpoints::for_api(api);
        if let Some(graphql) = env.get(env::GITHUB_GRAPHQL_URL) {
            endpoints.graphql = graphql.trim_end_matches('/').to_string();
        }
        endpoints
    }

    /// GraphQL where GitHub puts it beside a REST base: `/graphql` on api.github.com (and GHE.com),
    /// `/api/graphql` beside Enterprise Server's `/api/v3`.
    pub fn for_api(api: &str) -> Endpoints {
        let api = api.trim_end_matches('/');
        let root = api.strip_suffix("/v3").unwrap_or(api);
        Endpoints {
            api: api.to_string(),
            graphql: format!("{root}/graphql"),
        }
    }
}

/// `GITHUB_SERVER_URL` without a trailing slash: the base of every link fro-bot writes and of the
/// repository's git URL.
pub fn server_url(env: &Env) -> String {
    env.get(env::GITHUB_SERVER_URL)
        .unwrap_or(DEFAULT_SERVER_URL)
        .trim_end_matches('/')
        .to_string()
}

/// The domain of the server's no-reply addresses (`login@users.noreply.HOST`), which credit a
/// person in a commit trailer without their own address: `users.noreply.github.com` on github.com,
/// the instance's host on Enterprise Server.
pub fn noreply_domain(server_url: &str) -> String {
    let host = url::Url::parse(server_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
        .unwrap_or_else(|| "github.com".to_string());
    format!("users.noreply.{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_reply_addresses_are_the_servers_own() {
        assert_eq!(
            noreply_domain("https://github.com"),
            "users.noreply.github.com"
        );
        assert_eq!(
            noreply_domain("https://ghes.example.com/"),
            "users.noreply.ghes.example.com"
        );
        assert_eq!(noreply_domain("not a url"), "users.noreply.github.com");
    }

    #[test]
    fn graphql_sits_beside_the_rest_base_unless_the_runner_names_it() {
        let at = |pairs: &[(&str, &str)]| Endpoints::from_env(&Env::from_pairs(pairs.to_vec()));
        assert_eq!(
            at(&[]),
            Endpoints {
                api: "https://api.github.com".into(),
                graphql: "https://api.github.com/graphql".into()
            }
        );
        assert_eq!(
            at(&[("GITHUB_API_URL", "https://ghe.example/api/v3/")]),
            Endpoints {
                api: "https://ghe.example/api/v3".into(),
                graphql: "https://ghe.example/api/graphql".into()
            }
        );
        let named = at(&[
            ("GITHUB_API_URL", "https://ghe.example/api/v3"),
            ("GITHUB_GRAPHQL_URL", "https://gql.example/custom/graphql"),
        ]);
        assert_eq!(named.graphql, "https://gql.example/custom/graphql");
    }

    #[test]
    fn links_use_the_server_url() {
        assert_eq!(server_url(&Env::default()), "https://github.com");
        let env = Env::from_pairs([("GITHUB_SERVER_URL", "https://ghe.example/")]);
        assert_eq!(server_url(&env), "https://ghe.example");
    }
}
