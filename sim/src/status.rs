//! API errors as kube-apiserver reports them: a `Status` object and its HTTP code.

use serde_json::{Value, json};

/// Why a request failed, with the `reason` string and HTTP code the real server uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// 400: the request could not be understood (bad body, bad selector, bad query).
    BadRequest,
    /// 401: the request carries no valid credentials.
    Unauthorized,
    /// 403: the request is refused (for example, creating in a terminating namespace).
    Forbidden,
    /// 404: the object or the resource does not exist.
    NotFound,
    /// 405: the verb is not supported on this resource.
    MethodNotAllowed,
    /// 409: an object with that name exists already.
    AlreadyExists,
    /// 409: a resourceVersion or uid precondition failed.
    Conflict,
    /// 410: the resourceVersion or continue token is older than the retained history.
    Expired,
    /// 415: the patch type is not one the server accepts.
    UnsupportedMediaType,
    /// 422: the object fails validation.
    Invalid,
    /// 504: the requested resourceVersion is newer than anything the server has.
    Timeout,
    /// 500: the simulator failed; a bug, never the client's fault.
    InternalError,
}

impl Reason {
    /// The HTTP status code sent with this reason.
    pub fn code(self) -> u16 {
        match self {
            Reason::BadRequest => 400,
            Reason::Unauthorized => 401,
            Reason::Forbidden => 403,
            Reason::NotFound => 404,
            Reason::MethodNotAllowed => 405,
            Reason::AlreadyExists | Reason::Conflict => 409,
            Reason::Expired => 410,
            Reason::UnsupportedMediaType => 415,
            Reason::Invalid => 422,
            Reason::Timeout => 504,
            Reason::InternalError => 500,
        }
    }

    /// The `reason` field of the Status object.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::BadRequest => "BadRequest",
            Reason::Unauthorized => "Unauthorized",
            Reason::Forbidden => "Forbidden",
            Reason::NotFound => "NotFound",
            Reason::MethodNotAllowed => "MethodNotAllowed",
            Reason::AlreadyExists => "AlreadyExists",
            Reason::Conflict => "Conflict",
            Reason::Expired => "Expired",
            Reason::UnsupportedMediaType => "UnsupportedMediaType",
            Reason::Invalid => "Invalid",
            Reason::Timeout => "Timeout",
            Reason::InternalError => "InternalError",
        }
    }
}

/// A failed API call: what the client receives as a `Status` object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message} ({})", reason.as_str())]
pub struct ApiError {
    /// The machine-readable reason; callers act on this.
    pub reason: Reason,
    /// The human-readable message, worded like kube-apiserver's.
    pub message: String,
    /// `details.name`, `details.group` and `details.kind` when the error is about one object.
    pub details: Option<Box<Details>>,
}

/// The object an error is about, and field causes for `Invalid`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Details {
    /// The object's name.
    pub name: String,
    /// The API group ("" for core).
    pub group: String,
    /// The resource plural (`pods`) or, for `Invalid`, the kind (`Pod`).
    pub kind: String,
    /// `(field, message)` pairs explaining an `Invalid`.
    pub causes: Vec<(String, String)>,
}

impl ApiError {
    /// An error with no object details.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        ApiError {
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// 400 with the given message.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Reason::BadRequest, message)
    }

    /// 404 for a named object: `pods "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        ApiError {
            reason: Reason::NotFound,
            message: format!("{qualified} \"{name}\" not found"),
            details: Some(Box::new(Details {
                name: name.to_owned(),
                group: group.to_owned(),
                kind: plural.to_owned(),
                causes: Vec::new(),
            })),
        }
    }

    /// 409 on create: `pods "x" already exists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        ApiError {
            reason: Reason::AlreadyExists,
            message: format!("{qualified} \"{name}\" already exists"),
            details: Some(Box::new(Details {
                name: name.to_owned(),
                group: group.to_owned(),
                kind: plural.to_owned(),
                causes: Vec::new(),
            })),
        }
    }

    /// 409 on a failed precondition, worded like the optimistic-concurrency error.
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, plural);
        ApiError {
            reason: Reason::Conflict,
            message: format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
            details: Some(Box::new(Details {
                name: name.to_owned(),
                group: group.to_owned(),
                kind: plural.to_owned(),
                causes: Vec::new(),
            })),
        }
    }

    /// 422 with field causes: `Pod "x" is invalid: spec.containers: Required value`.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let listed = causes
            .iter()
            .map(|(field, why)| format!("{field}: {why}"))
            .collect::<Vec<_>>();
        let joined = if listed.len() == 1 {
            listed.join("")
        } else {
            format!("[{}]", listed.join(", "))
        };
        ApiError {
            reason: Reason::Invalid,
            message: format!("{kind} \"{name}\" is invalid: {joined}"),
            details: Some(Box::new(Details {
                name: name.to_owned(),
                group: group.to_owned(),
                kind: kind.to_owned(),
                causes,
            })),
        }
    }

    /// 410 for a resourceVersion that compaction removed.
    pub fn too_old(requested: u64, oldest: u64) -> Self {
        Self::new(
            Reason::Expired,
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        self.reason.code()
    }

    /// The `Status` object sent as the body (or inside a watch ERROR event).
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason.as_str(),
            "code": self.code(),
        });
        if let Some(details) = &self.details {
            let mut body = json!({ "name": details.name, "kind": details.kind });
            if !details.group.is_empty() {
                body["group"] = json!(details.group);
            }
            if !details.causes.is_empty() {
                body["causes"] = details
                    .causes
                    .iter()
                    .map(|(field, why)| {
                        json!({ "reason": "FieldValueInvalid", "message": why, "field": field })
                    })
                    .collect();
            }
            status["details"] = body;
        }
        status
    }
}

/// `pods` or `leases.coordination.k8s.io`, as messages name a resource.
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

/// The `Status` body of a successful delete of an object that is gone at once.
pub fn success() -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success" })
}
