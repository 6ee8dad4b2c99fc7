//! The `Podstream-Role` header on the bus: a message on a pod's previous owner's subject that
//! tells that scheduler the pod left it (`left`), beside the message on its current owner's.

use async_nats::HeaderMap;
use podstream_proto::subject::{ROLE_HEADER, Role};

/// Headers marking a message with `role`.
pub fn headers(role: Role) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(ROLE_HEADER, role.as_str());
    headers
}

/// Whether a message is the copy for the previous owner (`Podstream-Role: left`): decided
/// and applied once, from the message on the current owner's subject.
pub fn is_left_notice(headers: Option<&HeaderMap>) -> bool {
    headers
        .and_then(|h| h.get(ROLE_HEADER))
        .is_some_and(|role| role.as_str() == Role::Left.as_str())
}
