//! The repository calls that deliver what the agent proposed (`safe_outputs`): branches, signed
//! commits (`createCommitOnBranch`), pull requests, labels and issues. Like every call in
//! `github`, each failure is an `ApiError` for the caller to report; none fails a run.

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::api::{ApiError, GitHub};
use super::retry::Resend;

/// A pull request, as far as delivery reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRequest {
    pub number: u64,
    pub url: String,
    pub open: bool,
    pub merged: bool,
    pub head_ref: String,
    pub head_sha: String,
    /// `owner/name` of the head repository; `None` when it was deleted.
    pub head_repo: Option<String>,
    pub base_ref: String,
}

impl PullRequest {
    fn from_json(v: &Value) -> Option<PullRequest> {
        Some(PullRequest {
            number: v.get("number")?.as_u64()?,
            url: v.get("html_url")?.as_str()?.to_string(),
            open: v.get("state").and_then(Value::as_str) == Some("open"),
            merged: v.get("merged_at").is_some_and(|m| !m.is_null()),
            head_ref: v.pointer("/head/ref")?.as_str()?.to_string(),
            head_sha: v.pointer("/head/sha")?.as_str()?.to_string(),
            head_repo: v
                .pointer("/head/repo/full_name")
                .and_then(Value::as_str)
                .map(str::to_string),
            base_ref: v.pointer("/base/ref")?.as_str()?.to_string(),
        })
    }
}

/// A file for `createCommitOnBranch`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FileOp<'a> {
    Put { path: &'a str, contents: &'a [u8] },
    Delete { path: &'a str },
}

/// What `createCommitOnBranch` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitResult {
    Created {
        oid: String,
        url: Option<String>,
    },
    /// The branch no longer points at the expected head.
    HeadMoved,
}

/// What creating a pull request did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullResult {
    Opened(PullRequest),
    /// The repository does not let Actions open pull requests (GitHub's 403).
    NotPermitted,
}

#[derive(Deserialize)]
struct GitRef {
    object: RefObject,
}

#[derive(Deserialize)]
struct RefObject {
    sha: String,
}

/// GitHub's text for a workflow token that may not open pull requests.
const NOT_PERMITTED: &str = "not permitted to create or approve pull requests";

impl GitHub {
    fn op(operation: &'static str) -> impl Fn(octocrab::Error) -> ApiError {
        move |e| ApiError::from_octocrab(operation, e)
    }

    /// The repository's default branch.
    pub async fn default_branch(&self) -> Result<String, ApiError> {
        let repo: Value = self
            .get(self.repo_path())
            .await
            .map_err(Self::op("get repository"))?;
        repo.get("default_branch")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or(ApiError::Transport {
                operation: "get repository",
                message: "the answer has no default_branch".into(),
            })
    }

    /// The commit a branch points at; `None` when there is no such branch.
    pub async fn branch_head(&self, branch: &str) -> Result<Option<String>, ApiError> {
        let path = format!("{}/git/ref/heads/{branch}", self.repo_path());
        match self.get::<GitRef>(path).await {
            Ok(r) => Ok(Some(r.object.sha)),
            Err(e) => match ApiError::from_octocrab("get branch", e) {
                e if e.status() == Some(404) => Ok(None),
                e => Err(e),
            },
        }
    }

    /// Creates `branch` at `sha`; `Ok(false)` when it exists already.
    pub async fn create_branch(&self, branch: &str, sha: &str) -> Result<bool, ApiError> {
        let body = json!({"ref": format!("refs/heads/{branch}"), "sha": sha});
        let path = format!("{}/git/refs", self.repo_path());
        // A ref is created once: a repeat is GitHub's "already exists", read as such below.
        let created = self.call(Resend::Free, || {
            self.client.post::<_, Value>(&path, Some(&body))
        });
        match created.await {
            Ok(_) => Ok(true),
            Err(e) => match ApiError::from_octocrab("create branch", e) {
                ApiError::Status {
                    status: 422,
                    message,
                    ..
                } if message.contains("already exists") => Ok(false),
                e => Err(e),
            },
        }
    }

