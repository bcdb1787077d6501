//! Typed host I/O: uploads from `&[T]` and reads into `&mut [T]` or a `Vec<T>` for plain-data
//! `T` ([`bytemuck::Pod`]: `f32`, `u16`, `[f32; 4]`, your own `#[repr(C)]` structs that derive
//! it), in the host's native byte order, which is what kernels read and write.
//!
//! Owns the conversions between typed slices and the bytes of the byte API, and their length
//! checks. Does not own the copies (`transfer.rs`, `host_side.rs`): every typed call is the byte
//! call underneath, with the same staging, order and errors.

use super::{Command, ReadRequest};
use crate::error::{ServerError, Validation};
use crate::host::HostBuffer;
use crate::memory::Handle;
use crate::shim::Shim;
use alloc::vec::Vec;
use bytemuck::Pod;

impl<S: Shim> Command<'_, S> {
    /// A new allocation holding a copy of `data`, in native byte order: [`Self::create`] for
    /// typed data.
    ///
    /// ```
    /// use devcmd::{Device, DeviceConfig, StreamId};
    /// use devcmd_std::StdShim;
    ///
    /// # fn main() -> Result<(), devcmd::ServerError> {
    /// let mut device = Device::new(StdShim::new(), DeviceConfig::default());
    /// let mut cmd = device.command(StreamId(0))?;
    /// let x = cmd.create_typed(&[1.0f32, 2.0, 3.0])?;
    /// assert_eq!(x.len(), 12);
    /// let mut back = [0f32; 3];
    /// cmd.read_typed(&x, &mut back)?;
    /// assert_eq!(back, [1.0, 2.0, 3.0]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Self::create`].
    pub fn create_typed<T: Pod>(&mut self, data: &[T]) -> Result<Handle, ServerError> {
        self.create(bytemuck::cast_slice(data))
    }

    /// Uploads `data` into the whole view of `handle` (its bytes are copied before this returns):
    /// [`Self::write_from`] for typed data.
    ///
    /// # Errors
    ///
    /// As [`Self::write_from`]: [`Validation::LengthMismatch`] when `data`'s bytes are not the
    /// view's length.
    pub fn write_typed<T: Pod>(&mut self, handle: &Handle, data: &[T]) -> Result<(), ServerError> {
        self.write_from(handle, bytemuck::cast_slice(data))
    }

    /// Reads the whole view of `handle` into `dst` and **waits** for it: the blocking read of a
    /// host that wants its results in its own array. For a read that overlaps other work, use
    /// [`Self::read_async`] and [`HostBuffer::to_vec_of`] on what it gives.
    ///
    /// # Errors
    ///
    /// [`Validation::LengthMismatch`] when `dst`'s bytes are not the view's length; as
    /// [`Self::read_async`] and the wait of its future.
    pub fn read_typed<T: Pod>(
        &mut self,
        handle: &Handle,
        dst: &mut [T],
    ) -> Result<(), ServerError> {
        let found = core::mem::size_of_val(dst) as u64;
        if found != handle.len() {
            return Err(Validation::LengthMismatch {
                expected: handle.len(),
                found,
            }
            .into());
        }
        let bytes = self.read_async(&[ReadRequest::whole(handle)])?.wait()?;
        let Some(got) = bytes.first() else {
            return Ok(());
        };
        got.copy_to(dst)?;
        Ok(())
    }
}

impl HostBuffer {
    /// A heap buffer holding a copy of `data`'s bytes, in native byte order.
    ///
    /// Allocates as `Vec` does (the global allocator's failure aborts); where a heap can run out
    /// (a firmware's), take a buffer from [`Command::reserve_host`], whose failure is an error,
    /// and fill it with [`Self::copy_from`].
    pub fn copy_of<T: Pod>(data: &[T]) -> Self {
        Self::from_vec(bytemuck::cast_slice(data).to_vec())
    }

    /// Fills the buffer with `src`'s bytes, in native byte order: a staging buffer from
    /// [`Command::reserve_host`] filled from typed data.
    ///
    /// # Errors
    ///
    /// [`Validation::HostBufferLength`] when `src`'s bytes are not the buffer's length;
    /// [`Validation::ReadOnlyDestination`] for external (read-only) bytes.
    pub fn copy_from<T: Pod>(&mut self, src: &[T]) -> Result<(), Validation> {
        let src: &[u8] = bytemuck::cast_slice(src);
        self.check_len("HostBuffer::copy_from", src.len())?;
        let dst = self.as_mut_slice();
        if dst.len() != src.len() {
            return Err(Validation::ReadOnlyDestination);
        }
        dst.copy_from_slice(src);
        Ok(())
    }

    /// Copies the buffer's bytes into `dst`, in native byte order (the buffer's bytes need no
    /// alignment for `T`).
    ///
    /// # Errors
    ///
    /// [`Validation::HostBufferLength`] when `dst`'s bytes are not the buffer's length.
    pub fn copy_to<T: Pod>(&self, dst: &mut [T]) -> Result<(), Validation> {
        let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
        self.check_len("HostBuffer::copy_to", dst.len())?;
        dst.copy_from_slice(self.as_slice());
        Ok(())
    }

    /// The buffer's bytes as a vector of `T`, in native byte order. The vector is allocated as
    /// `Vec` allocates (a failure aborts); [`Self::copy_to`] reads into memory the caller
    /// already holds.
    ///
    /// # Errors
    ///
    /// [`Validation::NotWholeElements`] when the buffer's length is not a multiple of `T`'s
    /// size.
    pub fn to_vec_of<T: Pod>(&self) -> Result<Vec<T>, Validation> {
        let size = core::mem::size_of::<T>();
        if size == 0 {
            return Ok(Vec::new());
        }
        if !self.len().is_multiple_of(size) {
            return Err(Validation::NotWholeElements {
                len: self.len() as u64,
                element: size as u64,
            });
        }
        let mut out = alloc::vec![T::zeroed(); self.len() / size];
        self.copy_to(&mut out)?;
        Ok(out)
    }

    fn check_len(&self, op: &'static str, given: usize) -> Result<(), Validation> {
        if given == self.len() {
            Ok(())
        } else {
            Err(Validation::HostBufferLength {
                op,
                buffer: self.len() as u64,
                given: given as u64,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_copies_keep_native_order_and_check_lengths() {
        let data = [1.5f32, -2.0, 3.25];
        let mut buf = HostBuffer::zeroed(12);
        buf.copy_from(&data).unwrap();
        assert_eq!(&buf.as_slice()[4..8], &(-2.0f32).to_ne_bytes());
        assert_eq!(buf.to_vec_of::<f32>().unwrap(), data);
        let mut back = [0f32; 3];
        buf.copy_to(&mut back).unwrap();
        assert_eq!(back, data);
        assert!(matches!(
            buf.copy_to(&mut [0f32; 2]),
            Err(Validation::HostBufferLength {
                op: "HostBuffer::copy_to",
                buffer: 12,
                given: 8
            })
        ));
        assert!(matches!(
            buf.copy_from(&[0u64; 2]),
            Err(Validation::HostBufferLength {
                op: "HostBuffer::copy_from",
                buffer: 12,
                given: 16
            })
        ));
        assert!(matches!(
            HostBuffer::zeroed(6).to_vec_of::<f32>(),
            Err(Validation::NotWholeElements { len: 6, element: 4 })
        ));
        assert_eq!(HostBuffer::copy_of(&data).as_slice(), buf.as_slice());
    }
}
