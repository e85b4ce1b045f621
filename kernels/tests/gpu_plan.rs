//! CPU-only checks of the GPU side: sources, entries, compile plans, cache keys, mutants, the
//! kernel parameter layout and launch planning. None of these needs a driver.

use relattn_kernels::gpu::{
    self, c_struct_fields, check_arch, entry_name, files, own_file, path_kernels, BiasSource,
    CompilePlan, Mutant, Params, Stage, Variant, CHECK_ARCHS, DTYPES, PARAMS_BYTES, PARAM_FIELDS,
};
use relattn_kernels::routing::PathId;

fn all_files() -> Vec<(&'static str, &'static str)> {
    PathId::ALL.iter().flat_map(|&p| files(p)).collect()
}

#[test]
fn sources_include_only_the_project_headers() {
    let headers: Vec<&str> = gpu::SHARED.iter().map(|(name, _)| *name).collect();
    for (name, text) in all_files() {
        for line in text
            .lines()
            .filter(|l| l.trim_start().starts_with("#include"))
        {
            let included = line.split('"').nth(1).unwrap_or("");
            assert!(
                headers.contains(&included),
                "{name}: `{line}`: NVRTC has no toolkit headers on the target machines, only ours"
            );
        }
    }
    // Each file includes what it uses: a path's file the attention loops (through rel_row.cuh
    // where its rows read rel_logits) and the kernel entries (sheared_bias the split combine
    // too), rel_row.cuh the attention loops, the loops their parts (the query blocks' biases
    // first), the parts the CTA's pieces (and the sm_90a instructions), the paged K/V copies and
    // the per-tile pieces the CTA's geometry, the geometry, the instructions and the other pieces
    // the parameters, the parameters the basics.
    for path in PathId::ALL {
        let text = own_file(path).1;
        let first = match path_kernels(path).bias {
            BiasSource::RelLogits => "rel_row.cuh",
            BiasSource::Prologue => "attention.cuh",
        };
        assert!(
            text.starts_with(&format!("#include \"{first}\"\n")),
            "{path}"
        );
        assert!(text.contains("\n#include \"entry.cuh\"\n"), "{path}");
        assert_eq!(
            text.contains("\n#include \"combine.cuh\"\n"),
            text.contains("combine_row<"),
            "{path}"
        );
    }
    for (name, first) in [
        ("rel_row.cuh", "attention.cuh"),
        ("attention.cuh", "query_bias.cuh"),
        ("decode.cuh", "query_bias.cuh"),
        ("window_block.cuh", "query_block.cuh"),
        ("query_block.cuh", "query_bias.cuh"),
        ("products.cuh", "paged_kv.cuh"),
        ("query_bias.cuh", "cta.cuh"),
        ("cta.cuh", "params.cuh"),
        ("ptx.cuh", "params.cuh"),
        ("paged_kv.cuh", "cta.cuh"),
        ("softmax.cuh", "cta.cuh"),
        ("sm90.cuh", "params.cuh"),
        ("kv_tma.cuh", "paged_kv.cuh"),
        ("fma_loop.cuh", "params.cuh"),
        ("combine.cuh", "params.cuh"),
        ("entry.cuh", "params.cuh"),
        ("params.cuh", "basics.cuh"),
    ] {
        let text = gpu::SHARED.iter().find(|(n, _)| *n == name).unwrap().1;
        assert!(
            text.starts_with(&format!("#pragma once\n#include \"{first}\"\n")),
            "{name}"
        );
    }
}

#[test]
fn architecture_ifdefs_stand_only_in_files_of_that_concern() {
    // The architecture's choices: its instructions, its products, its windowed block, its
    // launch bounds and its K/V tensor copies. Everything else is the same code on every SM80+ GPU.
    let allowed = [
        "sm90.cuh",
        "products.cuh",
        "window_block.cuh",
        "entry.cuh",
        "kv_tma.cuh",
    ];
    let mut files: Vec<(&str, &str)> = gpu::SHARED.to_vec();
    files.extend(PathId::ALL.map(own_file));
    let with: Vec<&str> = files
        .iter()
        .filter(|(_, text)| text.contains("__CUDA_ARCH"))
        .map(|(name, _)| *name)
        .collect();
    for name in &with {
        assert!(
            allowed.contains(name),
            "{name} holds an architecture #ifdef"
        );
    }
    assert!(with.contains(&"sm90.cuh"), "{with:?}");
    // sm90.cuh is sm_90a code from its first declaration to its end.
    let sm90 = gpu::SHARED
        .iter()
        .find(|(n, _)| *n == "sm90.cuh")
        .unwrap()
        .1;
    let code: Vec<&str> = sm90
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("//"))
        .collect();
    assert_eq!(
        code[..3],
        [
            "#pragma once",
            "#include \"params.cuh\"",
            "#ifdef __CUDA_ARCH_FEAT_SM90_ALL"
        ]
    );
    assert_eq!(code.last(), Some(&"#endif"));
    assert_eq!(sm90.matches("#endif").count(), 1);
}

