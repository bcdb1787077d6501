//! The weights file: its format (raw little-endian `f32`, tensors in the order W1 b1 W2 b2 W3 b3,
//! W inputs × outputs, for the layers of [`crate::model::LAYERS`]), writing it, and mapping it
//! for file-backed uploads after checking that it is a regular file of the right size holding
//! only finite values. Every error names the path and what was being done.
//!
//! The whole file is mapped as one window ([`MappedFile`]) and uploaded in one copy; the tensors
//! are views of that upload. The hosts map read-only ([`Mapping::ReadOnly`]): devcmd-cuda
//! page-locks the mapping in place read-only (`cuMemHostRegister` with READ_ONLY), and where a
//! device cannot, the upload is staged. [`Mapping::CopyOnWrite`] (a private mapping whose pages
//! a driver may lock writable) is kept for drivers without read-only registration; on the H200
//! it made the driver copy every page while locking them (40 s of system time for 498 MB).

use devcmd::{ExternalBytes, HostOrigin};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// Floats in each tensor, in file order.
pub fn tensor_lens() -> Vec<usize> {
    crate::model::LAYERS
        .iter()
        .flat_map(|&(i, o)| [i * o, o])
        .collect()
}

/// Bytes in a weights file.
pub fn file_len() -> usize {
    tensor_lens().iter().sum::<usize>() * 4
}

/// The name of tensor `t` in file order: W1, b1, W2, ...
pub fn tensor_name(t: usize) -> String {
    format!(
        "{}{}",
        if t.is_multiple_of(2) { 'W' } else { 'b' },
        t / 2 + 1
    )
}

/// `v` as little-endian bytes.
pub fn to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Little-endian bytes as floats (a trailing partial float is ignored).
pub fn from_bytes(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A value the host cannot serve: where it lies and what it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NonFinite {
    /// Index of the float in the whole file.
    pub index: usize,
    /// The tensor (in file order) holding it and the element in that tensor.
    pub tensor: usize,
    pub element: usize,
    pub value: f32,
}

/// The first NaN or infinity of `tensors`, laid out as in the file.
pub fn first_non_finite(tensors: &[Vec<f32>]) -> Option<NonFinite> {
    let mut base = 0;
    for (tensor, values) in tensors.iter().enumerate() {
        if let Some(element) = values.iter().position(|v| !v.is_finite()) {
            return Some(NonFinite {
                index: base + element,
                tensor,
                element,
                value: values[element],
            });
        }
        base += values.len();
    }
    None
}

/// Why a weights file could not be written or served.
#[derive(Debug)]
pub enum WeightsError {
    /// Opening the file to read it failed.
    Open { path: PathBuf, source: io::Error },
    /// Reading the file's metadata failed.
    Metadata { path: PathBuf, source: io::Error },
    /// The path is a directory or another thing that is not a regular file.
    NotAFile { path: PathBuf, kind: &'static str },
    /// The file's size is not the model's.
    Size {
        path: PathBuf,
        found: u64,
        need: usize,
    },
    /// Memory-mapping the file failed.
    Map { path: PathBuf, source: io::Error },
    /// The file holds a NaN or an infinity.
    NonFinite { path: PathBuf, at: NonFinite },
    /// Writing the seeded weights failed.
    Write { path: PathBuf, source: io::Error },
}

const FROM_SAVE: &str = "pass a file written by `edge-host --save-weights FILE`";

impl fmt::Display for WeightsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Open { path, source } => write!(
                f,
                "cannot open the weights file {} to read it: {source}; {FROM_SAVE}",
                path.display()
            ),
            Self::Metadata { path, source } => write!(
                f,
                "cannot read the size and type of the weights file {}: {source}; {FROM_SAVE}",
                path.display()
            ),
            Self::NotAFile { path, kind } => write!(
                f,
                "the weights path {} is {kind}, not a regular file; {FROM_SAVE}",
                path.display()
            ),
            Self::Size { path, found, need } => write!(
                f,
                "the weights file {} holds {found} bytes, the model needs {need} (raw \
                 little-endian f32: W1 b1 W2 b2 W3 b3); {FROM_SAVE}",
                path.display()
            ),
            Self::Map { path, source } => write!(
                f,
                "cannot memory-map the weights file {} to read it: {source}; check that the \
                 file system supports mapping, or copy the file to one that does",
                path.display()
            ),
            Self::NonFinite { path, at } => write!(
                f,
                "the weights file {} holds {} at float index {} (byte {}, element {} of {}): \
                 results cannot be verified against non-finite weights; fix the file, or \
                 write a fresh one with `edge-host --save-weights FILE`",
                path.display(),
                at.value,
                at.index,
                at.index * 4,
                at.element,
                tensor_name(at.tensor)
            ),
            Self::Write { path, source } => write!(
                f,
                "cannot write the seeded weights to {}: {source}; pass --save-weights a file \
                 path in an existing, writable directory (the file is created or replaced)",
                path.display()
            ),
        }
    }
}

