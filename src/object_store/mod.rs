//! The S3-compatible object store (docs/design.md#object-store): its inputs and every key component
//! and path validated (`validate`), the key layout (`keys`), the aws-sdk-s3 adapter (`client`), and
//! moving the session database and run records between the data dir and the store (`sync`).

pub mod client;
pub mod keys;
pub mod sync;
pub mod validate;

pub use client::{
    Condition, DeleteOutcome, DownloadOutcome, GetOutcome, Listing, ObjectBody, ObjectKind,
    ObjectStore, Operation, PutOutcome, StoreError,
};
pub use keys::StoreKeys;
pub use sync::{
    publish_session_db, restore_session_db, upload_run_artifacts, upload_run_metadata,
    ArtifactsOutcome, PublishOutcome, StoreRestore, UploadOutcome,
};
pub use validate::{StoreSettings, ValidationError};
