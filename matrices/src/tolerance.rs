//! Judgement constants per dtype (docs/operator.md section 6) as matrix files set them: a matrix
//! file may override any of the defaults (`Tolerance::default_for`, relattn_reference::judge) in
//! its own `[tolerance.<dtype>]` table.

use crate::error::MatrixError;
use relattn_reference::judge::Tolerance;
use relattn_reference::DType;
use serde::Deserialize;
use std::collections::BTreeMap;

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

/// The default tolerances of every dtype.
pub(crate) fn defaults() -> Tolerances {
    DType::ALL
        .iter()
        .map(|&d| (d, Tolerance::default_for(d)))
        .collect()
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
            // A zero atol would make the bound zero where ref_lp equals ref64 (docs/operator.md
            // section 6).
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
