//! `--spark`: the driver pods of Airflow's Spark jobs and their SparkApplications, on
//! `ingest`, `process` and `run` (issue 25).

use clap::Args;
use podstream_processor::spark::SPARK_ROLE;
use podstream_proto::subject::Subjects;

/// Whether Spark driver pods are watched (ingest) and decided (process).
#[derive(Debug, Clone, Args)]
pub struct SparkArgs {
    /// Also watch (ingest) and decide (process) the driver pods of Airflow-launched Spark
    /// jobs (`spark-role=driver,spark_kubernetes_operator=True`) and the SparkApplications
    /// (`sparkoperator.k8s.io/v1beta2`) that own them, on `<prefix>.spark.>`: each job's
    /// driver is chosen, a duplicate reported when there are several, and the choice kept
    /// for `PodstreamSparkKubernetesOperator`.
    #[arg(long, env = "PODSTREAM_SPARK")]
    pub spark: bool,
}

/// Where the processor keeps the Spark jobs' records and choices.
#[derive(Debug, Clone, Args)]
pub struct SparkBucketArgs {
    /// KV bucket of the Spark jobs' records and their chosen drivers (with --spark)
    /// [default: <prefix>-spark].
    #[arg(long, env = "PODSTREAM_SPARK_BUCKET")]
    pub spark_bucket: Option<String>,
}

impl SparkBucketArgs {
    /// The processor's Spark bucket, when `spark` says Spark objects are decided; unnamed,
    /// it is the prefix's (`subjects`).
    pub fn bucket(&self, spark: &SparkArgs, subjects: &Subjects) -> Option<String> {
        spark.spark.then(|| {
            self.spark_bucket
                .clone()
                .unwrap_or_else(|| subjects.resource_name(SPARK_ROLE))
        })
    }
}
