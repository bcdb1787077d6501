//! Copy layouts: the only shapes of data the core hands a device copy.
//!
//! Owns the validation of strides into a [`CopyLayout`] and the one walk over its rows. A leaf:
//! the shim contract names it. Does not own the staging decision (`staging.rs`) nor the copies
//! themselves (the engine enqueues them, the shim runs them).

use crate::error::IoError;

/// One row of a copy (see [`CopyLayout::rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CopyRow {
    /// Offset of the row on the host side (packed).
    pub host: u64,
    /// Offset of the row on the device side.
    pub device: u64,
    /// Bytes in the row.
    pub len: u64,
}

/// One piece of a copy cut by [`CopyLayout::pieces`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CopyPiece {
    /// Offset of the piece on the host side (packed), from the start of the copy.
    pub host: u64,
    /// Offset of the piece's first byte on the device side, from the start of the copy.
    pub device: u64,
    /// The piece's own layout (its host side packed).
    pub layout: CopyLayout,
}

/// The device-side geometry of a copy, in bytes: `height` rows of `width` bytes, each row starting
/// `pitch` bytes after the previous one. The host side of a copy is always packed
/// (`height * width` bytes). Built only by [`CopyLayout::of`] or [`CopyLayout::linear`], so a shim
/// never sees raw strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct CopyLayout {
    width: u64,
    height: u64,
    pitch: u64,
}

impl CopyLayout {
    /// A packed run of `bytes` bytes.
    pub const fn linear(bytes: u64) -> Self {
        Self {
            width: bytes,
            height: 1,
            pitch: bytes,
        }
    }

    /// The layout of a tensor of `shape` with element `strides` (in elements) and `elem_size`
    /// bytes per element.
    ///
    /// Accepts pitched row-major layouts only: the last stride is 1, no stride is zero, the row
    /// stride is at least the row width, and every outer stride is the next one times its
    /// dimension (outer dimensions packed over the row stride). Empty data (any zero dimension)
    /// is accepted as an empty linear layout without looking at the strides.
    ///
    /// # Errors
    ///
    /// [`IoError::UnsupportedStrides`] naming the first dimension that breaks the rule, also for
    /// a rank mismatch between `shape` and `strides` or a size that overflows `u64`.
    pub fn of(shape: &[u64], strides: &[u64], elem_size: u64) -> Result<Self, IoError> {
        let rank = shape.len();
        let unsupported = |dim| IoError::UnsupportedStrides { rank, dim };
        if strides.len() != rank {
            return Err(unsupported(0));
        }
        if shape.contains(&0) || elem_size == 0 {
            return Ok(Self::linear(0));
        }
        if rank == 0 {
            return Ok(Self::linear(elem_size));
        }
        let last = rank - 1;
        if strides[last] != 1 {
            return Err(unsupported(last));
        }
        let row_elems = shape[last];
        let mut rows: u64 = 1;
        let mut row_stride = row_elems;
        if rank >= 2 {
            row_stride = strides[rank - 2];
            if row_stride == 0 || row_stride < row_elems {
                return Err(unsupported(rank - 2));
            }
            rows = shape[rank - 2];
            let mut expected = row_stride;
            for dim in (0..rank - 2).rev() {
                expected = expected
                    .checked_mul(shape[dim + 1])
                    .ok_or(unsupported(dim))?;
                if strides[dim] != expected {
                    return Err(unsupported(dim));
                }
                rows = rows.checked_mul(shape[dim]).ok_or(unsupported(dim))?;
            }
        }
        let width = row_elems.checked_mul(elem_size).ok_or(unsupported(last))?;
        let pitch = row_stride.checked_mul(elem_size).ok_or(unsupported(last))?;
        if width == pitch {
            let total = width.checked_mul(rows).ok_or(unsupported(0))?;
            return Ok(Self::linear(total));
        }
        // The device span must be addressable: (rows - 1) * pitch + width.
        (rows - 1)
            .checked_mul(pitch)
            .and_then(|b| b.checked_add(width))
            .ok_or(unsupported(0))?;
        Ok(Self {
            width,
            height: rows,
            pitch,
        })
    }

