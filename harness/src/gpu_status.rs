//! Which GPUs this machine can use, decided before any kernel is compiled or memory touched.

use relattn_kernels::capability::{preflight, CapabilitySource, DeviceInfo};
use relattn_routing::PathId;
use std::str::FromStr;

/// Which devices a run uses (`--devices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    All,
    List(Vec<u32>),
}

impl Default for DeviceSelection {
    fn default() -> Self {
        DeviceSelection::List(vec![0])
    }
}

impl FromStr for DeviceSelection {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "all" {
            return Ok(DeviceSelection::All);
        }
        let list: Result<Vec<u32>, _> = s.split(',').map(|x| x.trim().parse::<u32>()).collect();
        match list {
            Ok(v) if !v.is_empty() => Ok(DeviceSelection::List(v)),
            _ => Err(format!(
                "invalid --devices `{s}`: use `all` or indices like `0` or `0,1`"
            )),
        }
    }
}

/// What the machine's GPUs allow.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuStatus {
    /// No usable GPU stack (no driver, no NVRTC, no device): CPU work only.
    Absent(String),
    /// A selected device's route is a rejection: the message names device, capability, reason.
    Rejected(String),
    /// Devices to use, and the production path of the first one.
    Ready {
        devices: Vec<DeviceInfo>,
        routed: PathId,
    },
}

impl GpuStatus {
    /// Why GPU trials cannot run here, if they cannot.
    pub fn unusable_reason(&self) -> Option<String> {
        match self {
            GpuStatus::Absent(why) => Some(format!("no GPU: {why}")),
            GpuStatus::Rejected(why) => Some(why.clone()),
            GpuStatus::Ready { .. } => None,
        }
    }
}

/// Decide from the capability source alone (pure apart from the source): the route check comes
/// first, so a rejected device stops a run before anything else happens.
///
/// `libs_present` says whether the CUDA driver library and NVRTC can be loaded.
pub fn detect(
    source: &dyn CapabilitySource,
    libs_present: bool,
    selection: &DeviceSelection,
) -> GpuStatus {
    let devices = match source.devices() {
        Ok(d) => d,
        Err(e) => return GpuStatus::Absent(e.to_string()),
    };
    if devices.is_empty() {
        return GpuStatus::Absent("the driver reports no GPU".to_string());
    }
    let chosen: Vec<DeviceInfo> = match selection {
        DeviceSelection::All => devices,
        DeviceSelection::List(ids) => {
            let mut out = Vec::new();
            for &i in ids {
                match devices.iter().find(|d| d.index == i) {
                    Some(d) => out.push(d.clone()),
                    None => {
                        return GpuStatus::Absent(format!(
                            "GPU {i} does not exist ({} visible)",
                            devices.len()
                        ))
                    }
                }
            }
            out
        }
    };
    let mut routed = None;
    for d in &chosen {
        match preflight(d) {
            Ok(p) => {
                routed.get_or_insert(p);
            }
            Err(rejection) => return GpuStatus::Rejected(rejection.to_string()),
        }
    }
    if !libs_present {
        return GpuStatus::Absent(
            "the CUDA driver library (libcuda) or NVRTC (libnvrtc) cannot be loaded".to_string(),
        );
    }
    match routed {
        Some(routed) => GpuStatus::Ready {
            devices: chosen,
            routed,
        },
        None => GpuStatus::Absent("no device selected".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relattn_kernels::capability::{CapabilityError, MockSource};
    use relattn_routing::Capability;

    #[test]
    fn h200_is_ready_on_score_mod() {
        let s = MockSource::single("NVIDIA H200", Capability::new(9, 0));
        match detect(&s, true, &DeviceSelection::default()) {
            GpuStatus::Ready { routed, devices } => {
                assert_eq!(routed, PathId::ScoreMod);
                assert_eq!(devices.len(), 1);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn gb10_is_rejected_naming_device_and_capability() {
        let s = MockSource::single("NVIDIA GB10", Capability::new(12, 1));
        let GpuStatus::Rejected(msg) = detect(&s, true, &DeviceSelection::default()) else {
            panic!("SM 12.1 must be rejected");
        };
        assert!(
            msg.contains("NVIDIA GB10") && msg.contains("12.1") && msg.contains("paged"),
            "{msg}"
        );
    }

    #[test]
    fn no_driver_and_missing_device_are_absent() {
        let s = MockSource::failing(CapabilityError::NoDriver(
            "libnvidia-ml.so.1 missing".into(),
        ));
        assert!(matches!(
            detect(&s, false, &DeviceSelection::All),
            GpuStatus::Absent(_)
        ));
        let s = MockSource::single("NVIDIA H200", Capability::new(9, 0));
        assert!(matches!(
            detect(&s, true, &DeviceSelection::List(vec![3])),
            GpuStatus::Absent(_)
        ));
        assert!(matches!(
            detect(&s, false, &DeviceSelection::All),
            GpuStatus::Absent(_)
        ));
    }

    #[test]
    fn device_selection_parses() {
        assert_eq!(
            "all".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::All
        );
        assert_eq!(
            "0,1".parse::<DeviceSelection>().unwrap(),
            DeviceSelection::List(vec![0, 1])
        );
        assert!("x".parse::<DeviceSelection>().is_err());
    }
}
