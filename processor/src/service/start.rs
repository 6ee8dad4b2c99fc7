//! The processor's start: on the bus with its streams, its bucket of task records, one pinned
//! consumer per scheduler (or one for every owner) and, with `--spark`, the Spark consumer.

use async_nats::jetstream::{self, consumer::PullConsumer, kv, stream};
use podstream_bus::consume::Pulling;
use podstream_bus::in_flight::InFlight;
use podstream_bus::pinned::{self, Pinned};
use podstream_bus::{OnTheBus, streams};
use podstream_proto::subject::{Stream, encode_token};

use super::worker::Worker;
use super::{ProcessConfig, ProcessError};
use crate::record_cache::RecordCache;
use crate::spark::SparkConsumer;

/// Unacked pod events one consumer may hand out.
const MAX_ACK_PENDING: i64 = 10_000;

/// A started processor: what its loops share, and what they pull.
pub(super) struct Started {
    pub worker: Worker,
    pub consumers: Vec<PullConsumer>,
    pub spark: Option<SparkConsumer>,
}

/// Connects, makes the streams and the bucket ready and binds the consumers.
pub(super) async fn start(config: &ProcessConfig) -> Result<Started, ProcessError> {
    let wanted = super::streams(config);
    let OnTheBus {
        js,
        subjects,
        streams: ready,
    } = podstream_bus::start(&config.bus, super::CLIENT, &wanted).await?;
    let pods = &ready[0];
    let records = open_bucket(&js, config, pods).await?;
    let pods = streams::while_unavailable(&pods.name, || js.get_stream(&pods.name))
        .await
        .map_err(|source| ProcessError::Stream {
            stream: pods.name.clone(),
            source,
        })?;
    let scopes: Vec<Option<&str>> = if config.schedulers.is_empty() {
        vec![None]
    } else {
        config.schedulers.iter().map(|s| Some(s.as_str())).collect()
    };
    let mut consumers = Vec::new();
    for scope in scopes {
        let name = match scope {
            None => config.consumer.clone(),
            Some(owner) => format!("{}-{}", config.consumer, encode_token(owner)),
        };
        let wanted = Pinned {
            name: &name,
            filter: subjects.pod_events_filter(scope),
            ack_wait: config.ack_wait,
            failover: config.failover,
            max_ack_pending: MAX_ACK_PENDING,
        };
        consumers.push(pinned::bind(&pods, wanted).await?);
    }
    let in_flight = InFlight::start(js.client(), config.ack_wait);
    let spark = match (&config.spark_bucket, ready.get(3)) {
        (Some(bucket), Some(spark)) => {
            let name = format!("{}-spark", config.consumer);
            let wanted = Pinned {
                name: &name,
                filter: subjects.stream_subjects(Stream::Spark),
                ack_wait: config.ack_wait,
                failover: config.failover,
                max_ack_pending: 0,
            };
            let spark = SparkConsumer::start(
                &js,
                &subjects,
                spark,
                bucket,
                wanted,
                Pulling {
                    batch_size: config.batch_size,
                    in_flight: in_flight.clone(),
                    health: config.health.clone(),
                },
            );
            Some(spark.await?)
        }
        _ => None,
    };
    let worker = Worker {
        in_flight,
        js,
        pods,
        records,
        cache: RecordCache::new(config.cached_records),
        subjects,
        rules: config.rules.clone(),
        health: config.health.clone(),
    };
    Ok(Started {
        worker,
        consumers,
        spark,
    })
}

/// The bucket of task records, kept as long and as replicated as the pod-events stream `pods`.
async fn open_bucket(
    js: &jetstream::Context,
    config: &ProcessConfig,
    pods: &stream::Config,
) -> Result<kv::Store, ProcessError> {
    podstream_bus::streams::records_bucket(js, &config.bucket, pods)
        .await
        .map_err(|source| ProcessError::Bucket {
            bucket: config.bucket.clone(),
            source,
        })
}