    /// Bytes per row.
    pub const fn width(&self) -> u64 {
        self.width
    }

    /// Number of rows.
    pub const fn height(&self) -> u64 {
        self.height
    }

    /// Bytes from the start of one device row to the start of the next.
    pub const fn pitch(&self) -> u64 {
        self.pitch
    }

    /// Whether the rows are packed (one plain copy).
    pub const fn is_linear(&self) -> bool {
        self.height <= 1 || self.pitch == self.width
    }

    /// Bytes on the host side (packed).
    pub const fn packed_bytes(&self) -> u64 {
        self.width * self.height
    }

    /// The rows of the copy, in order: where each starts on the host side (packed) and on the
    /// device side (pitched), both from the start of the copy, and its length. A linear layout is
    /// one row. The one walk every copy (and every failure mark of a copy) makes.
    ///
    /// ```
    /// use devcmd::copy::{CopyLayout, CopyRow};
    /// // Two rows of 4 bytes, 16 bytes apart on the device.
    /// let layout = CopyLayout::of(&[2, 4], &[16, 1], 1).unwrap();
    /// let rows: Vec<CopyRow> = layout.rows().collect();
    /// assert_eq!(rows, [CopyRow { host: 0, device: 0, len: 4 }, CopyRow { host: 4, device: 16, len: 4 }]);
    /// assert_eq!(CopyLayout::linear(10).rows().count(), 1);
    /// ```
    pub fn rows(&self) -> impl Iterator<Item = CopyRow> + use<> {
        let (height, width, pitch) = if self.is_linear() {
            (u64::from(self.packed_bytes() > 0), self.packed_bytes(), 0)
        } else {
            (self.height, self.width, self.pitch)
        };
        (0..height).map(move |r| CopyRow {
            host: r * width,
            device: r * pitch,
            len: width,
        })
    }

    /// The copy cut into pieces of at most `max` packed bytes, in order, each a copy of its own:
    /// where it starts on the host side (packed) and on the device side, and its layout. Whole
    /// rows go together while they fit; a row longer than `max` is cut into linear pieces. The
    /// pieces cover the rows exactly once (the walk of a pipelined copy, `command/pipeline.rs`).
    /// A `max` of 0 is taken as 1.
    ///
    /// ```
    /// use devcmd::copy::CopyLayout;
    /// // Three rows of 4 bytes, 16 apart on the device, in pieces of at most 8 bytes.
    /// let layout = CopyLayout::of(&[3, 4], &[16, 1], 1).unwrap();
    /// let pieces: Vec<_> = layout.pieces(8).map(|p| (p.host, p.device, p.layout.height())).collect();
    /// assert_eq!(pieces, [(0, 0, 2), (8, 32, 1)]);
    /// ```
    pub fn pieces(&self, max: u64) -> impl Iterator<Item = CopyPiece> + use<> {
        let max = max.max(1);
        let layout = *self;
        let rows_per = if layout.is_linear() || layout.width == 0 {
            0
        } else {
            max / layout.width
        };
        let total = layout.packed_bytes();
        // Cursor: packed bytes done so far.
        let mut done = 0u64;
        core::iter::from_fn(move || {
            if done >= total {
                return None;
            }
            let piece = if layout.is_linear() || rows_per == 0 {
                // Linear, or rows longer than a piece: a part of one row at a time.
                let (row, within) = if layout.is_linear() {
                    (0, done)
                } else {
                    (done / layout.width, done % layout.width)
                };
                let row_len = if layout.is_linear() {
                    total
                } else {
                    layout.width
                };
                let len = (row_len - within).min(max);
                CopyPiece {
                    host: done,
                    device: row * layout.pitch + within,
                    layout: Self::linear(len),
                }
            } else {
                let row = done / layout.width;
                let height = rows_per.min(layout.height - row);
                CopyPiece {
                    host: done,
                    device: row * layout.pitch,
                    layout: Self {
                        width: layout.width,
                        height,
                        pitch: layout.pitch,
                    },
                }
            };
            done += piece.layout.packed_bytes();
            Some(piece)
        })
    }

