//! What the hosts print and log, over semihosting: `say!` for the job's own lines, `error!`
//! for the shim's, and the sink of the core's diagnostics.
//!
//! With the `defmt` feature (the default) every line is a defmt frame: the format strings stay in
//! the ELF, the device sends indices and raw arguments, and `defmt-print` decodes them on the host
//! (`qemu.sh`), so the image carries no `core::fmt` float formatting. With `log` the same lines are
//! formatted as text on the device (`core::fmt`), the baseline of the footprint comparison. The
//! macros take one syntax that both accept: `{}` placeholders, arguments that implement both
//! `Display` and `defmt::Format`.

#[cfg(all(feature = "defmt", feature = "log"))]
compile_error!("the `defmt` and `log` features exclude each other: build with one");
#[cfg(not(any(feature = "defmt", feature = "log")))]
compile_error!("pick how the host logs: the `defmt` feature (default) or `log`");

/// Prints one line of the job's output.
#[cfg(feature = "defmt")]
macro_rules! say {
    ($($t:tt)*) => { ::defmt::println!($($t)*) };
}

/// Prints one line of the job's output.
#[cfg(feature = "log")]
macro_rules! say {
    ($($t:tt)*) => { $crate::out::print(format_args!($($t)*)) };
}

/// Logs an error of the device (the shim's voice).
#[cfg(feature = "defmt")]
macro_rules! error {
    ($($t:tt)*) => { ::defmt::error!($($t)*) };
}

/// Logs an error of the device (the shim's voice).
#[cfg(feature = "log")]
macro_rules! error {
    ($($t:tt)*) => { ::log::error!($($t)*) };
}

/// Sets up the sink of the core's diagnostics (nothing to do for defmt: its logger is global).
pub fn init() {
    #[cfg(feature = "log")]
    text::init();
}

#[cfg(feature = "log")]
pub use text::print;

/// Text over semihosting: `core::fmt` on the device.
#[cfg(feature = "log")]
mod text {
    use crate::semihosting;
    use core::fmt::{self, Write};

    /// Collects a line's bytes and hands them to the console in chunks (fewer traps).
    struct Line {
        buf: [u8; 128],
        len: usize,
    }

    impl Line {
        fn flush(&mut self) {
            semihosting::write(&self.buf[..self.len]);
            self.len = 0;
        }
    }

    impl Write for Line {
        fn write_str(&mut self, s: &str) -> fmt::Result {
            for &b in s.as_bytes() {
                if self.len == self.buf.len() {
                    self.flush();
                }
                self.buf[self.len] = b;
                self.len += 1;
            }
            Ok(())
        }
    }

    /// Prints `args` and a newline.
    pub fn print(args: fmt::Arguments<'_>) {
        let mut line = Line {
            buf: [0; 128],
            len: 0,
        };
        let _ = line.write_fmt(args);
        let _ = line.write_str("\n");
        line.flush();
    }

    struct TextLogger;

    impl log::Log for TextLogger {
        fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
            metadata.level() <= log::Level::Debug
        }

        fn log(&self, record: &log::Record<'_>) {
            if self.enabled(record.metadata()) {
                print(format_args!("{} {}", record.level(), record.args()));
            }
        }

        fn flush(&self) {}
    }

    static LOGGER: TextLogger = TextLogger;

    pub fn init() {
        // `set_logger` fails only when a logger is set already: there is none.
        let _ = log::set_logger(&LOGGER);
        log::set_max_level(log::LevelFilter::Debug);
    }
}

/// defmt frames over semihosting: each frame is encoded (rzCOBS) into a buffer and written to the
/// console when it ends, one trap per frame (two when it outgrows the buffer).
#[cfg(feature = "defmt")]
mod frames {
    use crate::semihosting;
    use core::cell::UnsafeCell;
    use core::sync::atomic::{AtomicBool, Ordering};

    #[defmt::global_logger]
    struct Logger;

    struct State {
        encoder: defmt::Encoder,
        buf: [u8; 256],
        len: usize,
    }

    /// The logger's state, reached only between `acquire` and `release` (see `TAKEN`).
    struct Shared(UnsafeCell<State>);

    // SAFETY: the state is reached only by the holder of `TAKEN`, one at a time.
    unsafe impl Sync for Shared {}

    static TAKEN: AtomicBool = AtomicBool::new(false);
    static STATE: Shared = Shared(UnsafeCell::new(State {
        encoder: defmt::Encoder::new(),
        buf: [0; 256],
        len: 0,
    }));

    fn push(buf: &mut [u8; 256], len: &mut usize, bytes: &[u8]) {
        for &b in bytes {
            if *len == buf.len() {
                semihosting::write(&buf[..]);
                *len = 0;
            }
            buf[*len] = b;
            *len += 1;
        }
    }

    /// The state, for the holder of `TAKEN`.
    ///
    /// # Safety
    ///
    /// The caller holds `TAKEN` (between `acquire` and `release`), and no other reference to the
    /// state is alive.
    unsafe fn state() -> &'static mut State {
        // SAFETY: the caller's promise: exclusive access while `TAKEN` is held.
        unsafe { &mut *STATE.0.get() }
    }

    // SAFETY: `acquire` takes `TAKEN` (a reentrant call, which only a fault inside the logger
    // could make, ends the program instead of aliasing the state), `release` gives it back, and
    // `write`/`flush`/`release` are only called in between (defmt's contract).
    unsafe impl defmt::Logger for Logger {
        fn acquire() {
            if TAKEN.swap(true, Ordering::Acquire) {
                semihosting::exit(3);
            }
            // SAFETY: `TAKEN` is now held by this frame.
            let State { encoder, buf, len } = unsafe { state() };
            encoder.start_frame(|b| push(buf, len, b));
        }

        unsafe fn flush() {}

        unsafe fn release() {
            // SAFETY: called after `acquire` (defmt's contract), so `TAKEN` is held.
            let State { encoder, buf, len } = unsafe { state() };
            encoder.end_frame(|b| push(buf, len, b));
            semihosting::write(&buf[..*len]);
            *len = 0;
            TAKEN.store(false, Ordering::Release);
        }

        unsafe fn write(bytes: &[u8]) {
            // SAFETY: as in `release`.
            let State { encoder, buf, len } = unsafe { state() };
            encoder.write(bytes, |b| push(buf, len, b));
        }
    }
}