#[test]
fn every_entry_is_defined_in_its_path_source() {
    for path in PathId::ALL {
        let (file, text) = own_file(path);
        for &stage in path_kernels(path).stages {
            for dtype in DTYPES {
                let name = entry_name(path, stage, dtype);
                // The macros paste the entry's name from these parts (entry.cuh).
                let (p, s, d) = (path.as_str(), stage.as_str(), dtype.name());
                assert!(
                    ["RELATTN_ENTRY", "RELATTN_DECODE_ENTRY"]
                        .iter()
                        .any(|m| text
                            .lines()
                            .any(|l| l.starts_with(&format!("{m}({p}, {s}, "))
                                && l.ends_with(&format!(", {d})")))),
                    "{file} does not define {name}"
                );
            }
        }
        // No entry of another path leaks into this program.
        for other in PathId::ALL.into_iter().filter(|&o| o != path) {
            assert!(
                !text.contains(&format!("ENTRY({},", other.as_str())),
                "{file} defines {other} entries"
            );
        }
    }
    assert_eq!(
        entry_name(
            PathId::ShearedBias,
            Stage::Combine,
            relattn_reference::DType::F16
        ),
        "sheared_bias_combine_fp16"
    );
}

#[test]
fn plan_options_follow_the_variant() {
    let plain = CompilePlan::all_paths("sm_90", Variant::PLAIN).unwrap();
    // One program per entry (path, stage, dtype), each keeping only its dtype's and stage's.
    let stages: usize = PathId::ALL
        .iter()
        .map(|&p| path_kernels(p).stages.len())
        .sum();
    assert_eq!(plain.programs.len(), stages * gpu::DTYPES.len());
    let mut all_entries = Vec::new();
    for p in &plain.programs {
        let [entry] = p.entries.as_slice() else {
            panic!("{} has entries {:?}", p.name, p.entries)
        };
        assert_eq!(p.name, format!("{entry}.cu"));
        let (dtype, stage) = gpu::DTYPES
            .iter()
            .flat_map(|&d| path_kernels(p.path).stages.iter().map(move |&s| (d, s)))
            .find(|&(d, s)| entry_name(p.path, s, d) == *entry)
            .expect("the entry of one of its path's stages");
        assert_eq!(
            p.options,
            [
                "-arch=sm_90".to_string(),
                "--std=c++17".into(),
                "-default-device".into(),
                format!("-DRELATTN_ONLY_{}", dtype.name()),
                format!("-DRELATTN_ONLY_STAGE_{}", stage.as_str()),
            ]
        );
        all_entries.extend(p.entries.iter().cloned());
        // The path's own file, which includes the shared headers NVRTC gets in memory.
        assert_eq!(p.source, gpu::own_file(p.path).1);
        assert!(p.source.starts_with("#include \""));
        let names: Vec<&str> = p.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "constants.cuh",
                "basics.cuh",
                "params.cuh",
                "fma_loop.cuh",
                "combine.cuh",
                "entry.cuh",
                "cta.cuh",
                "ptx.cuh",
                "paged_kv.cuh",
                "softmax.cuh",
                "sm90.cuh",
                "query_bias.cuh",
                "products.cuh",
                "kv_tma.cuh",
                "query_block.cuh",
                "window_block.cuh",
                "decode.cuh",
                "attention.cuh",
                "rel_row.cuh"
            ]
        );
        assert!(!p
            .options
            .iter()
            .any(|o| o.starts_with("-I") || o.starts_with("--include-path")));
    }
    let every: Vec<String> = PathId::ALL.iter().flat_map(|&p| gpu::entries(p)).collect();
    all_entries.sort();
    let mut every_sorted = every.clone();
    every_sorted.sort();
    assert_eq!(
        all_entries, every_sorted,
        "every entry in exactly one program"
    );
    let v = Variant {
        bounds_check: true,
        mutant: Some(Mutant::KvHeadModulo),
    };
    let checked = CompilePlan::new("sm_100", v, &[PathId::Fallback, PathId::Fallback]).unwrap();
    assert_eq!(
        checked.programs.len(),
        path_kernels(PathId::Fallback).stages.len() * gpu::DTYPES.len(),
        "duplicate paths compile once"
    );
    assert_eq!(
        checked.programs[0].options,
        [
            "-arch=sm_100",
            "--std=c++17",
            "-default-device",
            "-DRELATTN_BOUNDS_CHECK",
            "-DRELATTN_ONLY_bf16",
            "-DRELATTN_ONLY_STAGE_main",
        ]
    );
    // NVRTC's front end takes a path's stages together: one program per (path, dtype).
    let whole = CompilePlan::per_dtype("sm_90", Variant::PLAIN).unwrap();
    assert_eq!(whole.programs.len(), 3 * gpu::DTYPES.len());
    for (i, p) in whole.programs.iter().enumerate() {
        let dtype = gpu::DTYPES[i % gpu::DTYPES.len()];
        assert_eq!(p.name, format!("{}_{}.cu", p.path, dtype.name()));
        assert_eq!(p.entries, gpu::entries_of(p.path, dtype));
        assert_eq!(
            p.options.last(),
            Some(&format!("-DRELATTN_ONLY_{}", dtype.name()))
        );
    }
    // The defect is an edit of the program's sources, not a define.
    let edited = &Mutant::KvHeadModulo.patches()[0];
    assert_eq!(edited.file, "rel_row.cuh");
    let header = |plan: &CompilePlan| {
        let (_, text) = plan.programs[0]
            .headers
            .iter()
            .find(|(n, _)| n == edited.file)
            .unwrap();
        text.clone()
    };
    assert!(header(&checked).contains(edited.to));
    let plain = CompilePlan::new("sm_100", Variant::PLAIN, &[PathId::Fallback]).unwrap();
    assert!(!header(&plain).contains(edited.to));
    assert_eq!(v.label(), "checked+kv_head_modulo");
}

