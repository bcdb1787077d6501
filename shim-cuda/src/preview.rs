//! TEMPORARY: the launch types of the coming contract, until it lands on main.
#![allow(missing_docs, dead_code)]

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

impl Dim3 {
    pub const fn linear(x: u32) -> Self {
        Self { x, y: 1, z: 1 }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchDims {
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_bytes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelParam<'a> {
    Buffer(usize),
    Scalar(&'a [u8]),
}
