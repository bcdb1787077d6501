//! Logging macros routed to `log`, `defmt` or nowhere, chosen by feature (as embassy does).
//!
//! The rest of the crate calls `warn!` / `debug!` and never names a logging crate. Arguments are
//! kept to plain integers so the same call formats under both `log` and `defmt`.
#![allow(unused_macros)]

macro_rules! warn {
    ($s:literal $(, $x:expr)* $(,)?) => {{
        #[cfg(feature = "log")]
        ::log::warn!($s $(, $x)*);
        #[cfg(feature = "defmt")]
        ::defmt::warn!($s $(, $x)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        let _ = ($( & $x ),*);
    }};
}

macro_rules! debug {
    ($s:literal $(, $x:expr)* $(,)?) => {{
        #[cfg(feature = "log")]
        ::log::debug!($s $(, $x)*);
        #[cfg(feature = "defmt")]
        ::defmt::debug!($s $(, $x)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        let _ = ($( & $x ),*);
    }};
}
