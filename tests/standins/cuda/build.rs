//! The stand-in answers to the CUDA driver's SONAME, so that a process that loads it through
//! the normal path (`dlopen("libcuda.so.1")`) cannot tell it from the driver by name. It also
//! compiles strata's kernel program as C (`STRATA_HOST`): `reduce.cu`, then `ll.cu`, as one
//! translation unit, as NVRTC compiles them; those host versions are what its
//! `cuLaunchKernel` runs.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../src/gpu/kernels");
    let sources = ["reduce.cu", "ll.cu"].map(|f| dir.join(f));
    let mut unit = String::new();
    for s in &sources {
        println!("cargo:rerun-if-changed={}", s.display());
        unit.push_str(&format!("#include \"{}\"\n", s.display()));
    }
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let file = out.join("strata_kernels_host.c");
    std::fs::write(&file, unit).expect("writing the kernels' translation unit");
    cc::Build::new()
        .file(&file)
        .flag("-std=c11")
        .define("STRATA_HOST", None)
        .define("_POSIX_C_SOURCE", "200809L")
        .opt_level(2)
        .warnings_into_errors(true)
        .compile("strata_kernels_host");
}
