//! Links the cdylib as `libnccl-tuner-strata.so` (the name `NCCL_TUNER_PLUGIN=strata` makes NCCL
//! look for), exporting the `ncclTunerPlugin_v*` symbols and nothing else.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=exports.map");
    if std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl-tuner-strata.so");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    }
}
