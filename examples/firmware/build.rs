//! Links the image for its board: `memory.x` for cortex-m-rt's `link.x` on the Cortex-M3,
//! `aarch64-virt.ld` on QEMU virt, and defmt's `defmt.x` when the `defmt` feature is on.

use std::env;
use std::fs;
use std::path::PathBuf;

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let arch = env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets the target arch");
    match arch.as_str() {
        "arm" => {
            fs::write(out.join("memory.x"), include_bytes!("memory.x")).expect("write memory.x");
            println!("cargo:rustc-link-arg=-Tlink.x");
        }
        "aarch64" => {
            fs::write(
                out.join("aarch64-virt.ld"),
                include_bytes!("aarch64-virt.ld"),
            )
            .expect("write aarch64-virt.ld");
            println!("cargo:rustc-link-arg=-Taarch64-virt.ld");
        }
        other => panic!("no board for target arch {other}: add one under src/board/"),
    }
    if env::var_os("CARGO_FEATURE_DEFMT").is_some() {
        println!("cargo:rustc-link-arg=-Tdefmt.x");
    }
    println!("cargo:rustc-link-search={}", out.display());
    println!("cargo:rerun-if-changed=memory.x");
    println!("cargo:rerun-if-changed=aarch64-virt.ld");
    println!("cargo:rerun-if-changed=build.rs");
}
