//! Every GPU path against the f64 reference with docs/operator.md section 6's bound, under forced
//! and policy split counts, with and without the bounds check; the decode merges right and
//! deterministic over launches; the defect only the bounds check sees trapped in a child process;
//! the compile-only check over all architectures. Every planted defect caught is the `ci` tier's
//! (`relattn mutants`, the `mutants::` trial of the harness's `cargo test`). Timing is `relattn
//! bench`'s.
//!
//! Needs an NVIDIA GPU with driver and NVRTC:
//! `cargo test -p relattn-kernels --test gpu_paths -- --ignored --test-threads 1 --nocapture`

use rayon::prelude::*;
use relattn_kernels::gpu::{
    compile, compile_check, plan_launches, run_path, run_path_timed, CompilePlan, Geometry, Gpu,
    GpuError, GpuRun, Loaded, Mutant, Repeats, SplitSetting, Stage, Variant, CHECK_ARCHS,
};
use relattn_kernels::routing::PathId;
use relattn_reference::gen::{generate, BiasMode, GenSpec, PageMode};
use relattn_reference::judge::{self as spec6, Tolerance};
use relattn_reference::{emulate, fast, CacheLayout, DType, Problem, RefOutput};

struct Case {
    name: &'static str,
    problem: Problem,
    ref64: RefOutput,
    ref_lp: RefOutput,
}

fn case(name: &'static str, spec: GenSpec) -> Case {
    let problem = generate(&spec).unwrap();
    let ref64 = fast::attention(&problem);
    let ref_lp = emulate::attention(&problem);
    Case {
        name,
        problem,
        ref64,
        ref_lp,
    }
}

/// Small cases covering the axes of docs/operator.md sections 2 and 5.
fn cases() -> Vec<Case> {
    let mut mixed = GenSpec::global(
        16,
        2,
        vec![(37, 300), (0, 50), (1, 700), (64, 64), (5, 1100)],
        11,
    );
    mixed.rel_extent = 256;
    mixed.padding_rows = 3;
    let mut local = GenSpec::local(8, 2, 128, vec![(20, 400), (1, 300), (33, 33)], 12);
    local.page_size = 128;
    local.layout = CacheLayout::HndPacked;
    let mut decode = GenSpec::global(
        8,
        1,
        vec![(1, 2000), (1, 1), (0, 10), (1, 513), (1, 5000)],
        13,
    );
    decode.rel_extent = 256;
    decode.layout = CacheLayout::Contiguous;
    decode.padding_rows = 2;
    let mut local_decode = GenSpec::local(16, 4, 128, vec![(1, 1000), (1, 60), (1, 129)], 14);
    local_decode.page_size = 32;
    let mut aliased = GenSpec::global(4, 4, vec![(17, 40), (3, 3)], 15);
    aliased.rel_extent = 128;
    aliased.pages = PageMode::AllZero;
    aliased.bias = BiasMode::Distinct;
    aliased.padding_rows = 1;
    // Distinct bias values up to |4| make a single wrong bias cell visible (d == E, window edge).
    let mut distinct = GenSpec::global(4, 2, vec![(6, 130), (1, 129), (9, 300)], 18);
    distinct.rel_extent = 128;
    distinct.bias = BiasMode::Distinct;
    let mut fp16 = GenSpec::global(6, 3, vec![(9, 200), (40, 40)], 16);
    fp16.dtype = DType::F16;
    fp16.rel_extent = 128;
    let mut mqa = GenSpec::local(4, 1, 256, vec![(3, 600), (2, 2)], 17);
    mqa.padding_rows = 1;
    vec![
        case("mixed_global_g8_page16_nhd", mixed),
        case("local_page128_hnd_tail33", local),
        case("decode_g8_contiguous", decode),
        case("local_decode_page32", local_decode),
        case("all_zero_block_table", aliased),
        case("distinct_bias_global_e128", distinct),
        case("fp16_g2", fp16),
        case("local_mqa_padding", mqa),
    ]
}

