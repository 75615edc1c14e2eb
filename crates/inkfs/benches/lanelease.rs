//! A client engine's create and unlink under a lane lease against the
//! owner's, in one pool, interleaved (docs/KERNEL-FREE.md, "Built: the
//! engine's namespace under a lane lease", "Built: a client's removals in
//! the engine").
//!
//! `cargo bench -p inkfs --bench lanelease [-- --quick]`
//!
//! The owner is the mounted engine; the client an engine attached to a
//! second mapping of the same pool file (`Fs::attach_client`), as another
//! process has it; both use one readers' epoch table, as a mount with
//! clients attached does (so the owner's unlink turns the inode ORPHAN
//! and scans the holds, as the client's does). Each round: the owner
//! creates `CHUNK` files (create and close) in its directory, timed, then
//! unlinks them, timed; the client is granted a lane (`CHUNK` slots), a
//! reservation and its directory's lease, creates `CHUNK` files there,
//! timed, unlinks them (`Fs::client_unlink`), timed, and gives everything
//! back (not timed); the order of the two alternates by round. Printed:
//! the median over rounds of each one's mean, and the median of the
//! rounds' own ratios client ÷ owner.

use std::path::PathBuf;
use std::time::Instant;

use inkfs::pmem::{MappedPool, PoolOpenOptions};
use inkfs::testkit::median;
use inkfs::types::*;
use inkfs::Fs;

const POOL_BYTES: u64 = 1 << 30;
/// Creates per timed chunk (one grant's slots).
const CHUNK: usize = 250;

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let rounds = if quick { 10 } else { 40 };
    let dir = std::env::var("INKFS_BENCH_DIR").unwrap_or_else(|_| "/dev/shm".into());
    let pool = PathBuf::from(format!(
        "{dir}/inkfs-bench-lanelease-{}.pool",
        std::process::id()
    ));
    let r = run(&pool, rounds);
    let _ = std::fs::remove_file(&pool);
    if let Err(e) = r {
        eprintln!("lanelease bench: {e}");
        std::process::exit(1);
    }
}

fn run(pool: &std::path::Path, rounds: usize) -> Result<(), String> {
    let s = |e: inkfs::Error| e.to_string();
    let pm = MappedPool::open(
        pool,
        &PoolOpenOptions {
            create_size_bytes: Some(POOL_BYTES),
            read_only: false,
        },
    )
    .map_err(|e| e.to_string())?;
    inkfs::pmem::prefault(&pm);
    Fs::format(&pm, &FormatOptions::default()).map_err(s)?;
    let owner = Fs::mount(pm, MountOptions::default()).map_err(s)?;
    let file = owner
        .pmem()
        .pool_file()
        .try_clone()
        .map_err(|e| e.to_string())?;
    let rw = PoolOpenOptions {
        create_size_bytes: None,
        read_only: false,
    };
    let client = Fs::attach_client(
        MappedPool::map(file, &rw).map_err(|e| e.to_string())?,
        Mode::Strict,
    )
    .map_err(s)?;
    let table = inkfs::epoch::EpochTable::new_shared();
    owner.share_epochs(table.clone());
    let own = table.claim_index().ok_or("no epoch slot")?;
    client.client_use_epochs(table.clone(), own);
    let od = owner.mkdir(1, b"owner", 0o755, 0, 0).map_err(s)?.ino;
    let cd = owner.mkdir(1, b"client", 0o755, 0, 0).map_err(s)?.ino;
    let lane = owner.geometry().lane_count - 1;
    println!("{rounds} rounds x {CHUNK} creates and unlinks each, alternating");

    let (mut owner_ns, mut client_ns, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let (mut owner_rm, mut client_rm, mut rm_ratios) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let names: Vec<Vec<u8>> = (0..CHUNK)
            .map(|i| format!("r{r}-{i}").into_bytes())
            .collect();
        let owner_run = || -> Result<(f64, f64), String> {
            let t = Instant::now();
            for n in &names {
                let (_, fh) = owner.create(od, n, 0o644, 0, 0).map_err(s)?;
                owner.release(fh);
            }
            let create = t.elapsed().as_nanos() as f64 / CHUNK as f64;
            let t = Instant::now();
            for n in &names {
                owner.unlink(od, n).map_err(s)?;
            }
            Ok((create, t.elapsed().as_nanos() as f64 / CHUNK as f64))
        };
        let client_run = || -> Result<(f64, f64), String> {
            let g = owner.lease_lane(lane, CHUNK).map_err(s)?;
            client.client_take_lane(&g).map_err(s)?;
            let reserved = owner.reserve_blocks(CHUNK as u64, 64);
            client.add_reservation(&reserved).map_err(s)?;
            client.client_lease_dir(cd).map_err(s)?;
            let t = Instant::now();
            for n in &names {
                let _w = client.client_writes();
                let (_, fh) = client.create(cd, n, 0o644, 0, 0).map_err(s)?;
                client.release(fh);
            }
            let ns = t.elapsed().as_nanos() as f64 / CHUNK as f64;
            let t = Instant::now();
            for n in &names {
                let _w = client.client_writes();
                match client.client_unlink(None, cd, n, &|_| true).map_err(s)? {
                    inkfs::rmlocal::ClientUnlink::Freed => {}
                    other => return Err(format!("client unlink: {other:?}")),
                }
            }
            let rm = t.elapsed().as_nanos() as f64 / CHUNK as f64;
            client.client_give_back_dir(cd);
            let ret = client.client_give_back_lane().map_err(s)?;
            owner.free_unused_blocks(&client.drain_reservation());
            owner.return_blocks(&client.take_client_freed());
            owner.settle_dir(cd).map_err(s)?;
            owner.take_back_lane(&ret).map_err(s)?;
            Ok((ns, rm))
        };
        let (o, c) = if r % 2 == 0 {
            let o = owner_run()?;
            (o, client_run()?)
        } else {
            let c = client_run()?;
            (owner_run()?, c)
        };
        owner_ns.push(o.0);
        client_ns.push(c.0);
        ratios.push(c.0 / o.0);
        owner_rm.push(o.1);
        client_rm.push(c.1);
        rm_ratios.push(c.1 / o.1);
    }
    println!("\n{:<44} {:>10}", "operation", "ns (med)");
    println!(
        "{:<44} {:>10.0}",
        "owner: create + close",
        median(&owner_ns)
    );
    println!(
        "{:<44} {:>10.0}",
        "client under a lane lease: create + close",
        median(&client_ns)
    );
    println!("{:<44} {:>10.0}", "owner: unlink", median(&owner_rm));
    println!(
        "{:<44} {:>10.0}",
        "client under a lane lease: unlink",
        median(&client_rm)
    );
    for (what, r) in [("create", &ratios), ("unlink", &rm_ratios)] {
        let lo = r.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = r.iter().cloned().fold(0.0, f64::max);
        println!(
            "{what}: client / owner {:.2}x (median of the rounds' own ratios; range {lo:.2}-{hi:.2})",
            median(r)
        );
    }
    Ok(())
}
