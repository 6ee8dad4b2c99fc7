//! The sink's start: on the bus with its streams, the applied-command retention checked
//! against the commands stream's, no other consumer claiming task failures for another party,
//! and the durable consumer bound.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use futures::TryStreamExt;
use podstream_bus::{OnTheBus, streams};
use podstream_proto::subject::Subjects;

use super::{SinkConfig, SinkError, TASK_FAILURES_METADATA};
use crate::db::Database;
use crate::guard::TaskFailures;

/// Unacked commands the consumer may hand out: also what one sink may hold, its inbox
/// reading ahead of the lanes.
const MAX_ACK_PENDING: i64 = 20_000;

/// Why the sink does not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another consumer of the commands stream says another party fails task instances.
    #[error(
        "consumer {consumer} on {stream} says task failures belong to the {theirs}, and this sink would fail task instances as the {ours}: a failure would be applied twice. Start the sink with --task-failures {theirs}, or remove that consumer (`nats consumer rm {stream} {consumer}`) if nothing uses it any more"
    )]
    SecondFailureOwner {
        /// The other consumer.
        consumer: String,
        /// The stream.
        stream: String,
        /// What it says.
        theirs: String,
        /// What this sink would do.
        ours: &'static str,
    },
}

/// Refuses to start when a consumer other than `own` declares another owner of task failures.
async fn refuse_a_second_failure_owner(
    stream: &jetstream::stream::Stream,
    own: &str,
    ours: TaskFailures,
) -> Result<(), SinkError> {
    let mut consumers = stream.consumers();
    while let Some(info) = consumers.try_next().await.map_err(SinkError::Consumers)? {
        let theirs = info.config.metadata.get(TASK_FAILURES_METADATA);
        if info.name != own
            && let Some(theirs) = theirs
            && theirs != ours.name()
        {
            return Err(StartError::SecondFailureOwner {
                consumer: info.name.clone(),
                stream: info.stream_name.clone(),
                theirs: theirs.clone(),
                ours: ours.name(),
            }
            .into());
        }
    }
    Ok(())
}

/// A started sink: where it publishes, what it pulls, how long applied ids are kept.
pub(super) struct Started {
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub consumer: jetstream::consumer::PullConsumer,
    pub applied_retention: Option<Duration>,
}

/// Connects, makes the streams ready and binds the consumer.
pub(super) async fn start(config: &SinkConfig, db: &Database) -> Result<Started, SinkError> {
    let OnTheBus {
        js,
        subjects,
        streams: ready,
    } = podstream_bus::start(&config.bus, super::CLIENT, &super::STREAMS).await?;
    let commands = &ready[0];
    // Ids are kept at least as long as the stream as it is keeps commands, whoever set it.
    let applied_retention =
        crate::retention::applied_retention(config.applied_retention, commands.max_age)?;
    let stream = streams::while_unavailable(&commands.name, || js.get_stream(&commands.name))
        .await
        .map_err(SinkError::Stream)?;
    let task_failures = db.policy.task_failures;
    refuse_a_second_failure_owner(&stream, &config.consumer, task_failures).await?;
    // Created or updated: the consumer declares who fails TIs, for the executors to check.
    let wanted = pull::Config {
        durable_name: Some(config.consumer.clone()),
        filter_subject: subjects.commands_filter(None),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: config.ack_wait,
        max_ack_pending: MAX_ACK_PENDING,
        metadata: [(
            TASK_FAILURES_METADATA.to_owned(),
            task_failures.name().to_owned(),
        )]
        .into(),
        ..Default::default()
    };
    let consumer =
        streams::while_unavailable(&config.consumer, || stream.create_consumer(wanted.clone()))
            .await
            .map_err(SinkError::Consumer)?;
    Ok(Started {
        js,
        subjects,
        consumer,
        applied_retention,
    })
}
