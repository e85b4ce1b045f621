fn main() {
    for t in std::env::args().skip(1) {
        let m = relattn_matrices::load(&t).unwrap_or_else(|e| panic!("{e}"));
        let x = m.expand().unwrap_or_else(|e| panic!("{e}"));
        let fl: f64 = x.cases.iter().map(|c| c.flops()).sum();
        let maxh = x.cases.iter().map(|c| c.spec.num_heads).max().unwrap();
        let maxk = x.cases.iter().map(|c| c.max_kv_len()).max().unwrap();
        let maxf = x.cases.iter().map(|c| c.flops()).fold(0.0, f64::max);
        let mem = x.cases.iter().map(|c| c.cache_elements()).max().unwrap();
        println!("{t}: cases {} skipped {} trials {:?} flops {:.3} GF (max case {:.3} GF) maxH {maxh} maxLk {maxk} max cache elems {:.2e}",
            x.cases.len(), x.skipped.len(), x.trials_per_path(), fl / 1e9, maxf / 1e9, mem as f64);
        if std::env::var("V").is_ok() {
            for c in &x.cases { println!("  {} {} {:.1} MF", c.id, c.name, c.flops() / 1e6); }
        }
    }
}
