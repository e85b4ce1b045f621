//! Capability sources and the preflight check, with mocked devices.

use relattn_kernels::capability::{
    hides_every_gpu, preflight, CapabilityError, CapabilitySource, DeviceInfo, MockSource,
    NvmlSource,
};
use relattn_kernels::routing::{Capability, PathId};

fn device(index: u32, name: &str, major: u32, minor: u32) -> DeviceInfo {
    DeviceInfo {
        index,
        name: name.to_string(),
        cc: Capability::new(major, minor),
        driver_version: "580.95.05".to_string(),
        memory_total_bytes: 150_754_820_096,
    }
}

#[test]
fn preflight_routes_supported_devices() {
    let cases = [
        (device(0, "NVIDIA H200", 9, 0), PathId::ScoreMod),
        (device(1, "NVIDIA B200", 10, 0), PathId::ShearedBias),
        (device(2, "NVIDIA GB300", 10, 3), PathId::ShearedBias),
        (device(3, "NVIDIA A100-SXM4-80GB", 8, 0), PathId::Fallback),
        (device(4, "NVIDIA L40S", 8, 9), PathId::Fallback),
    ];
    for (info, path) in cases {
        assert_eq!(preflight(&info), Ok(path), "{}", info.name);
    }
}

#[test]
fn preflight_rejects_gb10_naming_device_capability_and_reason() {
    let err = preflight(&device(0, "NVIDIA GB10", 12, 1)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "GPU 0 (NVIDIA GB10, SM 12.1) is not supported: the production FA4 kernel has no paged-KV \
         forward for this operator on SM12x, and serving always reads the paged cache"
    );
    assert_eq!(err.cc, Capability::new(12, 1));
    let err = preflight(&device(3, "NVIDIA RTX PRO 6000", 12, 0)).unwrap_err();
    assert!(err
        .to_string()
        .starts_with("GPU 3 (NVIDIA RTX PRO 6000, SM 12.0) is not supported"));
    let err = preflight(&device(0, "Tesla V100", 7, 0)).unwrap_err();
    assert!(err.to_string().contains("SM 7.0"), "{err}");
    let err = preflight(&device(0, "Future GPU", 13, 0)).unwrap_err();
    assert!(err.to_string().ends_with("no route for SM 13.0"), "{err}");
}

#[test]
fn mock_source_returns_its_devices_or_its_error() {
    let devices = vec![
        device(0, "NVIDIA H200", 9, 0),
        device(1, "NVIDIA GB10", 12, 1),
    ];
    let source = MockSource::new(devices.clone());
    assert_eq!(source.devices(), Ok(devices));
    let failing = MockSource::failing(CapabilityError::NoDriver(
        "libnvidia-ml.so: not found".into(),
    ));
    let err = failing.devices().unwrap_err();
    assert!(err.to_string().contains("no NVIDIA driver"), "{err}");
    let single = MockSource::single("NVIDIA GB10", Capability::new(12, 1))
        .devices()
        .unwrap();
    assert_eq!(single.len(), 1);
    assert!(preflight(&single[0]).is_err());
}

#[test]
fn device_info_serialises_capability_as_text() {
    let v = serde_json::to_value(device(0, "NVIDIA H200", 9, 0)).unwrap();
    assert_eq!(v["cc"], "9.0");
    assert_eq!(v["index"], 0);
    assert_eq!(v["memory_total_bytes"], 150_754_820_096u64);
}

#[test]
fn nvml_source_never_panics() {
    // Without a driver this is NoDriver; on a GPU machine it lists devices with real capabilities
    // (none under an empty CUDA_VISIBLE_DEVICES).
    match NvmlSource::new().devices() {
        Err(CapabilityError::NoDriver(detail)) => assert!(!detail.is_empty()),
        Err(CapabilityError::Hidden(visible)) => assert!(hides_every_gpu(&visible)),
        Err(other) => panic!("NVML present but failing: {other}"),
        Ok(devices) => {
            for d in devices {
                assert!(d.cc.major >= 1, "{d:?}");
                assert!(!d.name.is_empty());
            }
        }
    }
}

#[test]
fn cuda_visible_devices_hides_every_gpu_when_empty_or_starting_with_no_device() {
    for hidden in [
        "",
        " ",
        "-1",
        "-1,0",
        ",0",
        "-",
        "none",
        "NoDevFiles",
        "1.5",
    ] {
        assert!(hides_every_gpu(hidden), "`{hidden}`");
    }
    for shown in [
        "0",
        "1",
        "0,1",
        " 2 ,3",
        "1,-1",
        "GPU-8f6e2a1c",
        "MIG-GPU-8f6e2a1c/1/0",
    ] {
        assert!(!hides_every_gpu(shown), "`{shown}`");
    }
    let hidden = CapabilityError::Hidden(String::new()).to_string();
    assert!(hidden.contains("CUDA_VISIBLE_DEVICES is ``"), "{hidden}");
}
