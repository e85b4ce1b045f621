//! Case ids: stable across expansions and machines, and sensitive to every parameter.

use relattn_matrices::{canonical_form, case_id, load_tier, ID_DIGITS, ID_PREFIX, TIERS};
use relattn_reference::{BiasMode, CacheLayout, DType, GenSpec, PageMode, RowLayout};
use std::collections::BTreeSet;

fn base() -> GenSpec {
    GenSpec::global(16, 2, vec![(1, 100), (5, 5), (0, 7)], 7)
}

#[test]
fn expanding_twice_gives_the_same_ids_and_names() {
    for tier in ["smoke", "ci", "regressions"] {
        let m = load_tier(tier).unwrap();
        let a = m.expand().unwrap();
        let b = load_tier(tier).unwrap().expand().unwrap();
        let ids = |x: &relattn_matrices::Expansion| {
            x.cases
                .iter()
                .map(|c| (c.id.clone(), c.name.clone()))
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&a), ids(&b), "{tier}");
        assert_eq!(a, b, "{tier}");
    }
}

#[test]
fn ids_are_a_letter_then_short_lowercase_hex_of_the_canonical_form() {
    for tier in TIERS {
        for c in load_tier(tier).unwrap().expand().unwrap().cases {
            let hex =
                c.id.strip_prefix(ID_PREFIX)
                    .expect("an id starts with its prefix");
            assert_eq!(hex.len(), ID_DIGITS);
            assert!(hex
                .chars()
                .all(|ch| ch.is_ascii_digit() || ('a'..='f').contains(&ch)));
            assert_eq!(
                c.id,
                case_id(c.spec().unwrap(), c.sample_rows),
                "{}",
                c.name
            );
            assert!(
                !c.name.contains(&c.id),
                "{}: the name must not carry the id",
                c.name
            );
        }
    }
}

/// Every field of the spec, and the sampled-row count, changes the id.
#[test]
fn the_id_depends_on_every_parameter() {
    type Change = (&'static str, fn(&mut GenSpec));
    let changes: &[Change] = &[
        ("dtype", |s| s.dtype = DType::F16),
        ("num_heads", |s| s.num_heads = 32),
        ("num_kv_heads", |s| s.num_kv_heads = 4),
        ("head_dim", |s| s.head_dim = 64),
        ("rel_extent", |s| s.rel_extent = 512),
        ("window_left", |s| s.window_left = 1023),
        ("softmax_scale", |s| s.softmax_scale = 1.0 / 64.0),
        ("softmax_scale, last bit", |s| {
            s.softmax_scale = f64::from_bits(s.softmax_scale.to_bits() + 1)
        }),
        ("page_size", |s| s.page_size = 32),
        ("layout", |s| s.layout = CacheLayout::HndPacked),
        ("a query length", |s| s.requests[1].0 = 4),
        ("a key length", |s| s.requests[0].1 = 101),
        ("request order", |s| s.requests.swap(0, 1)),
        ("one more request", |s| s.requests.push((1, 1))),
        ("padding_rows", |s| s.padding_rows = 3),
        ("bias", |s| s.bias = BiasMode::Distinct),
        ("pages", |s| s.pages = PageMode::AllZero),
        ("spare_pages", |s| s.spare_pages = 0),
        ("poison", |s| s.poison = false),
        ("seed", |s| s.seed = 8),
        ("rows", |s| s.rows = RowLayout::Exact),
        ("rows, strided", |s| s.rows = RowLayout::Strided),
    ];
    let id = case_id(&base(), None);
    let mut all = BTreeSet::from([id.clone()]);
    for (what, change) in changes {
        let mut spec = base();
        change(&mut spec);
        let other = case_id(&spec, None);
        assert_ne!(other, id, "changing {what} kept the id");
        all.insert(other);
    }
    assert_eq!(
        all.len(),
        changes.len() + 1,
        "two different changes gave one id"
    );
    assert_ne!(case_id(&base(), Some(32)), id, "sample_rows");
    assert_ne!(
        case_id(&base(), Some(32)),
        case_id(&base(), Some(16)),
        "sample_rows count"
    );
}

/// No id reads as a number: pandas and spreadsheets turned all-digit ids and digits-e-digits
/// ids (`394362e594`) into numbers (or `inf`), so every id starts with a letter.
#[test]
fn no_id_reads_as_a_number() {
    for tier in TIERS {
        for c in load_tier(tier).unwrap().expand().unwrap().cases {
            assert!(
                c.id.starts_with(|ch: char| ch.is_ascii_alphabetic()),
                "{}",
                c.id
            );
            assert!(c.id.parse::<f64>().is_err(), "{} parses as a float", c.id);
            assert!(
                c.id.parse::<i128>().is_err(),
                "{} parses as an integer",
                c.id
            );
        }
    }
}

/// Golden ids, computed once from the canonical form. Baselines, reports and bug notes refer
/// to cases by id, so a change to the canonical form (field order, number formatting, hashing)
/// or to the id's prefix silently orphans them; this test makes such a change deliberate: bump
/// the form's version and these values together. The `c` prefix (before it, ids were the same
/// hex digits alone: `b6d56a56e4`, `ae924ec777`, `ee283c9d26`) was such a change.
#[test]
fn golden_ids_do_not_change() {
    let local = GenSpec {
        dtype: DType::F16,
        layout: CacheLayout::HndPacked,
        page_size: 128,
        ..GenSpec::local(8, 2, 512, vec![(2048, 131072), (1, 9)], 3)
    };
    let sampled = GenSpec {
        padding_rows: 13,
        bias: BiasMode::Zero,
        ..base()
    };
    let got = [
        case_id(&base(), None),
        case_id(&local, None),
        case_id(&sampled, Some(32)),
    ];
    assert_eq!(got, ["cb6d56a56e4", "cae924ec777", "cee283c9d26"]);
}

#[test]
fn the_canonical_form_reads_as_its_parameters() {
    let form = canonical_form(&base(), None);
    assert!(form.starts_with("relattn-case-v1;"), "{form}");
    for part in [
        "dtype=bf16",
        "h=16",
        "hkv=2",
        "e=1024",
        "w=-1",
        "requests=1:100,5:5,0:7",
        "seed=7",
    ] {
        assert!(form.contains(part), "{form} lacks {part}");
    }
}