impl std::error::Error for WeightsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Open { source, .. }
            | Self::Metadata { source, .. }
            | Self::Map { source, .. }
            | Self::Write { source, .. } => Some(source),
            Self::NotAFile { .. } | Self::Size { .. } | Self::NonFinite { .. } => None,
        }
    }
}

/// Writes `tensors` (in file order) to `path`, creating or replacing it.
pub fn save(path: &Path, tensors: &[Vec<f32>]) -> Result<(), WeightsError> {
    let bytes: Vec<u8> = tensors.iter().flat_map(|t| to_bytes(t)).collect();
    std::fs::write(path, bytes).map_err(|source| WeightsError::Write {
        path: path.to_owned(),
        source,
    })
}

/// How the weights file is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// Read-only and shared with the page cache: the bytes are staged by the core.
    ReadOnly,
    /// Private and copy-on-write (never written by this program): pages a driver may lock in
    /// place for DMA, which it refuses for read-only pages unless told they are read-only.
    CopyOnWrite,
}

/// The mapping itself, of either kind.
enum Map {
    Shared(memmap2::Mmap),
    Private(memmap2::MmapMut),
}

impl Map {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Shared(m) => m,
            Self::Private(m) => m,
        }
    }
}

/// The whole memory-mapped weights file: file-backed bytes the device may read.
pub struct MappedFile {
    map: Map,
}

impl fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedFile")
            .field("len", &self.len())
            .field("copy_on_write", &matches!(self.map, Map::Private(_)))
            .finish()
    }
}

impl MappedFile {
    /// Bytes in the file.
    pub fn len(&self) -> usize {
        self.map.bytes().len()
    }

    /// Whether the file is empty (a weights file never is: [`load`] checks its size).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// SAFETY: the mapping is owned by this value and never modified by this program (a read-only
// shared mapping, or a private one never written through) nor unmapped while it lives; `bytes`
// always returns the whole mapping, the same slice on every call. Like every memory map, it
// assumes no other process writes or truncates the file while it is mapped (`load` says so).
unsafe impl ExternalBytes for MappedFile {
    fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }
    fn origin(&self) -> HostOrigin {
        HostOrigin::FileMapped
    }
}

/// Maps the whole of `file` (opened for reading) as `mapping` says. Also the GPT-2 host's
/// mapping of `model.safetensors` ([`crate::gpt2::weights`]).
///
/// # Errors
///
/// The system's refusal to map the file.
pub fn map(file: &std::fs::File, mapping: Mapping) -> io::Result<MappedFile> {
    let map = match mapping {
        // SAFETY: the file is opened read-only and this program does not modify it while
        // mapped; a concurrent writer is outside what the host supports.
        Mapping::ReadOnly => unsafe { memmap2::Mmap::map(file) }.map(Map::Shared),
        Mapping::CopyOnWrite => {
            // SAFETY: as above; the private mapping's writes (none are made) would never reach
            // the file.
            unsafe { memmap2::MmapOptions::new().map_copy(file) }.map(Map::Private)
        }
    }?;
    Ok(MappedFile { map })
}

/// A mapped weights file and its tensors' floats (for the host reference), in file order.
#[derive(Debug)]
pub struct Loaded {
    /// The whole file.
    pub file: MappedFile,
    /// Each tensor's floats, read from the mapping.
    pub tensors: Vec<Vec<f32>>,
}

