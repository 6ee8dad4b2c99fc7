//! What one watched scope's list is doing, as an explicit state machine (pure: no I/O).
//!
//! kube-runtime's `watcher` delivers a list as `Init`, the pods, `InitDone`, and live changes
//! after it. When the ingest knows a revision it had reached, the list is held back until it
//! is complete, so the apiserver's history since that revision can be replayed first; when it
//! knows none, the listed pods are published as they stream in. Either way the list's end
//! hands over the uids it saw, so pods that vanished unseen get their synthesized deletes.
//!
//! | state | input | next state | what the ingest does |
//! |---|---|---|---|
//! | any | list started, a revision known | `HeldBack` | sends what it staged |
//! | any | list started, no revision | `Streaming` | sends what it staged |
//! | `Watching` | a listed pod | as for "list started", then as below | (a list without its start) |
//! | `Streaming` | a listed pod | `Streaming` | publishes it |
//! | `HeldBack` | a listed pod | `HeldBack` | holds it |
//! | any | list done | `Watching` | replays history (if held back), publishes what it held, synthesizes deletes |
//! | any | a changed pod | unchanged | publishes it |

use std::mem;

use crate::known::{Sighting, UidSet};

/// Where one scope's list is.
#[derive(Debug, PartialEq, Eq, Default)]
pub enum ListState<P> {
    /// No list in progress: only live changes arrive.
    #[default]
    Watching,
    /// A list whose pods are published as they arrive (nothing to replay first).
    Streaming {
        /// Uids listed so far.
        seen: UidSet,
    },
    /// A list held back until it is complete: the history since `replay_from` goes first.
    HeldBack {
        /// The ingest's revision when the list began.
        replay_from: u64,
        /// Uids listed so far.
        seen: UidSet,
        /// The listed pods, in list order.
        items: Vec<P>,
    },
}

/// What arrives for a scope, in watch order.
#[derive(Debug, PartialEq, Eq)]
pub enum ListInput<P> {
    /// A list began.
    Started,
    /// A pod of the list, with its uid when it has one.
    Listed {
        /// The pod's uid.
        uid: Option<String>,
        /// The pod.
        pod: P,
    },
    /// The list is complete.
    Done,
    /// A pod changed, seen by the live watch.
    Changed(P),
}

/// What the ingest must do for one input.
#[derive(Debug, PartialEq, Eq)]
pub enum ListAction<P> {
    /// Nothing beyond the state change (a pod was held back).
    Hold,
    /// Send what was staged: a new list must not overtake what came before it.
    Flush,
    /// Publish this pod now, seen as it says.
    Publish(P, Sighting),
    /// The list is complete: replay the history after `replay_from` (when set), publish
    /// `items` in order, and synthesize deletes for known pods neither in `seen` nor replayed.
    Finish(FinishedList<P>),
}

/// A complete list, as the ingest finishes it.
#[derive(Debug, PartialEq, Eq)]
pub struct FinishedList<P> {
    /// Where the history replay starts, when the list was held back.
    pub replay_from: Option<u64>,
    /// Uids listed.
    pub seen: UidSet,
    /// The pods held back, in list order.
    pub items: Vec<P>,
}

impl<P> ListState<P> {
    /// A new list, held back when `cursor` (the ingest's revision) is known.
    fn started(cursor: Option<u64>) -> ListState<P> {
        match cursor {
            Some(replay_from) => ListState::HeldBack {
                replay_from,
                seen: UidSet::default(),
                items: Vec::new(),
            },
            None => ListState::Streaming {
                seen: UidSet::default(),
            },
        }
    }

