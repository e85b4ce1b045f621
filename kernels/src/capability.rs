//! Where a device's compute capability comes from: NVML on a real machine, a mock in tests. And
//! the preflight check that refuses a device whose route is a rejection, as a pure function, so a
//! command can stop before any kernel compile or device allocation.

use crate::routing::{route, Capability, PathId};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What the harness needs to know about a visible GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// NVML device index.
    pub index: u32,
    pub name: String,
    pub cc: Capability,
    pub driver_version: String,
    /// Total device memory; 0 where the device does not report it (unified-memory parts such as
    /// GB10).
    pub memory_total_bytes: u64,
}

/// Why the visible devices could not be listed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CapabilityError {
    #[error(
        "no NVIDIA driver: NVML could not be loaded or initialised ({0}); GPU work needs an NVIDIA \
         GPU with its driver installed (routing checks run without one)"
    )]
    NoDriver(String),
    #[error("NVML could not read the {what} of GPU {index}: {detail}")]
    Query {
        index: u32,
        what: &'static str,
        detail: String,
    },
    #[error("NVML query failed: {0}")]
    Nvml(String),
    #[error("CUDA_VISIBLE_DEVICES is `{0}` and hides every GPU (unset it to use them)")]
    Hidden(String),
}

/// Whether a `CUDA_VISIBLE_DEVICES` value hides every device, as CUDA reads it: an empty list, or
/// one whose first entry is no device index or UUID (CUDA stops at the first entry it cannot
/// use: `-1`, `none`, `NoDevFiles`). Other values are not mapped to NVML's indices: unset the
/// variable and pick GPUs with `--devices`.
pub fn hides_every_gpu(visible: &str) -> bool {
    let first = visible.split(',').next().unwrap_or("").trim();
    let index = !first.is_empty() && first.bytes().all(|b| b.is_ascii_digit());
    !(index || first.starts_with("GPU-") || first.starts_with("MIG-"))
}

/// A source of device capabilities.
pub trait CapabilitySource {
    fn devices(&self) -> Result<Vec<DeviceInfo>, CapabilityError>;
}

/// The real devices, through NVML (`nvml-wrapper`, which returns an error rather than panicking
/// when `libnvidia-ml` is missing).
#[derive(Debug, Clone, Copy, Default)]
pub struct NvmlSource;

impl NvmlSource {
    pub fn new() -> Self {
        Self
    }
}

impl CapabilitySource for NvmlSource {
    fn devices(&self) -> Result<Vec<DeviceInfo>, CapabilityError> {
        use nvml_wrapper::error::NvmlError;
        // NVML lists every device whatever CUDA_VISIBLE_DEVICES says; a process told to see none
        // sees none.
        if let Some(visible) = std::env::var_os("CUDA_VISIBLE_DEVICES") {
            let visible = visible.to_string_lossy();
            if hides_every_gpu(&visible) {
                return Err(CapabilityError::Hidden(visible.into_owned()));
            }
        }
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| match e {
            NvmlError::LibloadingError(_)
            | NvmlError::FailedToLoadSymbol(_)
            | NvmlError::DriverNotLoaded
            | NvmlError::LibraryNotFound
            | NvmlError::FunctionNotFound
            | NvmlError::NoPermission => CapabilityError::NoDriver(e.to_string()),
            other => CapabilityError::Nvml(format!("initialising NVML: {other}")),
        })?;
        let driver_version = nvml
            .sys_driver_version()
            .map_err(|e| CapabilityError::Nvml(format!("reading the driver version: {e}")))?;
        let count = nvml
            .device_count()
            .map_err(|e| CapabilityError::Nvml(format!("counting devices: {e}")))?;
        let query = |index: u32, what: &'static str| {
            move |e: NvmlError| CapabilityError::Query {
                index,
                what,
                detail: e.to_string(),
            }
        };
        (0..count)
            .map(|index| {
                let device = nvml
                    .device_by_index(index)
                    .map_err(query(index, "handle"))?;
                let name = device.name().map_err(query(index, "name"))?;
                let raw = device
                    .cuda_compute_capability()
                    .map_err(query(index, "compute capability"))?;
                let (major, minor) = match (u32::try_from(raw.major), u32::try_from(raw.minor)) {
                    (Ok(major), Ok(minor)) => (major, minor),
                    _ => {
                        return Err(CapabilityError::Query {
                            index,
                            what: "compute capability",
                            detail: format!("negative value {}.{}", raw.major, raw.minor),
                        })
                    }
                };
                // Unified-memory devices report no framebuffer size; that must not hide the device.
                let memory_total_bytes = device.memory_info().map(|m| m.total).unwrap_or(0);
                Ok(DeviceInfo {
                    index,
                    name,
                    cc: Capability::new(major, minor),
                    driver_version: driver_version.clone(),
                    memory_total_bytes,
                })
            })
            .collect()
    }
}

/// Fixed devices (or a fixed error), for tests and for routing checks on machines without a GPU.
#[derive(Debug, Clone)]
pub struct MockSource {
    result: Result<Vec<DeviceInfo>, CapabilityError>,
}

impl MockSource {
    pub fn new(devices: Vec<DeviceInfo>) -> Self {
        Self {
            result: Ok(devices),
        }
    }

    pub fn failing(error: CapabilityError) -> Self {
        Self { result: Err(error) }
    }

    /// One device with the given capability and name, index 0.
    pub fn single(name: &str, cc: Capability) -> Self {
        Self::new(vec![DeviceInfo {
            index: 0,
            name: name.to_string(),
            cc,
            driver_version: "mock".to_string(),
            memory_total_bytes: 0,
        }])
    }
}

impl CapabilitySource for MockSource {
    fn devices(&self) -> Result<Vec<DeviceInfo>, CapabilityError> {
        self.result.clone()
    }
}

/// A device whose route is a rejection: the message names the device, its capability and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub index: u32,
    pub name: String,
    pub cc: Capability,
    pub reason: String,
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU {} ({}, SM {}) is not supported: {}",
            self.index, self.name, self.cc, self.reason
        )
    }
}

impl std::error::Error for Rejection {}

/// The production path of a device, or the rejection to stop with. Pure: it reads only `info`
/// and the routing table, so calling it first costs nothing and touches no device.
pub fn preflight(info: &DeviceInfo) -> Result<PathId, Rejection> {
    route(info.cc).map_err(|r| Rejection {
        index: info.index,
        name: info.name.clone(),
        cc: info.cc,
        reason: r.reason,
    })
}
