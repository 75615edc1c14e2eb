//! Measurement aid (bench/lanegrant/run): `create_loop MOUNT_DIR DIRS N
//! ring|lease [unlink]` attaches to the inkfs mount MOUNT_DIR is on as an API
//! client and, in each of DIRS new directories made through the mount
//! under MOUNT_DIR, makes N empty files with `Client::ns` creates
//! (O_CREAT|O_WRONLY, as a program's open does): `ring` asks the server
//! for each (today's path), `lease` asks for the directory's lease and a
//! lane with its first create (`Client::ns_dir_lease`), so the others run
//! in this process (docs/KERNEL-FREE.md, "Built: lane grants and the
//! client's creates end to end"). Prints one line: the mode, the creates
//! timed, the wall and CPU ns per create, and how many ran here. The
//! directories' first creates (the grant's, in `lease`) are not timed.
//! With `unlink`, each directory's files (but the first) are then removed
//! with `Client::ns` unlinks, timed apart, and a second line says the
//! same of them (docs/KERNEL-FREE.md, "Built: client-local removals on the
//! wire": under the lease they run here too).
use inkfs::api::client;
use inkfs::api::ns::Op;
use inkfs::api::Credentials;
use std::os::unix::fs::MetadataExt;

fn cpu_ns() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 * 1e9 + v.tv_usec as f64 * 1e3;
    t(u.ru_utime) + t(u.ru_stime)
}

fn main() {
    let usage = "usage: create_loop MOUNT_DIR DIRS N ring|lease [unlink]";
    let mut args = std::env::args().skip(1);
    let base = std::path::PathBuf::from(args.next().expect(usage));
    let dirs: u64 = args.next().and_then(|s| s.parse().ok()).expect(usage);
    let n: u64 = args.next().and_then(|s| s.parse().ok()).expect(usage);
    let lease = match args.next().as_deref() {
        Some("lease") => true,
        Some("ring") => false,
        _ => panic!("{usage}"),
    };
    let unlinks = match args.next().as_deref() {
        Some("unlink") => true,
        None => false,
        _ => panic!("{usage}"),
    };
    let c = client::attach(&base).expect("attach");
    let root = Credentials::root();
    let create = |dir: u64, i: u64| Op::Create {
        dir,
        name: format!("f{i}").into_bytes(),
        mode: 0o644,
        flags: libc::O_CREAT | libc::O_WRONLY,
    };
    let (mut wall, mut cpu, mut timed) = (0f64, 0f64, 0u64);
    let (mut rm_wall, mut rm_cpu) = (0f64, 0f64);
    for k in 0..dirs {
        let path = base.join(format!("{}{k}", if lease { "lease" } else { "ring" }));
        std::fs::create_dir(&path).expect("mkdir through the mount");
        let dir = std::fs::metadata(&path).expect("stat").ino();
        let first = if lease {
            c.ns_dir_lease(&root, create(dir, 0))
        } else {
            c.ns(&root, create(dir, 0))
        };
        assert_eq!(first.expect("asked").errno, 0);
        let (t, u) = (std::time::Instant::now(), cpu_ns());
        for i in 1..n {
            let d = c.ns(&root, create(dir, i)).expect("asked");
            assert_eq!(d.errno, 0);
        }
        wall += t.elapsed().as_nanos() as f64;
        cpu += cpu_ns() - u;
        timed += n - 1;
        if unlinks {
            let (t, u) = (std::time::Instant::now(), cpu_ns());
            for i in 1..n {
                let op = Op::Unlink {
                    dir,
                    name: format!("f{i}").into_bytes(),
                };
                assert_eq!(c.ns(&root, op).expect("asked").errno, 0);
            }
            rm_wall += t.elapsed().as_nanos() as f64;
            rm_cpu += cpu_ns() - u;
        }
    }
    println!(
        "{} creates {timed} wall_ns {:.0} cpu_ns {:.0} local {}",
        if lease { "lease" } else { "ring" },
        wall / timed as f64,
        cpu / timed as f64,
        c.local_creates()
    );
    if unlinks {
        println!(
            "{} unlinks {timed} wall_ns {:.0} cpu_ns {:.0} local {}",
            if lease { "lease" } else { "ring" },
            rm_wall / timed as f64,
            rm_cpu / timed as f64,
            c.local_removals()
        );
    }
}
