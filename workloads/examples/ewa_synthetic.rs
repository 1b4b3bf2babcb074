//! Writes a synthetic Extreme Weather year file (the published HDF5 layout):
//! `cargo run --release -p roofline-workloads --example ewa_synthetic -- OUT.h5 [N] [H] [W] [SEED]`
//! (default 8 images of 96 × 144).

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let Some(out) = a.get(1) else {
        eprintln!("usage: ewa_synthetic OUT.h5 [N] [H] [W] [SEED]");
        std::process::exit(2);
    };
    let num = |i: usize, d: u64| -> u64 {
        a.get(i).map_or(Ok(d), |s| s.parse()).unwrap_or_else(|_| {
            eprintln!("argument {i} ({}) is not a whole number", a[i]);
            std::process::exit(2)
        })
    };
    let (n, h, w, seed) = (num(2, 8), num(3, 96), num(4, 144), num(5, 1));
    if let Err(e) = roofline_workloads::ewa_data::write_synthetic(
        std::path::Path::new(out),
        n as usize,
        h as usize,
        w as usize,
        seed,
    ) {
        eprintln!("{e}");
        std::process::exit(1);
    }
    println!("wrote {out}: {n} images of 16 × {h} × {w}");
}