#[test]
fn architecture_names_are_checked() {
    for ok in CHECK_ARCHS
        .iter()
        .copied()
        .chain(["sm_90a", "sm_121", "sm_100f"])
    {
        check_arch(ok).unwrap();
    }
    for bad in [
        "90",
        "sm_",
        "sm_9",
        "compute_90",
        "sm_90ab",
        "sm_9x0",
        "sm_90;rm",
    ] {
        assert!(check_arch(bad).is_err(), "{bad} accepted");
        assert!(CompilePlan::all_paths(bad, Variant::PLAIN).is_err());
    }
}

#[test]
fn cache_keys_change_with_every_input() {
    let plan = |arch, v| {
        CompilePlan::new(arch, v, &[PathId::ScoreMod])
            .unwrap()
            .programs
            .remove(0)
    };
    let base = plan("sm_90", Variant::PLAIN);
    let key = base.cache_key("sm_90", (13, 0));
    assert_eq!(
        key,
        plan("sm_90", Variant::PLAIN).cache_key("sm_90", (13, 0)),
        "keys are deterministic"
    );
    assert_eq!(key.len(), 64);
    let mut others = vec![
        plan("sm_80", Variant::PLAIN).cache_key("sm_80", (13, 0)),
        base.cache_key("sm_90", (13, 1)),
        plan("sm_90", Variant::CHECKED).cache_key("sm_90", (13, 0)),
    ];
    // Every defect planted in score_mod's program (defects only of other paths' files leave
    // it as it is, so it shares the plain build's key and CUBIN).
    for m in Mutant::ALL
        .into_iter()
        .filter(|m| m.paths().contains(&PathId::ScoreMod))
    {
        others.push(
            plan(
                "sm_90",
                Variant {
                    bounds_check: false,
                    mutant: Some(m),
                },
            )
            .cache_key("sm_90", (13, 0)),
        );
    }
    let mut edited = base.clone();
    edited.source.push(' ');
    others.push(edited.cache_key("sm_90", (13, 0)));
    let mut header_edited = base.clone();
    header_edited.headers[0].1.push(' ');
    others.push(header_edited.cache_key("sm_90", (13, 0)));
    let mut all = others.clone();
    all.push(key.clone());
    all.sort();
    all.dedup();
    assert_eq!(
        all.len(),
        others.len() + 1,
        "some input does not change the key"
    );
}

