//! Compiles `proto/agentmesh/v1/*.proto` with a vendored `protoc`, so a fresh
//! machine needs nothing installed, and writes the descriptor set used by
//! server reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let include = protoc_bin_vendored::include_path()?;
    // SAFETY of intent: build scripts are single-threaded; prost-build reads PROTOC.
    unsafe_env_set("PROTOC", &protoc);

    // The manifest directory of this run, not of the build that compiled
    // this script: checkouts at different paths sharing one target
    // directory reuse the compiled script, and must each read their own
    // protos. For the same reason the rerun paths are relative (Cargo
    // resolves them against the package being built).
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let relative = PathBuf::from("../../proto");
    let root = manifest.join(&relative);
    let dir = root.join("agentmesh/v1");
    let mut names: Vec<std::ffi::OsString> = std::fs::read_dir(&dir)?
        .filter_map(|entry| entry.ok().map(|e| e.file_name()))
        .filter(|name| std::path::Path::new(name).extension().is_some_and(|ext| ext == "proto"))
        .collect();
    names.sort();
    for name in &names {
        println!("cargo:rerun-if-changed={}", relative.join("agentmesh/v1").join(name).display());
    }
    println!("cargo:rerun-if-changed={}", relative.join("agentmesh/v1").display());
    let files: Vec<PathBuf> = names.iter().map(|name| dir.join(name)).collect();

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
