//! The SeaweedFS object store `scripts/test` starts, as a connected [`ObjectStore`] with static
//! credentials and a key prefix unique to the calling test.

use aws_config::BehaviorVersion;
use aws_sdk_s3::config::{Credentials, Region};
use fro_bot::config::S3Input;
use fro_bot::object_store::{ObjectStore, StoreKeys, StoreSettings};

use super::services;

/// A prefix no other test (or concurrent run) uses.
pub fn unique_prefix(tag: &str) -> String {
    format!("t-{tag}-{}", hex::encode(rand::random::<[u8; 6]>()))
}

pub fn settings(prefix: &str) -> StoreSettings {
    let s3 = services::s3();
    StoreSettings::from_input_with_env_region(
        &S3Input {
            bucket: s3.bucket,
            endpoint: Some(s3.endpoint),
            prefix: prefix.to_string(),
            allow_insecure_endpoint: true,
            ..S3Input::default()
        },
        None,
    )
    .expect("test settings are valid")
}

pub async fn connect_with_secret(settings: &StoreSettings, secret: &str) -> ObjectStore {
    let s3 = services::s3();
    let sdk = aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(settings.region.clone()))
        .credentials_provider(Credentials::new(
            s3.access_key,
            secret,
            None,
            None,
            "fro-bot-test",
        ))
        .load()
        .await;
    ObjectStore::with_sdk_config(settings, &sdk)
}

pub async fn connect(settings: &StoreSettings) -> ObjectStore {
    connect_with_secret(settings, &services::s3().secret_key).await
}

/// A store, its keys for `octo/repo` under a fresh prefix.
pub async fn fresh(tag: &str) -> (ObjectStore, StoreKeys) {
    let prefix = unique_prefix(tag);
    let settings = settings(&prefix);
    let store = connect(&settings).await;
    let keys = StoreKeys::new(&prefix, "octo", "repo").expect("valid keys");
    (store, keys)
}