#[test]
fn mutants_are_distinct_and_planted_where_they_apply() {
    let defines: Vec<u32> = Mutant::ALL.iter().map(|m| m.define()).collect();
    assert_eq!(defines, (1..=24).collect::<Vec<_>>());
    assert!(Mutant::ALL.len() >= 20);
    for m in Mutant::ALL {
        assert_eq!(m.as_str().parse::<Mutant>().unwrap(), m);
        assert_eq!(m.define().to_string().parse::<Mutant>().unwrap(), m);
        // Every edit matches its file once, and the files it edits name the paths it is on.
        let shared: Vec<&str> = gpu::SHARED.iter().map(|(n, _)| *n).collect();
        let mut in_shared = false;
        let mut owners: Vec<PathId> = Vec::new();
        assert!(!m.patches().is_empty(), "{m} is planted nowhere");
        for patch in m.patches() {
            let text = match gpu::SHARED.iter().find(|(n, _)| *n == patch.file) {
                Some((_, t)) => *t,
                None => {
                    let path = PathId::ALL
                        .into_iter()
                        .find(|&p| own_file(p).0 == patch.file)
                        .unwrap_or_else(|| panic!("{m}: no file {}", patch.file));
                    owners.push(path);
                    own_file(path).1
                }
            };
            in_shared |= shared.contains(&patch.file);
            assert_eq!(text.matches(patch.from).count(), 1, "{m}: {}", patch.file);
            assert_ne!(patch.from, patch.to, "{m}");
        }
        owners.sort();
        owners.dedup();
        for path in PathId::ALL {
            // A planted program differs from the plain one exactly on the defect's paths.
            let plain = CompilePlan::new("sm_90", Variant::PLAIN, &[path]).unwrap();
            let planted = CompilePlan::new(
                "sm_90",
                Variant {
                    bounds_check: false,
                    mutant: Some(m),
                },
                &[path],
            )
            .unwrap();
            let differs = plain.programs[0].cache_key("sm_90", (13, 0))
                != planted.programs[0].cache_key("sm_90", (13, 0));
            assert_eq!(
                differs,
                m.paths().contains(&path) || in_shared,
                "{m} on {path}"
            );
        }
        if in_shared {
            // Shared code runs on every path that calls it: a path's own file may hold more.
            assert!(
                owners.iter().all(|p| m.paths().contains(p)),
                "{m}: {owners:?}"
            );
        } else {
            let mut want = m.paths().to_vec();
            want.sort();
            assert_eq!(owners, want, "{m}: planted in these paths' files only");
        }
        assert!(!m.exposed_by().is_empty());
    }
    // Where a defect sits in shared code, the paths whose kernels run that code, as read from the
    // call sites: an independent statement of `paths()` for those defects.
    let all = PathId::ALL.to_vec();
    let expected: Vec<(Mutant, Vec<PathId>)> = vec![
        (Mutant::SoftmaxReset, all.clone()),
        (Mutant::RescaleClamped, all.clone()),
        (Mutant::WritesPaddingRows, all.clone()),
        (Mutant::PositionWithoutPrefix, all.clone()),
        (Mutant::BlockTableRowZero, all.clone()),
        (Mutant::UnmaskedKeysLoaded, all.clone()),
        (Mutant::BiasTimesScale, all.clone()),
        (Mutant::Bf16Accumulator, all.clone()),
        (Mutant::DispatchOnFirstRequest, all.clone()),
        (Mutant::EmptySplitPublished, vec![PathId::ShearedBias]),
        (
            Mutant::Fp16NegInfBits,
            vec![PathId::ScoreMod, PathId::Fallback],
        ),
        (
            Mutant::CombineClamped,
            vec![PathId::ShearedBias, PathId::Fallback],
        ),
    ];
    for (m, paths) in &expected {
        let mut got = m.paths().to_vec();
        got.sort();
        let mut want = paths.clone();
        want.sort();
        assert_eq!(got, want, "{m}");
    }
    // Only sheared_bias calls the shared combine_row (its empty-split defect's home); only the
    // paths whose rows read rel_logits stage it (rel_cell, the fp16 -inf defect's reader).
    let common = gpu::SHARED
        .iter()
        .map(|(_, t)| *t)
        .collect::<Vec<_>>()
        .join("\n");
    for m in [Mutant::EmptySplitPublished, Mutant::Fp16NegInfBits] {
        assert!(m.patches().iter().all(|p| common.contains(p.from)), "{m}");
    }
    for path in PathId::ALL {
        let (own, k) = (own_file(path).1, path_kernels(path));
        assert_eq!(
            own.contains("combine_row<T>("),
            k.has(Stage::Combine),
            "{path}"
        );
        assert_eq!(
            own.contains("REL_ROWS = true"),
            k.bias == BiasSource::RelLogits,
            "{path}"
        );
    }
    // The combines: sheared_bias's lives in the shared combine_row, fallback's in its own merge.
    for m in [Mutant::CombineNoRescale, Mutant::CombineClamped] {
        let (_, fallback) = own_file(PathId::Fallback);
        assert!(
            m.patches()
                .iter()
                .any(|p| p.file == "fallback.cu" && fallback.contains(p.from)),
            "{m}"
        );
        assert!(own_file(PathId::ShearedBias).1.contains("combine_row<T>("));
    }
    assert!("25".parse::<Mutant>().is_err());
    // Only a sanitizer sees the combine's missing barrier: its output is almost always right.
    let tool_only: Vec<(Mutant, &str)> = Mutant::ALL
        .iter()
        .filter_map(|&m| Some((m, m.seen_by_tool()?)))
        .collect();
    assert_eq!(tool_only, [(Mutant::CombineMaxUnsynced, "racecheck")]);
    assert!(Mutant::RelRowPastEnd.needs_bounds_check());
    assert_eq!(
        Mutant::ALL
            .iter()
            .filter(|m| m.needs_bounds_check())
            .count(),
        1
    );
}