    /// Takes `input`; `cursor` is the ingest's revision now. Returns what to do.
    pub fn on(&mut self, input: ListInput<P>, cursor: Option<u64>) -> ListAction<P> {
        match input {
            ListInput::Started => {
                *self = ListState::started(cursor);
                ListAction::Flush
            }
            ListInput::Listed { uid, pod } => {
                if matches!(self, ListState::Watching) {
                    *self = ListState::started(cursor);
                }
                match self {
                    // Left above: a list without its start starts here.
                    ListState::Watching => ListAction::Hold,
                    ListState::Streaming { seen } => {
                        seen.extend(uid);
                        ListAction::Publish(pod, Sighting::Listing)
                    }
                    ListState::HeldBack { seen, items, .. } => {
                        seen.extend(uid);
                        items.push(pod);
                        ListAction::Hold
                    }
                }
            }
            ListInput::Done => ListAction::Finish(match mem::take(self) {
                ListState::Watching => FinishedList {
                    replay_from: None,
                    seen: UidSet::default(),
                    items: Vec::new(),
                },
                ListState::Streaming { seen } => FinishedList {
                    replay_from: None,
                    seen,
                    items: Vec::new(),
                },
                ListState::HeldBack {
                    replay_from,
                    seen,
                    items,
                } => FinishedList {
                    replay_from: Some(replay_from),
                    seen,
                    items,
                },
            }),
            ListInput::Changed(pod) => ListAction::Publish(pod, Sighting::Watch),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(uid: &str) -> ListInput<&'static str> {
        ListInput::Listed {
            uid: Some(uid.to_owned()),
            pod: "pod",
        }
    }

    fn uids(list: &[&str]) -> UidSet {
        list.iter().map(|u| (*u).to_owned()).collect()
    }

    fn held(replay_from: u64, seen: &[&str], items: usize) -> ListState<&'static str> {
        ListState::HeldBack {
            replay_from,
            seen: uids(seen),
            items: vec!["pod"; items],
        }
    }

    fn streaming(seen: &[&str]) -> ListState<&'static str> {
        ListState::Streaming { seen: uids(seen) }
    }

    /// (case, state, input, cursor, next state, action)
    type Transition = (
        &'static str,
        ListState<&'static str>,
        ListInput<&'static str>,
        Option<u64>,
        ListState<&'static str>,
        ListAction<&'static str>,
    );

    #[test]
    fn transitions() {
        use ListAction::*;
        use ListState::Watching;
        #[rustfmt::skip]
        let table: Vec<Transition> = vec![
            ("a list with a known revision is held back",
                Watching, ListInput::Started, Some(7), held(7, &[], 0), Flush),
            ("a list without one streams",
                Watching, ListInput::Started, None, streaming(&[]), Flush),
            ("a restarted list starts over",
                held(3, &["a"], 1), ListInput::Started, Some(9), held(9, &[], 0), Flush),
            ("a held-back list holds its pods",
                held(7, &["a"], 1), listed("b"), Some(8), held(7, &["a", "b"], 2), Hold),
            ("a streaming list publishes its pods",
                streaming(&["a"]), listed("b"), None, streaming(&["a", "b"]), Publish("pod", Sighting::Listing)),
            ("a listed pod without a start starts the list",
                Watching, listed("a"), Some(4), held(4, &["a"], 1), Hold),
            ("a listed pod without a start or a revision streams",
                Watching, listed("a"), None, streaming(&["a"]), Publish("pod", Sighting::Listing)),
            ("a listed pod without a uid is held, not seen",
                held(7, &[], 0), ListInput::Listed { uid: None, pod: "pod" }, Some(7), held(7, &[], 1), Hold),
            ("the end of a held-back list hands over all of it",
                held(7, &["a", "b"], 2), ListInput::Done, Some(9), Watching,
                Finish(FinishedList { replay_from: Some(7), seen: uids(&["a", "b"]), items: vec!["pod"; 2] })),
            ("the end of a streaming list hands over what it saw",
                streaming(&["a"]), ListInput::Done, None, Watching,
                Finish(FinishedList { replay_from: None, seen: uids(&["a"]), items: vec![] })),
            ("an end without a list hands over nothing",
                Watching, ListInput::Done, Some(3), Watching,
                Finish(FinishedList { replay_from: None, seen: uids(&[]), items: vec![] })),
            ("a change is published whatever the list does",
                held(7, &["a"], 1), ListInput::Changed("pod"), Some(8), held(7, &["a"], 1), Publish("pod", Sighting::Watch)),
            ("a change while watching is published",
                Watching, ListInput::Changed("pod"), None, Watching, Publish("pod", Sighting::Watch)),
        ];
        let mut wrong = Vec::new();
        for (case, mut state, input, cursor, next, action) in table {
            let did = state.on(input, cursor);
            if state != next || did != action {
                wrong.push(format!(
                    "{case}:\n  expected {next:?} / {action:?}\n  got      {state:?} / {did:?}"
                ));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }
}
