//! What the bus holds, read back: `tail` (as it flows), `replay` (a pod's or a task's story)
//! and the timeline page drawn from it.

pub(crate) mod lines;
pub(crate) mod replay;
pub(crate) mod tail;
pub(crate) mod timeline;
pub(crate) mod timeline_page;