/// The files a path's program reads: its own and every header it includes, directly or through
/// another header.
fn program_files(path: PathId) -> Vec<&'static str> {
    let text_of = |name: &str| {
        files(path)
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap_or_else(|| panic!("{path}: no file {name}"))
            .1
    };
    let mut seen = vec![own_file(path).0];
    let mut i = 0;
    while i < seen.len() {
        for line in text_of(seen[i]).lines() {
            if let Some(rest) = line.strip_prefix("#include \"") {
                let name = rest.split('"').next().unwrap();
                if !seen.contains(&name) {
                    seen.push(name);
                }
            }
        }
        i += 1;
    }
    seen
}

/// Every defect a path's descriptor says it holds is planted in a file its program reads: a new
/// path whose rows are its own (not rel_row.cuh's) fails here until its file has the edits of the
/// defects planted only in rows (the GQA map, the rel_logits row, `rel_ok`).
#[test]
fn each_paths_defects_are_planted_in_its_program() {
    for path in PathId::ALL {
        let reads = program_files(path);
        for m in path_kernels(path).defects() {
            assert!(
                m.patches().iter().any(|p| reads.contains(&p.file)),
                "{m} on {path}: no edit in {reads:?}"
            );
        }
    }
    assert!(program_files(PathId::ShearedBias).contains(&"combine.cuh"));
    assert!(!program_files(PathId::ScoreMod).contains(&"combine.cuh"));
}

#[test]
fn params_mirror_the_c_struct() {
    assert_eq!(std::mem::size_of::<Params>(), PARAMS_BYTES);
    // The tensor maps start at the first 64-byte boundary after the 8-byte fields, as in C.
    assert_eq!(std::mem::offset_of!(Params, tma), 344);
    assert_eq!(std::mem::offset_of!(Params, tmap_k), 384);
    assert_eq!(std::mem::offset_of!(Params, tmap_v), 512);
    let c = c_struct_fields(gpu::PARAMS).expect("struct Params in params.cuh");
    assert_eq!(c, PARAM_FIELDS);
}

#[test]
fn compiling_without_nvrtc_is_a_typed_error() {
    // Only meaningful where NVRTC is missing (CI); elsewhere the GPU tests cover compile().
    if !gpu::nvrtc_available() {
        let plan = CompilePlan::all_paths("sm_90", Variant::PLAIN).unwrap();
        assert!(matches!(
            gpu::compile(&plan),
            Err(gpu::GpuError::NoDriver(_))
        ));
        assert!(matches!(
            gpu::compile_check(&["sm_90"], &[Variant::PLAIN]),
            Err(gpu::GpuError::NoDriver(_))
        ));
    }
    if !gpu::Gpu::available() {
        assert!(matches!(gpu::Gpu::open(0), Err(gpu::GpuError::NoDriver(_))));
    }
}

