//! relattn-reference: the CPU oracle of Inkling's relative-bias attention (docs/operator.md).
//!
//! `Problem` holds validated inputs, `BatchShape` the lengths every crate reads; `gen` makes seeded realistic ones; `oracle` is the naive
//! reference, `fast` the blocked f64 one, `emulate` the same-precision emulation of flash kernels,
//! `sample` the sampled-row mode, `progress` the callback long computations report to, and `casefile` the safetensors case and output files; `finite` tells whether a case's inputs are finite where real rows read them; `limits`
//! holds the size limits of every input; `judge` is
//! docs/operator.md section 6's judge of a GPU output, with its tolerance type and each dtype's
//! defaults.
#![deny(unsafe_code)]

pub mod batch;
pub mod bench;
pub mod casefile;
pub mod dtype;
pub mod emulate;
pub mod fast;
pub mod finite;
pub mod gen;
pub mod judge;
pub mod limits;
pub mod oracle;
pub mod output;
pub mod problem;
pub mod progress;
pub mod regime;
pub mod sample;
pub mod transform;
pub mod window;

pub use batch::BatchShape;
pub use dtype::DType;
pub use gen::{BiasMode, GenSpec, PageMode};
pub use output::RefOutput;
pub use problem::{
    window_spans_extent, CacheLayout, KvView, Problem, ProblemData, ProblemError, Request,
    RowLayout,
};
pub use regime::Inputs;
pub use window::Window;