fn split_settings(path: PathId, p: &Problem) -> Vec<SplitSetting> {
    match path {
        PathId::ScoreMod => vec![SplitSetting::Policy],
        PathId::ShearedBias => [1, 2, 3, 7, 16, 128]
            .into_iter()
            .map(SplitSetting::Forced)
            .chain([SplitSetting::Policy])
            .collect(),
        PathId::Fallback => {
            let mut s = vec![SplitSetting::Policy, SplitSetting::Forced(1)];
            if p.max_query_len() <= 1 {
                s.extend([2, 3, 7, 32].map(SplitSetting::Forced));
            }
            s
        }
    }
}

/// docs/operator.md section 6 on the real rows, by the judge `relattn run` uses, with the default
/// tolerance of the case's dtype: Ok(worst error-to-bound ratio) or why it fails. Elements still
/// holding the unwritten poison are named first (the judge sees them only as non-finite).
fn judge(case: &Case, run: &GpuRun) -> Result<f64, String> {
    if run.unwritten > 0 {
        return Err(format!(
            "{} real elements unwritten, first {:?}",
            run.unwritten, run.first_unwritten
        ));
    }
    let p = &case.problem;
    let v = spec6::judge(
        p,
        &run.out,
        &case.ref64,
        &case.ref_lp,
        &Tolerance::default_for(p.dtype),
        run.padding_intact,
        run.counters_left,
    );
    if v.pass {
        Ok(v.ratio)
    } else {
        Err(v.reason)
    }
}

fn load(gpu: &Gpu, variant: Variant) -> Loaded {
    let plan = CompilePlan::all_paths(&gpu.arch(), variant).unwrap();
    let compiled = compile(&plan).unwrap_or_else(|e| panic!("{e}"));
    gpu.load(&compiled).unwrap()
}

/// Runs every case x path x split setting; returns the failures.
fn check_all(gpu: &Gpu, loaded: &Loaded, cases: &[Case], label: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        let dp = gpu.upload(&case.problem).unwrap();
        for path in PathId::ALL {
            let mut worst = 0f64;
            let mut ms = Vec::new();
            for splits in split_settings(path, &case.problem) {
                match run_path(gpu, loaded, &dp, path, splits) {
                    Ok(run) => match judge(case, &run) {
                        Ok(ratio) => {
                            worst = worst.max(ratio);
                            ms.push(format!("{}:{:.3}", run.num_splits, run.ms));
                        }
                        Err(e) => {
                            failures.push(format!("[{label}] {} {path} {splits:?}: {e}", case.name))
                        }
                    },
                    Err(GpuError::Unsupported { reason, .. }) => {
                        println!("[{label}] {} {path} {splits:?}: skip ({reason})", case.name)
                    }
                    Err(e) => {
                        failures.push(format!("[{label}] {} {path} {splits:?}: {e}", case.name))
                    }
                }
            }
            println!(
                "[{label}] {:<28} {:<13} worst ratio {worst:.3}  splits:ms {}",
                case.name,
                path.as_str(),
                ms.join(" ")
            );
        }
    }
    failures
}

