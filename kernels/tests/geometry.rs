//! `Geometry::of_spec` (planning a matrix without generating it) agrees with `Geometry::of` of
//! the generated problem, for every layout, page mode and padding.

use relattn_kernels::gpu::Geometry;
use relattn_reference::gen::{generate, GenSpec};
use relattn_reference::{CacheLayout, DType, Inputs, PageMode};

#[test]
fn geometry_from_the_spec_is_that_of_the_generated_problem() {
    let mut checked = 0;
    for layout in CacheLayout::ALL {
        for pages in [PageMode::Shuffled, PageMode::AllZero] {
            for (page_size, spare, padding) in [(16, 1, 0), (48, 0, 3), (128, 2, 1), (5, 1, 2)] {
                let requests = vec![(3, 40), (0, 17), (1, 200), (9, 9)];
                let spec = GenSpec {
                    dtype: DType::F16,
                    layout,
                    pages,
                    page_size,
                    spare_pages: spare,
                    padding_rows: padding,
                    inputs: Inputs::Sink,
                    ..GenSpec::local(8, 2, 64, requests, 3)
                };
                let from_spec = Geometry::of_spec(&spec).unwrap();
                let generated = Geometry::of(&generate(&spec).unwrap());
                assert_eq!(from_spec, generated, "{spec:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, CacheLayout::ALL.len() * 2 * 4);
}
