//! Links the cdylib as a drop-in `libnccl.so.2`: that SONAME, and a version script that
//! exports the `nccl*` and `pnccl*` symbols and nothing else.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let target = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    println!("cargo:rerun-if-changed=exports.map");
    if target == "linux" {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
        println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/exports.map");
    }
}