    /// A commit's full message.
    pub async fn commit_message(&self, sha: &str) -> Result<String, ApiError> {
        let c: Value = self
            .get(format!("{}/commits/{sha}", self.repo_path()))
            .await
            .map_err(Self::op("get commit"))?;
        Ok(c.pointer("/commit/message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string())
    }

    /// `base...head`: its status (`identical`, `ahead`, `behind`, `diverged`) and the files
    /// changed on `head` since the merge base.
    pub async fn compare(&self, base: &str, head: &str) -> Result<(String, Vec<String>), ApiError> {
        let c: Value = self
            .get(format!("{}/compare/{base}...{head}", self.repo_path()))
            .await
            .map_err(Self::op("compare commits"))?;
        let status = c["status"].as_str().unwrap_or("").to_string();
        let files = c["files"]
            .as_array()
            .map(|fs| {
                fs.iter()
                    .filter_map(|f| f["filename"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Ok((status, files))
    }

    /// One signed commit on `branch`, only if it still points at `expected_head`. An answer lost to
    /// a transient fault is safe to ask again through `expectedHeadOid`; first the branch is read:
    /// a head that already moved to this commit (`landed`) is the first attempt's success.
    pub async fn create_commit_on_branch(
        &self,
        branch: &str,
        expected_head: &str,
        message: (&str, &str),
        files: &[FileOp<'_>],
    ) -> Result<CommitResult, ApiError> {
        const OP: &str = "createCommitOnBranch";
        let query = "mutation($input: CreateCommitOnBranchInput!) { \
             createCommitOnBranch(input: $input) { commit { oid url } } }";
        let input = self.commit_input(branch, expected_head, message, files);
        let payload = json!({"query": query, "variables": {"input": input}});
        // Posted raw: octocrab's GraphQL error keeps neither the error's `type` nor its message.
        let answer: Value = self
            .create_once(
                || self.graphql_raw(payload.clone()),
                || self.landed(branch, expected_head, message, files),
            )
            .await
            .map_err(Self::op(OP))?;
        commit_result(OP, &answer)
    }

    fn commit_input(
        &self,
        branch: &str,
        expected_head: &str,
        message: (&str, &str),
        files: &[FileOp<'_>],
    ) -> Value {
        let b64 = base64::engine::general_purpose::STANDARD;
        let additions: Vec<Value> = files
            .iter()
            .filter_map(|f| match f {
                FileOp::Put { path, contents } => {
                    Some(json!({"path": path, "contents": b64.encode(contents)}))
                }
                FileOp::Delete { .. } => None,
            })
            .collect();
        let deletions: Vec<Value> = files
            .iter()
            .filter_map(|f| match f {
                FileOp::Delete { path } => Some(json!({ "path": path })),
                FileOp::Put { .. } => None,
            })
            .collect();
        json!({
            "branch": {"repositoryNameWithOwner": format!("{}/{}", self.owner, self.repo),
                       "branchName": branch},
            "message": {"headline": message.0, "body": message.1},
            "expectedHeadOid": expected_head,
            "fileChanges": {"additions": additions, "deletions": deletions},
        })
    }

    /// Whether `branch` already moved from `expected_head` to this very commit: its one parent is
    /// `expected_head`, its message is this one (the run's trailer in it) and every file it
    /// changed is one of `files`, with these contents (git's blob id) or removed. `Some` answer
    /// as `createCommitOnBranch` would have given it; `None` when it did not land (the branch
    /// still at `expected_head`, or moved by someone else).
    async fn landed(
        &self,
        branch: &str,
        expected_head: &str,
        message: (&str, &str),
        files: &[FileOp<'_>],
    ) -> Result<Option<Value>, ApiError> {
        let Some(head) = self.branch_head(branch).await? else {
            return Ok(None);
        };
        if head == expected_head {
            return Ok(None);
        }
        let c: Value = self
            .get(format!("{}/commits/{head}", self.repo_path()))
            .await
            .map_err(Self::op("get commit"))?;
        let parents: Vec<&str> = c["parents"]
            .as_array()
            .map(|ps| ps.iter().filter_map(|p| p["sha"].as_str()).collect())
            .unwrap_or_default();
        let full = match message.1.is_empty() {
            true => message.0.to_string(),
            false => format!("{}\n\n{}", message.0, message.1),
        };
        let same_message = c
            .pointer("/commit/message")
            .and_then(Value::as_str)
            .is_some_and(|m| m.trim_end() == full.trim_end());
        let ours = parents == [expected_head] && same_message && same_files(&c["files"], files);
        Ok(ours.then(|| {
            json!({"data": {"createCommitOnBranch": {"commit": {
                "oid": head, "url": c["html_url"]}}}})
        }))
    }

    /// Pull requests (any state) whose head is `branch` of this repository, newest first.
    pub async fn pulls_for_branch(&self, branch: &str) -> Result<Vec<PullRequest>, ApiError> {
        let query = [
            ("head", format!("{}:{branch}", self.owner)),
            ("state", "all".to_string()),
            ("per_page", "30".to_string()),
        ];
        let list: Vec<Value> = self
            .get_with(format!("{}/pulls", self.repo_path()), &query)
            .await
            .map_err(Self::op("list pull requests"))?;
        let mut pulls: Vec<PullRequest> = list.iter().filter_map(PullRequest::from_json).collect();
        pulls.sort_by_key(|p| std::cmp::Reverse(p.number));
        Ok(pulls)
    }

    /// Makes an open pull request a draft again (GraphQL `convertPullRequestToDraft`);
    /// `Ok(false)` when it already was one.
    pub async fn convert_to_draft(&self, number: u64) -> Result<bool, ApiError> {
        let v: Value = self
            .get(format!("{}/pulls/{number}", self.repo_path()))
            .await
            .map_err(Self::op("get pull request"))?;
        if v["draft"].as_bool() == Some(true) {
            return Ok(false);
        }
        let id = v["node_id"].as_str().ok_or(ApiError::Transport {
            operation: "get pull request",
            message: "the answer has no node_id".into(),
        })?;
        let query = "mutation($id:ID!){convertPullRequestToDraft(input:{pullRequestId:$id}){pullRequest{isDraft}}}";
        self.graphql(
            "convert pull request to draft",
            Resend::Free,
            json!({"query": query, "variables": {"id": id}}),
        )
        .await
        .map(|_| true)
    }

    /// One pull request.
    pub async fn pull_request(&self, number: u64) -> Result<PullRequest, ApiError> {
        let v: Value = self
            .get(format!("{}/pulls/{number}", self.repo_path()))
            .await
            .map_err(Self::op("get pull request"))?;
        PullRequest::from_json(&v).ok_or(ApiError::Transport {
            operation: "get pull request",
            message: "the answer lacks head/base fields".into(),
        })
    }

    /// Opens a pull request from `head` into `base`.
    pub async fn create_pull(
        &self,
        title: &str,
        body: &str,
        head: &str,
        base: &str,
        draft: bool,
    ) -> Result<PullResult, ApiError> {
        let req = json!({"title": title, "body": body, "head": head, "base": base, "draft": draft});
        let path = format!("{}/pulls", self.repo_path());
        // An answer lost: the branch's open pull request into `base` is the first attempt's.
        let lookup = || async {
            let query = [
                ("head", format!("{}:{head}", self.owner)),
                ("base", base.to_string()),
                ("state", "open".to_string()),
            ];
            let list: Vec<Value> = self
                .get_with(&path, &query)
                .await
                .map_err(Self::op("list pull requests"))?;
            Ok(list.into_iter().find(|p| {
                p.pointer("/head/ref").and_then(Value::as_str) == Some(head)
                    && p.pointer("/base/ref").and_then(Value::as_str) == Some(base)
            }))
        };
        let created = self.create_once(|| self.client.post::<_, Value>(&path, Some(&req)), lookup);
        match created.await {
            Ok(v) => {
                PullRequest::from_json(&v)
                    .map(PullResult::Opened)
                    .ok_or(ApiError::Transport {
                        operation: "create pull request",
                        message: "the answer lacks head/base fields".into(),
                    })
            }
            Err(e) => match ApiError::from_octocrab("create pull request", e) {
                ApiError::Status {
                    status: 403,
                    message,
                    ..
                } if message.contains(NOT_PERMITTED) => Ok(PullResult::NotPermitted),
                e => Err(e),
            },
        }
    }

    /// A user's permission on the repository (`admin`, `maintain`, `write`, `triage`, `read`,
    /// `none`).
    pub async fn permission(&self, login: &str) -> Result<String, ApiError> {
        let v: Value = self
            .get(format!(
                "{}/collaborators/{login}/permission",
                self.repo_path()
            ))
            .await
            .map_err(Self::op("get permission"))?;
        Ok(v["permission"].as_str().unwrap_or("none").to_string())
    }

    /// Every label of the repository (at most 1,000).
    pub async fn labels(&self) -> Result<Vec<String>, ApiError> {
        let mut names = Vec::new();
        for page in 1..=10u32 {
            let query = [("per_page", "100".to_string()), ("page", page.to_string())];
            let list: Vec<Value> = self
                .get_with(format!("{}/labels", self.repo_path()), &query)
                .await
                .map_err(Self::op("list labels"))?;
            let n = list.len();
            names.extend(
                list.iter()
                    .filter_map(|l| l["name"].as_str().map(str::to_string)),
            );
            if n < 100 {
                break;
            }
        }
        Ok(names)
    }

    pub async fn add_labels(&self, number: u64, labels: &[String]) -> Result<(), ApiError> {
        // Labels are a set: adding them again changes nothing.
        let path = format!("{}/issues/{number}/labels", self.repo_path());
        let body = json!({ "labels": labels });
        self.call(Resend::Free, || {
            self.client.post::<_, Value>(&path, Some(&body))
        })
        .await
        .map(drop)
        .map_err(Self::op("add labels"))
    }

    pub async fn remove_label(&self, number: u64, label: &str) -> Result<(), ApiError> {
        let name: String = url::form_urlencoded::byte_serialize(label.as_bytes()).collect();
        let path = format!(
            "{}/issues/{number}/labels/{}",
            self.repo_path(),
            name.replace('+', "%20")
        );
        // Not free: a repeat of a removal that took effect is a 404 the caller would misread.
        self.call(Resend::Refused, || {
            self.client.delete::<Value, _, _>(&path, None::<&()>)
        })
        .await
        .map(drop)
        .map_err(Self::op("remove label"))
    }

    /// Opens an issue; its URL.
    pub async fn create_issue(
        &self,
        title: &str,
        body: &str,
        labels: &[String],
    ) -> Result<String, ApiError> {
        // Not looked up: an issue's answer lost to a 5xx is reported, never opened twice blind.
        let path = format!("{}/issues", self.repo_path());
        let request = json!({"title": title, "body": body, "labels": labels});
        let v: Value = self
            .call(Resend::Refused, || self.client.post(&path, Some(&request)))
            .await
            .map_err(Self::op("create issue"))?;
        Ok(v["html_url"].as_str().unwrap_or("").to_string())
    }
}

/// `createCommitOnBranch`'s answer read: the commit, a moved head, or the error.
fn commit_result(operation: &'static str, answer: &Value) -> Result<CommitResult, ApiError> {
    if let Some(errors) = answer["errors"].as_array().filter(|e| !e.is_empty()) {
        let stale = errors.iter().any(|e| {
            e["type"] == "STALE_DATA"
                || e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("Expected branch to point to"))
        });
        if stale {
            return Ok(CommitResult::HeadMoved);
        }
        return Err(ApiError::Graphql {
            operation,
            message: crate::redact::redact(&super::api::error_messages(errors)),
        });
    }
    let commit = answer.pointer("/data/createCommitOnBranch/commit");
    let oid = commit
        .and_then(|c| c["oid"].as_str())
        .ok_or(ApiError::Graphql {
            operation,
            message: "the answer has no commit oid".into(),
        })?;
    Ok(CommitResult::Created {
        oid: oid.to_string(),
        url: commit.and_then(|c| c["url"].as_str()).map(str::to_string),
    })
}

/// Every file a commit changed (`GET /commits/{sha}`'s `files`) is one of `ops`: removed where
/// `ops` deletes it, else with the contents `ops` puts (git's blob id). A put whose contents did
/// not change the file is not listed, which is fine.
fn same_files(listed: &Value, ops: &[FileOp<'_>]) -> bool {
    let Some(listed) = listed.as_array() else {
        return false;
    };
    !listed.is_empty()
        && listed.iter().all(|f| {
            let name = f["filename"].as_str();
            ops.iter().any(|op| match op {
                FileOp::Put { path, contents } => {
                    name == Some(path)
                        && f["status"] != "removed"
                        && f["sha"].as_str() == Some(blob_id(contents).as_str())
                }
                FileOp::Delete { path } => name == Some(path) && f["status"] == "removed",
            })
        })
}

/// Git's id of a blob with these contents (`git hash-object`).
pub(crate) fn blob_id(contents: &[u8]) -> String {
    use sha1::Digest;
    let mut h = sha1::Sha1::new();
    h.update(format!("blob {}\0", contents.len()).as_bytes());
    h.update(contents);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}
