//! Generates the Rust types of `proto/podstream/v1/podstream.proto` with a
//! pure-Rust protobuf parser, so building needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/podstream/v1/podstream.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    // The schema as a FileDescriptorSet, for readers that build their types at run time
    // (podstream-airflow ships a copy, checked against this one by the tests).
    // Without comments and source positions: only a change of the schema changes the copy.
    let mut schema = descriptors.clone();
    for file in &mut schema.file {
        file.source_code_info = None;
    }
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("podstream.binpb"),
        prost::Message::encode_to_vec(&schema),
    )?;
    let serde = "#[derive(serde::Serialize, serde::Deserialize)]";
    prost_build::Config::new()
        // Every type serializes: TaskKey and PodRef appear as-is in `podstream decide` output
        // (contract §1), and the processor keeps its state and outbox as JSON in KV.
        .type_attribute(".podstream.v1", serde)
        // Sortable, for deterministic output of the processor's state.
        .type_attribute(".podstream.v1.TaskKey", "#[derive(PartialOrd, Ord)]")
        .type_attribute(".podstream.v1.PodRef", "#[derive(PartialOrd, Ord)]")
        .field_attribute(
            ".podstream.v1.TaskKey.logical_date",
            "#[serde(default, skip_serializing_if = \"String::is_empty\")]",
        )
        // Fields added after records were first kept as JSON: absent in older ones.
        .field_attribute(
            ".podstream.v1.Fail.container_reason",
            "#[serde(default, skip_serializing_if = \"String::is_empty\")]",
        )
        .field_attribute(
            ".podstream.v1.TaskKey.task_instance_id",
            "#[serde(default, skip_serializing_if = \"String::is_empty\")]",
        )
        .compile_fds(descriptors)?;
    Ok(())
}