#[test]
#[ignore = "needs an NVIDIA GPU with driver and NVRTC"]
fn every_path_matches_the_reference() {
    let gpu = Gpu::open(0).unwrap();
    println!(
        "GPU 0: {} ({}, {})",
        gpu.name(),
        gpu.capability(),
        gpu.arch()
    );
    let cases = cases();
    let mut failures = Vec::new();
    for variant in [Variant::PLAIN, Variant::CHECKED] {
        let loaded = load(&gpu, variant);
        failures.extend(check_all(&gpu, &loaded, &cases, &variant.label()));
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// How a planted build first failed: the (case, splits) and why, and whether the failure was a
/// GPU error (a trap or fault, which leaves CUDA unusable in the process, see `GpuError::Trap`)
/// rather than a wrong result.
struct Catch {
    how: String,
    gpu_error: bool,
}

/// The first (case, splits) on which `path` built with `variant` fails, or None if it survives.
fn first_catch(gpu: &Gpu, variant: Variant, path: PathId, cases: &[Case]) -> Option<Catch> {
    let loaded = load(gpu, variant);
    for case in cases {
        let dp = gpu.upload(&case.problem).unwrap();
        let mut settings = vec![SplitSetting::Policy];
        match path {
            PathId::ShearedBias => settings.push(SplitSetting::Forced(3)),
            PathId::Fallback if case.problem.max_query_len() <= 1 => {
                settings.push(SplitSetting::Forced(3))
            }
            _ => {}
        }
        for splits in settings {
            match run_path(gpu, &loaded, &dp, path, splits) {
                Ok(run) => {
                    if let Err(e) = judge(case, &run) {
                        return Some(Catch {
                            how: format!("{} {splits:?}: {e}", case.name),
                            gpu_error: false,
                        });
                    }
                }
                Err(GpuError::Unsupported { .. }) => {}
                Err(e) => {
                    return Some(Catch {
                        how: format!("{} {splits:?}: {e}", case.name),
                        gpu_error: true,
                    })
                }
            }
        }
    }
    None
}

/// Compile every build of `variants` up front, in parallel (later loads hit the cache).
fn precompile(arch: &str, variants: &[Variant]) {
    variants.par_iter().for_each(|&v| {
        compile(&CompilePlan::all_paths(arch, v).unwrap()).unwrap_or_else(|e| panic!("{e}"));
    });
}

fn mutant_variant(m: Mutant) -> Variant {
    Variant {
        bounds_check: m.needs_bounds_check(),
        mutant: Some(m),
    }
}

/// Set in the child processes of `trapped_defect_is_caught`: the (defect, path) pairs the child
/// checks, as `defect:path` separated by commas.
const MUTANT_CHILD_PAIRS: &str = "RELATTN_MUTANT_CHILD_PAIRS";

/// A planted build's verdict from a child: Some(how it was caught, whether by a GPU error) or
/// None (it survived every case).
type Verdict = Option<(String, bool)>;

/// Check the planted builds of `pairs` in child processes (this test binary, running test `test`
/// with `MUTANT_CHILD_PAIRS` set, which calls `mutant_child`), so a defect that traps or faults
/// ends only its child's CUDA: a child checks pairs in order and stops after a GPU error, and the
/// next child takes the pairs left. Returns each pair's verdict, in order; panics if a child dies
/// without giving one.
fn check_in_children(test: &str, pairs: &[(Mutant, PathId)]) -> Vec<Verdict> {
    let mut verdicts = Vec::new();
    while verdicts.len() < pairs.len() {
        let left = &pairs[verdicts.len()..];
        let list: Vec<String> = left.iter().map(|(m, p)| format!("{m}:{p}")).collect();
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                test,
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(MUTANT_CHILD_PAIRS, list.join(","))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&child.stdout).into_owned();
        let before = verdicts.len();
        for line in stdout.lines() {
            let Some((tag, m, p, how)) = parse_verdict(line) else {
                continue;
            };
            let (em, ep) = left[verdicts.len() - before];
            assert!(
                (m, p) == (em.as_str(), ep.as_str()),
                "verdict out of order (expected {em} {ep}): {line}"
            );
            verdicts.push(match tag {
                "caught" => Some((how.to_string(), false)),
                "fault" => Some((how.to_string(), true)),
                _ => None,
            });
        }
        assert!(
            verdicts.len() > before,
            "child for {} gave no verdict ({}):\n{stdout}{}",
            list[0],
            child.status,
            String::from_utf8_lossy(&child.stderr)
        );
    }
    verdicts
}

/// A child's `VERDICT tag defect path how` line as (tag, defect, path, how). The first may follow
/// libtest's `test NAME ... ` on the same line.
fn parse_verdict(line: &str) -> Option<(&str, &str, &str, &str)> {
    let rest = &line[line.find("VERDICT ")? + "VERDICT ".len()..];
    let mut parts = rest.splitn(4, ' ');
    Some((
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next().unwrap_or(""),
    ))
}

#[test]
fn verdict_lines_parse_after_libtests_prefix() {
    assert_eq!(
        parse_verdict("test every_mutant_is_caught ... VERDICT fault rel_row_past_end sheared_bias case Policy: trapped"),
        Some(("fault", "rel_row_past_end", "sheared_bias", "case Policy: trapped"))
    );
    assert_eq!(
        parse_verdict("VERDICT survived window_strict fallback "),
        Some(("survived", "window_strict", "fallback", ""))
    );
    assert_eq!(parse_verdict("mutant window_strict caught"), None);
}

/// Child side of `check_in_children`: one `VERDICT` line per pair, until the pairs end or one is
/// caught by a GPU error.
fn mutant_child(pairs: &str) {
    let gpu = Gpu::open(0).unwrap();
    let cases = cases();
    for pair in pairs.split(',') {
        let (m, p) = pair.split_once(':').unwrap();
        let (m, p): (Mutant, PathId) = (m.parse().unwrap(), p.parse().unwrap());
        match first_catch(&gpu, mutant_variant(m), p, &cases) {
            Some(c) => {
                let tag = if c.gpu_error { "fault" } else { "caught" };
                println!("VERDICT {tag} {m} {p} {}", c.how.replace('\n', " "));
                if c.gpu_error {
                    return;
                }
            }
            None => println!("VERDICT survived {m} {p} "),
        }
    }
}

/// The out-of-range rel_logits read changes no number: only the bounds-checked build sees it, as
/// a trap, in a child process per path (`check_in_children`); this process must stay able to
/// compute afterwards.
#[test]
#[ignore = "needs an NVIDIA GPU with driver and NVRTC"]
fn trapped_defect_is_caught() {
    if let Ok(pairs) = std::env::var(MUTANT_CHILD_PAIRS) {
        return mutant_child(&pairs);
    }
    let m = Mutant::RelRowPastEnd;
    let pairs: Vec<(Mutant, PathId)> = m.paths().iter().map(|&p| (m, p)).collect();
    let mut failures = Vec::new();
    for ((_, path), verdict) in pairs
        .iter()
        .zip(check_in_children("trapped_defect_is_caught", &pairs))
    {
        match verdict {
            Some((how, true)) if how.contains("trapped") => println!("mutant {m} {path}: {how}"),
            Some((how, _)) => failures.push(format!("{m} on {path}: caught without a trap: {how}")),
            None => failures.push(format!("{m} on {path}: the out-of-range read was not seen")),
        }
    }
    let gpu = Gpu::open(0).unwrap();
    let cases = cases();
    let loaded = load(&gpu, Variant::PLAIN);
    let dp = gpu.upload(&cases[1].problem).unwrap();
    let run = run_path(&gpu, &loaded, &dp, PathId::ScoreMod, SplitSetting::Policy).unwrap();
    judge(&cases[1], &run).unwrap();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[ignore = "needs NVRTC (slow: every program for every architecture)"]
fn every_program_compiles_for_every_architecture() {
    // RELATTN_CHECK_ARCHS=sm_90,sm_100 narrows the check (e.g. for a quick local run).
    let list = std::env::var("RELATTN_CHECK_ARCHS").unwrap_or_default();
    let archs: Vec<&str> = if list.is_empty() {
        CHECK_ARCHS.to_vec()
    } else {
        list.split(',').collect()
    };
    let records = compile_check(&archs, &[Variant::PLAIN, Variant::CHECKED]).unwrap();
    for r in &records {
        println!(
            "compile {:<7} {:<16} {:<8} {}",
            r.arch,
            r.program,
            r.variant,
            if r.ok { "ok" } else { "FAILED" }
        );
    }
    let failed: Vec<_> = records
        .iter()
        .filter(|r| !r.ok)
        .map(|r| format!("{} {} {}: {}", r.arch, r.program, r.variant, r.message))
        .collect();
    // 16 programs per architecture (one per stage and dtype: sheared_bias' prologue, main and
    // combine, score_mod's main and windowed, fallback's main, windowed and decode; bf16 and
    // fp16), each in both builds.
    assert_eq!(records.len(), archs.len() * 16 * 2);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Warms the CUBIN cache for one architecture (`RELATTN_PRECOMPILE_ARCH`, default sm_90) with every
/// build the tests above use, so a later GPU run loads instead of compiling.
#[test]
#[ignore = "needs NVRTC (slow: every build variant)"]
fn precompile_every_variant() {
    let arch = std::env::var("RELATTN_PRECOMPILE_ARCH").unwrap_or_else(|_| "sm_90".into());
    // RELATTN_PRECOMPILE_VARIANTS=plain: only the build `bench` and `run --bounds-check off` use;
    // =checked: that and the bounds-checked build; otherwise every planted defect's build too.
    let which = std::env::var("RELATTN_PRECOMPILE_VARIANTS").unwrap_or_default();
    let mut variants = vec![Variant::PLAIN];
    if which != "plain" {
        variants.push(Variant::CHECKED);
    }
    if which != "plain" && which != "checked" {
        variants.extend(Mutant::ALL.map(mutant_variant));
    }
    precompile(&arch, &variants);
}

/// The fallback decode kernel on a batch whose splits are cut into pieces (one KV head, so the
/// launch has fewer than `DECODE_TARGET_CTAS` split CTAs) next to requests whose are not: right,
/// with every counter reset for the next launch, and bit for bit the same in every launch,
/// although which CTA finishes last, and so merges, changes with timing.
#[test]
#[ignore = "needs an NVIDIA GPU with driver and NVRTC"]
fn decode_merges_are_right_and_deterministic() {
    let gpu = Gpu::open(0).unwrap();
    let loaded = load(&gpu, Variant::PLAIN);
    let spec = GenSpec::global(8, 1, vec![(1, 65536), (1, 40000), (0, 7), (1, 3000)], 23);
    let case = case("decode_pieces_batch", spec);
    let plan = plan_launches(
        PathId::Fallback,
        &Geometry::of(&case.problem),
        SplitSetting::Policy,
    )
    .unwrap();
    assert_eq!(plan.launches[0].stage, Stage::Decode);
    assert!(plan.decode_pieces > 1);
    let dp = gpu.upload(&case.problem).unwrap();
    let bits = |run: &GpuRun| run.out.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    let first = run_path(&gpu, &loaded, &dp, PathId::Fallback, SplitSetting::Policy).unwrap();
    judge(&case, &first).unwrap();
    for launch in 1..6 {
        let again = run_path(&gpu, &loaded, &dp, PathId::Fallback, SplitSetting::Policy).unwrap();
        judge(&case, &again).unwrap();
        assert!(
            bits(&again) == bits(&first),
            "launch {launch} differs from launch 0"
        );
    }
    // A trial's warm repeats on the same buffers (counters reset by the kernel): the judged
    // output is still the first launch's, the time their median.
    let timed = run_path_timed(
        &gpu,
        &loaded,
        &dp,
        PathId::Fallback,
        SplitSetting::Policy,
        Repeats::TRIAL,
    )
    .unwrap();
    assert!(bits(&timed) == bits(&first));
    assert_eq!(timed.counters_left, 0);
    assert!(!timed.warm_ms.is_empty() && timed.warm_ms.len() <= Repeats::TRIAL.warm_launches);
    let mut sorted = timed.warm_ms.clone();
    sorted.sort_by(f32::total_cmp);
    assert!(timed.ms >= sorted[0] && timed.ms <= sorted[sorted.len() - 1]);
}

/// The fallback decode entry at the edges of its shapes: a group of 16 heads (the most one
/// fragment holds, every row of the staged-bias regions in use) over 64 forced splits, a group of
/// 32 heads (the FMA loop, no staged bias), and E = 100, not a multiple of 8 (the bias gathered
/// per cell instead of staged).
#[test]
#[ignore = "needs an NVIDIA GPU with driver and NVRTC"]
fn decode_entry_edges_are_right() {
    let gpu = Gpu::open(0).unwrap();
    let loaded = load(&gpu, Variant::PLAIN);
    for (name, heads, splits, extent) in [
        ("decode_g16_64_splits", 16, 64, 1024),
        ("decode_g32_8_splits", 32, 8, 1024),
        ("decode_e100_gathered", 8, 4, 100),
    ] {
        let mut spec = GenSpec::global(heads, 1, vec![(1, 50000), (1, 9000)], 29);
        spec.rel_extent = extent;
        let case = case(name, spec);
        let run = run_path(
            &gpu,
            &loaded,
            &gpu.upload(&case.problem).unwrap(),
            PathId::Fallback,
            SplitSetting::Forced(splits),
        )
        .unwrap();
        judge(&case, &run).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
