//! Judgement constants per dtype (SPEC section 6). The defaults are data (tiers/defaults.toml);
//! a matrix file may override any of them in its own `[tolerance.<dtype>]` table.

use crate::error::MatrixError;
use relattn_reference::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `(a) max|out - ref64| <= rtol * max|ref_lp - ref64| + atol` and
/// `(b) |out - ref64| <= atol2 + rtol2 * |ref64|` elementwise.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    pub rtol: f64,
    pub atol: f64,
    pub atol2: f64,
    pub rtol2: f64,
}

/// A `[tolerance.<dtype>]` table; absent fields keep the value below it.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawTolerance {
    rtol: Option<f64>,
    atol: Option<f64>,
    atol2: Option<f64>,
    rtol2: Option<f64>,
}

pub(crate) type Tolerances = BTreeMap<DType, Tolerance>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DefaultsFile {
    tolerance: BTreeMap<String, RawTolerance>,
}

const DEFAULTS_FILE: &str = "tiers/defaults.toml";
const DEFAULTS: &str = include_str!("../tiers/defaults.toml");

/// The default tolerances of every dtype.
pub(crate) fn defaults() -> Result<Tolerances, MatrixError> {
    let file: DefaultsFile = toml::from_str(DEFAULTS).map_err(|e| MatrixError::Parse {
        file: DEFAULTS_FILE.to_string(),
        message: e.to_string(),
    })?;
    let base = Tolerance {
        rtol: f64::NAN,
        atol: f64::NAN,
        atol2: f64::NAN,
        rtol2: f64::NAN,
    };
    let start = DType::ALL.iter().map(|&d| (d, base)).collect();
    let out = apply(DEFAULTS_FILE, start, &file.tolerance)?;
    for dtype in DType::ALL {
        let t = out[&dtype];
        if [t.rtol, t.atol, t.atol2, t.rtol2]
            .iter()
            .any(|x| x.is_nan())
        {
            return Err(MatrixError::bad(
                DEFAULTS_FILE,
                format!("tolerance.{dtype}"),
                "(incomplete)",
                "every dtype needs rtol, atol, atol2 and rtol2",
            ));
        }
    }
    Ok(out)
}

/// The default tolerance of `dtype` (tiers/defaults.toml), what a matrix without its own
/// `[tolerance.<dtype>]` table judges with.
pub fn default_tolerance(dtype: DType) -> Result<Tolerance, MatrixError> {
    Ok(defaults()?[&dtype])
}

/// `base` with the tables of `raw` applied, each checked.
pub(crate) fn apply(
    file: &str,
    mut base: Tolerances,
    raw: &BTreeMap<String, RawTolerance>,
) -> Result<Tolerances, MatrixError> {
    for (name, table) in raw {
        let dtype: DType = name
            .parse()
            .map_err(|reason: String| MatrixError::bad(file, "tolerance", name, reason))?;
        let t = base
            .get_mut(&dtype)
            .expect("every dtype has a base tolerance");
        let fields = [
            ("rtol", table.rtol, &mut t.rtol, false),
            ("atol", table.atol, &mut t.atol, true),
            ("atol2", table.atol2, &mut t.atol2, true),
            ("rtol2", table.rtol2, &mut t.rtol2, false),
        ];
        for (key, value, slot, positive) in fields {
            let Some(v) = value else { continue };
            // A zero atol would make the bound zero where ref_lp equals ref64 (SPEC 6).
            let ok = v.is_finite() && if positive { v > 0.0 } else { v >= 0.0 };
            if !ok {
                let need = if positive {
                    "a finite number > 0"
                } else {
                    "a finite number >= 0"
                };
                return Err(MatrixError::bad(
                    file,
                    format!("tolerance.{name}.{key}"),
                    v,
                    need,
                ));
            }
            *slot = v;
        }
    }
    Ok(base)
}
