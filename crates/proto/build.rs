//! Compiles `proto/agentmesh/v1/*.proto` with a vendored `protoc`, so a fresh
//! machine needs nothing installed, and writes the descriptor set used by
//! server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    // SAFETY of intent: build scripts are single-threaded; prost-build reads PROTOC.
    unsafe_env_set("PROTOC", &protoc);

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let dir = root.join("agentmesh/v1");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "proto"))
        .collect();
    files.sort();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    println!("cargo:rerun-if-changed={}", dir.display());

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("agentmesh_descriptor.bin"))
        .compile_protos(&files, &[root, include])?;
    Ok(())
}

fn unsafe_env_set(key: &str, value: &std::path::Path) {
    // `std::env::set_var` is unsafe in edition 2024 only because of other
    // threads; a build script has none.
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var(key, value);
    }
}
