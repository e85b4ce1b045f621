//! results.csv: the fixed columns, then one column per parameter.

use crate::error::{io, ReportError};
use crate::row::{format_float, Row, Status};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The first columns of results.csv, in order. Files written before `wall_ms` existed end the
/// fixed columns at `message`; they still read (without wall times).
pub const FIXED_COLUMNS: [&str; 15] = [
    "case_id",
    "trial",
    "path",
    "status",
    "max_abs",
    "mean_abs",
    "rel_l2",
    "bound",
    "first_bad",
    "ms",
    "tflops",
    "gbps",
    "seed",
    "message",
    "wall_ms",
];

/// Fixed columns of files written before `wall_ms`.
const OLD_FIXED: usize = 14;

/// The cell of a parameter a row does not have: empty, which pandas, R and spreadsheets read
/// as missing with no options. A parameter whose value is empty is written the same way and
/// reads back as absent (results.jsonl keeps the difference).
pub const ABSENT_CELL: &str = "";

/// What files written before empty cells marked absent parameters hold there (PostgreSQL's
/// NULL); still read as absent. So that a value `\N` is not taken for it, a value starting with
/// a backslash is written with one more in front, as it always was.
const OLD_ABSENT_CELL: &str = "\\N";

fn param_cell(value: Option<&String>) -> String {
    match value {
        None => ABSENT_CELL.to_string(),
        Some(v) if v.starts_with('\\') => format!("\\{v}"),
        Some(v) => v.clone(),
    }
}

/// The parameter a cell holds: `None` for an empty cell or [`OLD_ABSENT_CELL`].
fn param_of_cell(cell: &str) -> Option<String> {
    match cell {
        ABSENT_CELL | OLD_ABSENT_CELL => None,
        c if c.starts_with("\\\\") => Some(c[1..].to_string()),
        c => Some(c.to_string()),
    }
}

/// Writes every row, atomically; parameter columns are the sorted union of the rows' parameter
/// names, [`ABSENT_CELL`] where a row lacks one.
pub(crate) fn write_csv(path: &Path, rows: &[Row]) -> Result<(), ReportError> {
    let params: BTreeSet<&str> = rows
        .iter()
        .flat_map(|r| r.params.keys().map(String::as_str))
        .collect();
    relattn_common::files::write_atomic(path, |out| {
        let mut w = csv::Writer::from_writer(out);
        write_records(&mut w, &params, rows)?;
        w.flush()
    })
    .map_err(io("write", path))
}

fn write_records(
    w: &mut csv::Writer<&mut dyn std::io::Write>,
    params: &BTreeSet<&str>,
    rows: &[Row],
) -> Result<(), csv::Error> {
    let header: Vec<&str> = FIXED_COLUMNS
        .iter()
        .copied()
        .chain(params.iter().copied())
        .collect();
    w.write_record(&header)?;
    let opt = |v: Option<f64>| v.map(format_float).unwrap_or_default();
    for r in rows {
        let mut rec = vec![
            r.case_id.clone(),
            r.trial.clone(),
            r.path.clone(),
            r.status.as_str().to_string(),
            opt(r.max_abs),
            opt(r.mean_abs),
            opt(r.rel_l2),
            opt(r.bound),
            r.first_bad.clone().unwrap_or_default(),
            opt(r.ms),
            opt(r.tflops),
            opt(r.gbps),
            r.seed.map(|s| s.to_string()).unwrap_or_default(),
            r.message.clone(),
            opt(r.wall_ms),
        ];
        rec.extend(params.iter().map(|p| param_cell(r.params.get(*p))));
        w.write_record(&rec)?;
    }
    Ok(())
}

/// Reads results.csv back from `file` (opened from `path`, named in errors), each row with its
/// line, streaming. An empty parameter cell (or `\N`, in older files) means the row lacked that
/// parameter.
pub(crate) fn read_csv(
    path: &Path,
    file: impl std::io::Read,
) -> Result<Vec<(u64, Row)>, ReportError> {
    let csv_err = |source| ReportError::Csv {
        path: path.to_path_buf(),
        source,
    };
    let mut rd = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(file);
    let header = rd.headers().map_err(csv_err)?.clone();
    let bad = |line: u64, message: String| ReportError::BadCsv {
        path: path.to_path_buf(),
        line,
        message,
    };
    let found: Vec<&str> = header.iter().take(OLD_FIXED).collect();
    if found != FIXED_COLUMNS[..OLD_FIXED] {
        return Err(bad(
            1,
            format!(
                "header must start with {}, found {}",
                FIXED_COLUMNS.join(","),
                found.join(",")
            ),
        ));
    }
    let fixed = if header.get(OLD_FIXED) == Some(FIXED_COLUMNS[OLD_FIXED]) {
        FIXED_COLUMNS.len()
    } else {
        OLD_FIXED
    };
    let param_names: Vec<String> = header.iter().skip(fixed).map(str::to_string).collect();
    let mut rows = Vec::new();
    for rec in rd.records() {
        let rec = rec.map_err(csv_err)?;
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        let cell = |i: usize| rec.get(i).unwrap_or("");
        let float = |i: usize| -> Result<Option<f64>, ReportError> {
            let text = cell(i);
            if text.is_empty() {
                return Ok(None);
            }
            text.parse::<f64>().map(Some).map_err(|_| {
                bad(
                    line,
                    format!("column {}: not a number: {text:?}", FIXED_COLUMNS[i]),
                )
            })
        };
        let status: Status = cell(3).parse().map_err(|e: String| bad(line, e))?;
        let seed = match cell(12) {
            "" => None,
            s => Some(
                s.parse::<u64>()
                    .map_err(|_| bad(line, format!("column seed: {s:?}")))?,
            ),
        };
        let params: BTreeMap<String, String> = param_names
            .iter()
            .enumerate()
            .filter_map(|(i, name)| {
                let cell = rec.get(fixed + i).unwrap_or(ABSENT_CELL);
                param_of_cell(cell).map(|v| (name.clone(), v))
            })
            .collect();
        rows.push((
            line,
            Row {
                case_id: cell(0).to_string(),
                trial: cell(1).to_string(),
                path: cell(2).to_string(),
                status,
                max_abs: float(4)?,
                mean_abs: float(5)?,
                rel_l2: float(6)?,
                bound: float(7)?,
                first_bad: Some(cell(8).to_string()).filter(|s| !s.is_empty()),
                ms: float(9)?,
                tflops: float(10)?,
                gbps: float(11)?,
                seed,
                message: cell(13).to_string(),
                wall_ms: if fixed > OLD_FIXED { float(14)? } else { None },
                params,
            },
        ));
    }
    Ok(rows)
}
