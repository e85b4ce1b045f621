//! The two values routing is keyed by: a compute capability and a path id.

use super::RoutingError;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A CUDA compute capability (`major.minor`), e.g. 9.0 for H200, 12.1 for GB10.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Capability {
    pub major: u32,
    pub minor: u32,
}

impl Capability {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// The NVRTC architecture name, e.g. `sm_90`, `sm_121`.
    pub fn sm_name(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Accepts `9.0`, `12.1`, `90`, `121`, `sm_90`, `sm121` (in the digit forms the last digit is the
/// minor version, as in NVCC's architecture names).
impl FromStr for Capability {
    type Err = RoutingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || RoutingError::BadCapability(s.to_string());
        let t = s.trim();
        let lower = t.to_ascii_lowercase();
        let t = lower
            .strip_prefix("sm_")
            .or_else(|| lower.strip_prefix("sm"))
            .unwrap_or(&lower);
        let digits =
            |x: &str| !x.is_empty() && x.len() <= 4 && x.bytes().all(|b| b.is_ascii_digit());
        if let Some((major, minor)) = t.split_once('.') {
            if !digits(major) || !digits(minor) {
                return Err(bad());
            }
            let major = major.parse().map_err(|_| bad())?;
            let minor = minor.parse().map_err(|_| bad())?;
            return Ok(Self::new(major, minor));
        }
        if t.len() < 2 || !digits(t) {
            return Err(bad());
        }
        let (major, minor) = t.split_at(t.len() - 1);
        Ok(Self::new(
            major.parse().map_err(|_| bad())?,
            minor.parse().map_err(|_| bad())?,
        ))
    }
}

impl Serialize for Capability {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Capability {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The kernel families of docs/operator.md section 3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathId {
    /// Blackwell datacenter: sheared bias tiles, split-KV with a combine kernel.
    ShearedBias,
    /// Hopper: per-element bias gather, no split-KV.
    ScoreMod,
    /// Ampere/Ada: generic tiled kernel plus a two-stage split-KV decode kernel.
    Fallback,
}

impl PathId {
    pub const ALL: [PathId; 3] = [PathId::ShearedBias, PathId::ScoreMod, PathId::Fallback];

    /// Every path's id, comma separated, for messages.
    pub fn names() -> String {
        PathId::ALL.map(|p| p.as_str()).join(", ")
    }

    pub const fn as_str(&self) -> &'static str {
        match self {
            PathId::ShearedBias => "sheared_bias",
            PathId::ScoreMod => "score_mod",
            PathId::Fallback => "fallback",
        }
    }
}

impl fmt::Display for PathId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PathId {
    type Err = RoutingError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PathId::ALL
            .into_iter()
            .find(|p| p.as_str() == s.trim())
            .ok_or_else(|| RoutingError::BadPath(s.to_string()))
    }
}
