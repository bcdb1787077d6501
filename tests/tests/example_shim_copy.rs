//! The guide's listing of the example shim (`core/src/guide/example_shim.rs`, included in
//! `devcmd::guide` section 3) is a copy of this crate's `src/example_shim.rs`, the one rustc,
//! clippy and the suite check: each packaged crate must hold the files it includes, so the source
//! is in both. This test fails when they differ; copy `tests/src/example_shim.rs` over the
//! guide's. (Skipped where the core's source is not beside this crate, as in a packaged crate.)

use std::path::Path;

#[test]
fn the_guides_listing_is_the_checked_example_shim() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let guide = here.join("../core/src/guide/example_shim.rs");
    let Ok(listed) = std::fs::read_to_string(&guide) else {
        println!("skipped: no {} beside this crate", guide.display());
        return;
    };
    let checked = include_str!("../src/example_shim.rs");
    assert!(
        listed == checked,
        "{} differs from tests/src/example_shim.rs: copy the checked file over the guide's \
         listing (cp tests/src/example_shim.rs core/src/guide/example_shim.rs)",
        guide.display()
    );
}
