//! Console tables (`matrix`, `matrix --coverage`, `route --check`, `bench`): Markdown-style
//! ASCII, so a table reads the same in a terminal and a CI log and pastes into an issue as is.

use comfy_table::{presets, CellAlignment, Table};

/// A table with `header`; the columns whose index is in `right` are aligned right (numbers).
pub fn new(header: &[&str], right: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::ASCII_MARKDOWN)
        .set_header(header.to_vec());
    for &i in right {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// The table's text with a final newline.
pub fn text(t: &Table) -> String {
    format!("{}\n", t.trim_fmt())
}

#[cfg(test)]
mod tests {
    #[test]
    fn numbers_align_right_under_a_markdown_header() {
        let mut t = super::new(&["tier", "cases"], &[1]);
        t.add_row(vec!["smoke".to_string(), "77".to_string()]);
        t.add_row(vec!["nightly".to_string(), "13080".to_string()]);
        let s = super::text(&t);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 4, "{s}");
        assert!(lines[0].starts_with("| tier"), "{s}");
        assert!(lines[1].starts_with("|--"), "{s}");
        assert!(lines[2].ends_with("|    77 |"), "{s}");
        assert!(lines[3].ends_with("| 13080 |"), "{s}");
    }
}
