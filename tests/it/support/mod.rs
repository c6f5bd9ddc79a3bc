//! Test services shared by the integration tests, one file each.
#![allow(dead_code)]

pub mod action;
pub mod cache_server;
pub mod cache_server_v1;
pub mod container;
pub mod fake_git;
pub mod fake_github;
pub mod fake_llm;
pub mod fake_review;
pub mod fake_runner_proxy;
pub mod github_schema;
pub mod grow;
pub mod hostile;
pub mod relay;
pub mod runner_commands;
pub mod s3;
pub mod services;
pub mod tls;
pub mod web;
