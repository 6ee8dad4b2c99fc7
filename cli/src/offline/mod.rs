//! The pipeline's rules without a bus: `decide` (pod watch events read as kubectl writes them
//! → commands) and `apply` (commands → the metadata database).

pub(crate) mod apply;
pub(crate) mod decide;
pub(crate) mod json_stream;
pub(crate) mod read_ahead;
pub(crate) mod spark_json;
