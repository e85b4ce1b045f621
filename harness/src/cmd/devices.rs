//! `relattn devices`: every visible GPU with its capability and route (through NVML).

use crate::exit;
use relattn_kernels::capability::{
    preflight, CapabilityError, CapabilitySource, DeviceInfo, NvmlSource,
};
use relattn_routing::{lookup, PathId};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One device of the JSON listing: what NVML says plus the route.
#[derive(Debug, Serialize)]
struct DeviceRoute {
    #[serde(flatten)]
    info: DeviceInfo,
    family: Option<&'static str>,
    path: Option<PathId>,
    rejected: bool,
    reason: Option<String>,
}

/// The JSON listing: `driver` is false (and `devices` empty) on a machine without a driver, or
/// when `CUDA_VISIBLE_DEVICES` hides every GPU (NVML is then not asked).
#[derive(Debug, Serialize)]
struct Listing {
    driver: bool,
    message: Option<String>,
    devices: Vec<DeviceRoute>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    list(&NvmlSource::new(), args.json)
}

/// Lists the devices of `source`. No driver (or none visible) is an answer (exit 0), not an
/// error; a driver that fails to describe its devices is a GPU that cannot be used (exit 3).
pub fn list(source: &dyn CapabilitySource, json: bool) -> anyhow::Result<()> {
    let listing = match source.devices() {
        Ok(devices) => Listing {
            driver: true,
            message: devices
                .is_empty()
                .then(|| "the NVIDIA driver reports no GPU".to_string()),
            devices: devices.into_iter().map(with_route).collect(),
        },
        Err(e @ (CapabilityError::NoDriver(_) | CapabilityError::Hidden(_))) => Listing {
            driver: false,
            message: Some(e.to_string()),
            devices: Vec::new(),
        },
        Err(e) => return Err(exit::no_gpu(e.to_string())),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&listing)?);
        return Ok(());
    }
    if let Some(message) = &listing.message {
        println!("{message}");
    }
    for d in &listing.devices {
        let memory = if d.info.memory_total_bytes == 0 {
            "memory n/a".to_string()
        } else {
            format!(
                "{:.0} GiB",
                d.info.memory_total_bytes as f64 / (1u64 << 30) as f64
            )
        };
        let family = d.family.map_or(String::new(), |f| format!(" {f}"));
        let outcome = match (&d.path, &d.reason) {
            (Some(path), _) => format!("route {path}"),
            (None, reason) => format!("rejected: {}", reason.as_deref().unwrap_or("")),
        };
        println!(
            "GPU {}  {}  SM {}{}  driver {}  {}  {}",
            d.info.index, d.info.name, d.info.cc, family, d.info.driver_version, memory, outcome
        );
    }
    Ok(())
}

fn with_route(info: DeviceInfo) -> DeviceRoute {
    let family = lookup(info.cc).map(|row| row.family);
    let (path, reason) = match preflight(&info) {
        Ok(path) => (Some(path), None),
        Err(rejection) => (None, Some(rejection.reason)),
    };
    DeviceRoute {
        rejected: path.is_none(),
        info,
        family,
        path,
        reason,
    }
}
