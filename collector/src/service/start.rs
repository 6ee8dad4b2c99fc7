//! The collector's start: on the bus with its streams, the processor's bucket of task records
//! and its own bucket of pods collected, and the pinned consumer of every owner's commands.

use async_nats::jetstream::{self, consumer::PullConsumer, kv};
use podstream_bus::pinned::{self, Pinned};
use podstream_bus::{InFlight, OnTheBus, streams};
use podstream_proto::subject::Subjects;

use super::{CollectConfig, CollectError};

/// Unacked commands the consumer may hand out: those waiting out a grace period count too.
const MAX_ACK_PENDING: i64 = 10_000;

/// A started collector: what its handler needs, and what it pulls.
pub(super) struct Started {
    pub js: jetstream::Context,
    pub subjects: Subjects,
    pub commands: jetstream::stream::Stream,
    pub consumer: PullConsumer,
    pub records: kv::Store,
    pub collected: kv::Store,
    pub in_flight: InFlight,
}

/// Connects, makes the streams and buckets ready and binds the consumer.
pub(super) async fn start(config: &CollectConfig) -> Result<Started, CollectError> {
    let OnTheBus {
        js,
        subjects,
        streams: ready,
    } = podstream_bus::start(&config.bus, super::CLIENT, &super::STREAMS).await?;
    let (pods, commands) = (&ready[0], &ready[1]);
    let bucket_error = |bucket: &str| {
        let bucket = bucket.to_owned();
        move |source| CollectError::Bucket { bucket, source }
    };
    let records = streams::records_bucket(&js, &config.records_bucket, pods)
        .await
        .map_err(bucket_error(&config.records_bucket))?;
    let description = "podstream collector: the pods it deleted or labelled done, by uid";
    let collected = streams::bucket_beside(&js, &config.bucket, description, commands)
        .await
        .map_err(bucket_error(&config.bucket))?;
    let stream = streams::while_unavailable(&commands.name, || js.get_stream(&commands.name))
        .await
        .map_err(|source| CollectError::Stream {
            stream: commands.name.clone(),
            source,
        })?;
    let consumer = pinned::bind(
        &stream,
        Pinned {
            name: &config.consumer,
            filter: subjects.commands_filter(None),
            ack_wait: config.ack_wait,
            failover: config.failover,
            max_ack_pending: MAX_ACK_PENDING,
        },
    )
    .await?;
    let in_flight = InFlight::start(js.client(), config.ack_wait);
    Ok(Started {
        js,
        subjects,
        commands: stream,
        consumer,
        records,
        collected,
        in_flight,
    })
}
