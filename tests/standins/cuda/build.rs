//! The stand-in answers to the CUDA driver's SONAME, so that a process that loads it through
//! the normal path (`dlopen("libcuda.so.1")`) cannot tell it from the driver by name. It also
//! compiles strata's kernel source as C (`STRATA_HOST`): those host versions are what its
//! `cuLaunchKernel` runs.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    let src = "../../../src/gpu/kernels/reduce.cu";
    println!("cargo:rerun-if-changed={src}");
    cc::Build::new()
        .file(src)
        .flag("-xc")
        .flag("-std=c11")
        .define("STRATA_HOST", None)
        .opt_level(2)
        .warnings_into_errors(true)
        .compile("strata_kernels_host");
}
