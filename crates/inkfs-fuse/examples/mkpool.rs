//! `cargo run --example mkpool -- POOL SIZE_MIB`: format a pool (until the
//! CLI has `inkfs mkfs`).
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(path), Some(mib)) = (
        args.first(),
        args.get(1).and_then(|s| s.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: mkpool POOL SIZE_MIB");
        std::process::exit(2)
    };
    let opts = inkfs::pmem::PoolOpenOptions {
        create_size_bytes: Some(mib << 20),
        read_only: false,
    };
    let pm = inkfs::pmem::MappedPool::open(std::path::Path::new(path), &opts).expect("open pool");
    inkfs::Fs::format(&pm, &inkfs::types::FormatOptions::default()).expect("format");
}