/// Maps the weights file at `path` as `mapping` says, with its tensors' floats for the host
/// reference. Refuses anything but a regular file of [`file_len`] bytes of finite values.
pub fn load(path: &Path, mapping: Mapping) -> Result<Loaded, WeightsError> {
    let file = std::fs::File::open(path).map_err(|source| WeightsError::Open {
        path: path.to_owned(),
        source,
    })?;
    let meta = file.metadata().map_err(|source| WeightsError::Metadata {
        path: path.to_owned(),
        source,
    })?;
    if !meta.is_file() {
        let kind = if meta.is_dir() {
            "a directory"
        } else {
            "a device, pipe or socket"
        };
        return Err(WeightsError::NotAFile {
            path: path.to_owned(),
            kind,
        });
    }
    let need = file_len();
    let size = |found: u64| WeightsError::Size {
        path: path.to_owned(),
        found,
        need,
    };
    if meta.len() != need as u64 {
        return Err(size(meta.len()));
    }
    let file = map(&file, mapping).map_err(|source| WeightsError::Map {
        path: path.to_owned(),
        source,
    })?;
    let map = file.map.bytes();
    if map.len() != need {
        return Err(size(map.len() as u64)); // changed size since the check above
    }
    let floats: Vec<Vec<f32>> = tensor_lens()
        .into_iter()
        .scan(0, |start, len| {
            let floats = from_bytes(&map[*start..*start + len * 4]);
            *start += len * 4;
            Some(floats)
        })
        .collect();
    if let Some(at) = first_non_finite(&floats) {
        return Err(WeightsError::NonFinite {
            path: path.to_owned(),
            at,
        });
    }
    Ok(Loaded {
        file,
        tensors: floats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory for one test under the system's temporary directory.
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("edge-host-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        dir
    }

    fn zeros() -> Vec<Vec<f32>> {
        tensor_lens().into_iter().map(|n| vec![0.0; n]).collect()
    }

    #[test]
    fn saved_weights_load_back_as_written() {
        let dir = scratch("round-trip");
        let path = dir.join("w.bin");
        let mut tensors = zeros();
        tensors[3][5] = 1.5;
        tensors[5][9] = -2.25;
        save(&path, &tensors).expect("save");
        let written = std::fs::metadata(&path).expect("metadata").len();
        assert_eq!(written, file_len() as u64);
        for mapping in [Mapping::ReadOnly, Mapping::CopyOnWrite] {
            let loaded = load(&path, mapping).expect("load");
            assert_eq!(loaded.tensors, tensors);
            let lens: Vec<usize> = loaded.tensors.iter().map(Vec::len).collect();
            assert_eq!(lens, tensor_lens());
            assert_eq!(loaded.file.len(), file_len());
            let all: Vec<f32> = tensors.iter().flatten().copied().collect();
            assert_eq!(from_bytes(loaded.file.bytes()), all);
            assert_eq!(loaded.file.origin(), HostOrigin::FileMapped);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_first_non_finite_value_is_found_by_its_index_in_the_file() {
        let mut tensors = zeros();
        assert_eq!(first_non_finite(&tensors), None);
        let w2 = tensor_lens()[..2].iter().sum::<usize>();
        tensors[2][7] = f32::INFINITY;
        tensors[4][0] = f32::NAN;
        assert_eq!(
            first_non_finite(&tensors),
            Some(NonFinite {
                index: w2 + 7,
                tensor: 2,
                element: 7,
                value: f32::INFINITY
            })
        );
        assert_eq!(tensor_name(2), "W2");
        assert_eq!(tensor_name(5), "b3");
    }

    #[test]
    fn a_weights_file_of_nans_is_refused_naming_the_file_and_the_first_bad_index() {
        let dir = scratch("nans");
        let path = dir.join("nan.bin");
        std::fs::write(&path, f32::NAN.to_le_bytes().repeat(file_len() / 4)).expect("write");
        let err = load(&path, Mapping::ReadOnly).expect_err("NaN weights must be refused");
        assert!(matches!(&err, WeightsError::NonFinite { at, .. } if at.index == 0));
        let msg = err.to_string();
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        assert!(
            msg.contains("NaN at float index 0 (byte 0, element 0 of W1)"),
            "{msg}"
        );

        let mut tensors = zeros();
        tensors[1][3] = f32::NEG_INFINITY;
        save(&path, &tensors).expect("save");
        let msg = load(&path, Mapping::CopyOnWrite)
            .expect_err("an infinity must be refused")
            .to_string();
        let index = tensor_lens()[0] + 3;
        assert!(
            msg.contains(&format!(
                "-inf at float index {index} (byte {}, element 3 of b1)",
                index * 4
            )),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn io_errors_name_the_path_and_what_was_being_done() {
        let dir = scratch("io");
        let shown = |p: &Path| p.display().to_string();

        let err = load(&dir, Mapping::ReadOnly).expect_err("a directory must be refused");
        let msg = err.to_string();
        assert!(matches!(err, WeightsError::NotAFile { .. }), "{msg}");
        assert!(
            msg.contains(&format!("the weights path {} is a directory", shown(&dir))),
            "{msg}"
        );

        let missing = dir.join("missing.bin");
        let err = load(&missing, Mapping::CopyOnWrite).expect_err("a missing file must be refused");
        let msg = err.to_string();
        assert!(matches!(err, WeightsError::Open { .. }), "{msg}");
        assert!(
            msg.contains(&format!(
                "cannot open the weights file {} to read it: ",
                shown(&missing)
            )),
            "{msg}"
        );

        let short = dir.join("short.bin");
        std::fs::write(&short, [0u8; 12]).expect("write");
        let msg = load(&short, Mapping::ReadOnly)
            .expect_err("a short file must be refused")
            .to_string();
        assert!(
            msg.contains(&format!(
                "{} holds 12 bytes, the model needs {}",
                shown(&short),
                file_len()
            )),
            "{msg}"
        );

        let unwritable = dir.join("no-such-dir").join("w.bin");
        let err = save(&unwritable, &zeros()).expect_err("a path in a missing directory");
        let msg = err.to_string();
        assert!(matches!(err, WeightsError::Write { .. }), "{msg}");
        assert!(
            msg.contains(&format!(
                "cannot write the seeded weights to {}: ",
                shown(&unwritable)
            )),
            "{msg}"
        );
        let msg = save(&dir, &zeros()).expect_err("a directory").to_string();
        assert!(
            msg.contains(&format!(
                "cannot write the seeded weights to {}: ",
                shown(&dir)
            )),
            "{msg}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