    /// Bytes the device side spans, from the first byte of the first row to the last of the last.
    pub const fn device_span(&self) -> u64 {
        if self.height == 0 {
            0
        } else {
            (self.height - 1) * self.pitch + self.width
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn contiguous_rows_are_linear() {
        assert!(CopyLayout::of(&[4, 8], &[8, 1], 4).unwrap().is_linear());
        assert_eq!(
            CopyLayout::of(&[8], &[1], 4).unwrap(),
            CopyLayout::linear(32)
        );
        assert_eq!(CopyLayout::of(&[], &[], 4).unwrap(), CopyLayout::linear(4));
    }

    #[test]
    fn padded_rows_report_width_height_and_pitch() {
        let l = CopyLayout::of(&[4, 8], &[12, 1], 4).unwrap();
        assert_eq!((l.width(), l.pitch(), l.height()), (32, 48, 4));
        assert_eq!(l.device_span(), 3 * 48 + 32);
        assert_eq!(l.packed_bytes(), 128);
    }

    #[test]
    fn height_counts_every_row_not_only_the_last_dimension() {
        let l = CopyLayout::of(&[2, 3, 8], &[36, 12, 1], 4).unwrap();
        assert_eq!((l.width(), l.pitch(), l.height()), (32, 48, 6));
    }

    #[test]
    fn the_geometry_is_bytes_not_elements() {
        let a = CopyLayout::of(&[4, 8], &[12, 1], 1).unwrap();
        let b = CopyLayout::of(&[4, 8], &[12, 1], 8).unwrap();
        assert_eq!(
            (b.width(), b.pitch(), b.height()),
            (a.width() * 8, a.pitch() * 8, a.height())
        );
    }

    #[test]
    fn non_row_major_layouts_are_refused() {
        let bad = |shape: &[u64], strides: &[u64]| CopyLayout::of(shape, strides, 4).unwrap_err();
        assert_eq!(
            bad(&[4, 8], &[1, 4]),
            IoError::UnsupportedStrides { rank: 2, dim: 1 }
        );
        assert_eq!(
            bad(&[4, 8], &[0, 1]),
            IoError::UnsupportedStrides { rank: 2, dim: 0 }
        );
        assert_eq!(
            bad(&[4, 8], &[6, 1]),
            IoError::UnsupportedStrides { rank: 2, dim: 0 }
        );
        assert_eq!(
            bad(&[2, 3, 8], &[40, 12, 1]),
            IoError::UnsupportedStrides { rank: 3, dim: 0 }
        );
        assert_eq!(
            bad(&[4, 8], &[8]),
            IoError::UnsupportedStrides { rank: 2, dim: 0 }
        );
        assert!(matches!(
            bad(&[u64::MAX, 8], &[16, 1]),
            IoError::UnsupportedStrides { .. }
        ));
    }

    /// The rows a list of pieces writes, as (host, device, len) bytes, one entry per byte run.
    fn bytes_of(pieces: impl Iterator<Item = CopyPiece>) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for p in pieces {
            for r in p.layout.rows() {
                for b in 0..r.len {
                    out.push((p.host + r.host + b, p.device + r.device + b));
                }
            }
        }
        out
    }

    proptest::proptest! {
        /// The pieces write exactly the bytes the whole copy writes, in order, each at most
        /// `max` bytes.
        #[test]
        fn pieces_cover_the_rows_once(
            width in 1u64..40, pad in 0u64..8, height in 0u64..12, max in 0u64..100,
        ) {
            let layout = if height <= 1 || pad == 0 {
                CopyLayout::linear(width * height)
            } else {
                CopyLayout { width, height, pitch: width + pad }
            };
            let whole = bytes_of(core::iter::once(CopyPiece { host: 0, device: 0, layout }));
            proptest::prop_assert_eq!(bytes_of(layout.pieces(max)), whole);
            for p in layout.pieces(max) {
                proptest::prop_assert!(p.layout.packed_bytes() <= max.max(1));
                proptest::prop_assert!(p.layout.packed_bytes() > 0);
            }
        }
    }

    #[test]
    fn empty_data_is_checked_for_nothing() {
        assert_eq!(
            CopyLayout::of(&[0, 8], &[0, 7], 4).unwrap(),
            CopyLayout::linear(0)
        );
    }
}
