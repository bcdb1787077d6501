//! The guide's examples as doctests, one item per `.md` file (compiled only for
//! `cargo test --doc`; the guide's page leaves its sections out then, so each example runs once).
//!
//! Each item's whole documentation is one `include_str!`, so rustdoc reports a failing example
//! at its own file and line: `core/src/guide/host_loop.md - guide::doctests::HostLoop
//! (line N)`, N being the example's line in `host_loop.md` (on the guide's page, where the
//! sections are joined, it was reported at `guide/mod.rs`, at a line of the whole page). Owns
//! nothing else: the text is the `.md` files'.

#[doc = include_str!("host_loop.md")]
pub struct HostLoop;

#[doc = include_str!("failures.md")]
pub struct Failures;

#[doc = include_str!("writing_a_shim.md")]
pub struct WritingAShim;

#[doc = include_str!("on_the_example_shim.md")]
pub struct OnTheExampleShim;

#[doc = include_str!("features.md")]
pub struct Features;

#[doc = include_str!("conformance.md")]
pub struct Conformance;

#[doc = include_str!("shim_calls.md")]
pub struct ShimCalls;

#[doc = include_str!("library.md")]
pub struct Library;
