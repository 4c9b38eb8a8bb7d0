//! Compiles the worker protocol (`proto/cluster.proto`) with protoc (Debian
//! `protobuf-compiler`; `PROTOC` names another).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/cluster.proto");
    tonic_prost_build::configure().compile_protos(&["proto/cluster.proto"], &["proto"])?;
    Ok(())
}