/// `kernels/cuda/constants.cuh` is the text generated from the Rust constants (the compile uses
/// the generated text; the file is there for editors).
#[test]
fn the_constants_header_is_the_generated_one() {
    let on_disk = gpu::SHARED
        .iter()
        .find(|(name, _)| *name == "constants.cuh")
        .unwrap()
        .1;
    let generated = gpu::constants_header();
    assert!(
        on_disk == generated,
        "kernels/cuda/constants.cuh is stale; write it as:\n{generated}"
    );
    for (name, value, _) in gpu::SHARED_CONSTANTS {
        assert!(generated.contains(&format!("\n#define {name} {value}\n")));
        // Defined there only: no second definition in the hand-written files.
        for (file, text) in gpu::SHARED.iter().filter(|(f, _)| *f != "constants.cuh") {
            assert!(
                !text.contains(&format!("#define {name} ")),
                "{file} defines {name}"
            );
        }
    }
}

/// Whether NVRTC can be loaded here: `.ci/run` fetches it and sets `RELATTN_REQUIRE_NVRTC`, under
/// which a missing NVRTC fails the test; elsewhere the test says it was skipped.
fn nvrtc_here() -> bool {
    if gpu::nvrtc_available() {
        return true;
    }
    assert!(
        std::env::var_os("RELATTN_REQUIRE_NVRTC").is_none(),
        "RELATTN_REQUIRE_NVRTC is set but libnvrtc cannot be loaded (LD_LIBRARY_PATH?)"
    );
    eprintln!("skipped: libnvrtc cannot be loaded on this machine");
    false
}

/// NVRTC's front end passes every program in every build (plain, bounds-checked, each planted
/// defect) for sm_90a, sm_80 and sm_100 (both sides of the architecture `#ifdef`s). It needs
/// NVRTC, not a GPU (`nvrtc_here`).
#[test]
fn every_build_passes_nvrtcs_front_end() {
    if !nvrtc_here() {
        return;
    }
    for arch in ["sm_90a", "sm_80", "sm_100"] {
        let records = gpu::syntax_check(arch).unwrap();
        assert_eq!(
            records.len(),
            3 * gpu::DTYPES.len() * (2 + Mutant::ALL.len()),
            "{arch}"
        );
        let failed: Vec<String> = records
            .iter()
            .filter(|r| !r.ok)
            .map(|r| format!("{} {} ({}): {}", r.arch, r.program, r.variant, r.message))
            .collect();
        assert!(failed.is_empty(), "{}", failed.join("\n"));
    }
}

/// A program of one stage defines that stage's entry and no other (entry.cuh's stage defines),
/// and a compiled program that lacks an entry it must define is an NVRTC error, not a CUBIN
/// that fails first when a device loads it. Compiles sheared_bias' two small stages only (a
/// fraction of a second); needs NVRTC (`nvrtc_here`).
#[test]
fn a_stages_program_defines_its_entry_alone() {
    if !nvrtc_here() {
        return;
    }
    let mut plan = CompilePlan::new("sm_80", Variant::PLAIN, &[PathId::ShearedBias]).unwrap();
    plan.programs
        .retain(|p| p.name.contains("_prologue_") || p.name.contains("_combine_"));
    assert_eq!(plan.programs.len(), 2 * DTYPES.len());
    let compiled = gpu::compile(&plan).unwrap_or_else(|e| panic!("{e}"));
    for p in &compiled.programs {
        for stage in path_kernels(PathId::ShearedBias).stages {
            for dtype in DTYPES {
                let entry = entry_name(PathId::ShearedBias, *stage, dtype);
                assert_eq!(
                    gpu::cubin_defines(&p.cubin, &entry),
                    p.entries == [entry.clone()],
                    "{} and {entry}",
                    p.name
                );
            }
        }
    }
    plan.programs.truncate(1);
    plan.programs[0]
        .entries
        .push("sheared_bias_main_bf16".into());
    let err = match gpu::compile(&plan) {
        Ok(_) => panic!("a program without one of its entries compiled"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("the CUBIN has no kernel named sheared_bias_main_bf16"),
        "{err}"
    );
}
