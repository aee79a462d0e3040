//! The stand-in answers to the CUDA driver's SONAME, so that a process that loads it through
//! the normal path (`dlopen("libcuda.so.1")`) cannot tell it from the driver by name.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
