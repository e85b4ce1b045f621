//! relattn-common: what every relattn crate shares and that is not the operator. `files`: every
//! file relattn writes goes through `files::write_atomic`, every input it reads through
//! `files::read_regular` (or its open-then-read parts); `stats`: the median every figure uses.
#![forbid(unsafe_code)]

pub mod files;
pub mod stats;
