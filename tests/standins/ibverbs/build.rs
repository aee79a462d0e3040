//! The stand-in answers to libibverbs' SONAME, so a process that loads it through the normal
//! path (`dlopen("libibverbs.so.1")`) cannot tell it from rdma-core by name.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
