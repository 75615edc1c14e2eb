//! The preload library (crates/inkfs-preload, docs/KERNEL-FREE.md "Built:
//! the preload library") on real mounts: unmodified programs run under
//! `LD_PRELOAD=libinkfs_preload.so` give the output they give without it,
//! their reads are served from the pool (the library's own counters,
//! `INKFS_PRELOAD_STATS`, tell served from forwarded), data written
//! through the mount is seen at the next call and the reverse, offsets are
//! shared across fork and dup and survive exec, and a mount that refuses
//! the library (posix mode) or a path elsewhere runs as without it.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::preload::*;
use common::*;

/// A tree of files, directories, a symlink, a tar and an SQLite database.
fn populate(m: &Mounted) {
    require_tool("sqlite3", "sqlite3");
    let mnt = m.path().display();
    sh(&format!(
        "cd {mnt} && seq 1 30000 > nums && head -c 1100000 /dev/urandom > big \
         && mkdir -p tree/sub/deeper && for i in $(seq 1 40); do seq $i 3 400 > tree/f$i; done \
         && for i in 1 2 3; do echo deep $i > tree/sub/deeper/d$i; done \
         && ln -s nums link && ln -s tree/sub dirlink \
         && tar cf t.tar tree \
         && sqlite3 db 'create table t(a integer, b text); insert into t values (1, \"one\"), (2, \"two\");'"
    ));
}

const PY_READER: &str = r#"
import os, sys
m = sys.argv[1]
print(sorted(os.listdir(m)))
st = os.stat(m + "/nums"); print(st.st_size, st.st_ino, oct(st.st_mode), st.st_nlink, st.st_blocks)
print(os.lstat(m + "/link").st_size, os.readlink(m + "/link"))
with open(m + "/nums") as f:
    data = f.read()
print(len(data), data[-20:].split())
with open(m + "/big", "rb") as f:
    f.seek(4000); a = f.read(300); f.seek(-7, 2); b = f.read(); print(a.hex()[:40], b.hex(), f.tell())
print(os.path.exists(m + "/nope"), os.path.isdir(m + "/tree"), os.path.islink(m + "/link"))
for e in sorted(os.scandir(m + "/tree"), key=lambda e: e.name):
    print(e.name, e.is_dir(), e.inode(), e.stat().st_size)
for root, dirs, files in os.walk(m):
    print(root[len(m):], sorted(dirs), sorted(files))
"#;

#[test]
fn tools_give_the_same_output_with_reads_served_from_the_pool() {
    require_tool("tar", "tar");
    let pool = Pool::new("preload-tools", 256);
    let m = Mounted::new(&pool, "mode=strict");
    populate(&m);
    let mnt = m.path().display().to_string();
    let out = tempfile::tempdir().expect("tempdir");
    let o = out.path().display();
    let py = out.path().join("reader.py");
    std::fs::write(&py, PY_READER).expect("write script");
    let stats = stats_file("tools");
    let s = stats.path();
    let scripts = [
        format!("cat {mnt}/big | sha256sum"),
        format!("cat {mnt}/nums {mnt}/tree/f7 | wc"),
        format!("rm -f {o}/copy; cp {mnt}/big {o}/copy && sha256sum < {o}/copy"),
        format!("ls -l --full-time {mnt}"),
        format!("ls -laRi --full-time {mnt}/tree"),
        format!("du -a {mnt} | sort"),
        format!("wc {mnt}/nums {mnt}/tree/f3"),
        format!("cd {mnt} && sha256sum nums big tree/f1 tree/sub/deeper/d2"),
        format!("tar cf - -C {mnt} tree | sha256sum"),
        format!("rm -rf {o}/x && mkdir {o}/x && tar xf {mnt}/t.tar -C {o}/x && cd {o}/x && find . -type f | sort | xargs cat | sha256sum"),
        format!("grep -r 77 {mnt}/tree | sort"),
        format!("dd if={mnt}/big bs=4096 skip=3 count=5 status=none | sha256sum"),
        format!("stat -c '%n %s %b %B %f %u %g %h %i %d %Y %Z %F' {mnt}/nums {mnt}/link {mnt}/tree {mnt}/dirlink/"),
        format!("stat -L -c '%n %s %i' {mnt}/link"),
        format!("readlink {mnt}/link; test -r {mnt}/nums && test -x {mnt}/tree && ! test -e {mnt}/nope && echo ok"),
        format!("head -c 1000 {mnt}/nums | tail -n 3; tail -c 100 {mnt}/nums"),
        format!("find {mnt} | sort"),
        format!("cd {mnt}/tree && cat f1 sub/deeper/d1 ../nums | sha256sum && ls sub"),
        format!("{PYTHON} {} {mnt}", py.display()),
        format!("sqlite3 {mnt}/db 'select * from t order by a; pragma integrity_check;'"),
    ];
    for script in &scripts {
        same(script, s);
    }
    let n = counts(s);
    assert!(c(&n, "read_local") > 100, "reads not served: {n:?}");
    assert_eq!(c(&n, "read_kernel"), 0, "reads forwarded: {n:?}");
    assert!(c(&n, "dir_local") > 50, "listings not served: {n:?}");
    assert_eq!(c(&n, "dir_kernel"), 0, "listings forwarded: {n:?}");
    assert!(c(&n, "stat_local") > 50, "stats not served: {n:?}");
}

#[test]
fn writes_are_served_through_the_lease_and_read_back() {
    let pool = Pool::new("preload-writes", 64);
    let m = Mounted::new(&pool, "mode=strict");
    populate(&m);
    let mnt = m.path().display().to_string();
    let stats = stats_file("writes");
    let s = stats.path();
    // Shell redirections: > and >> (the shell's builtins write through
    // glibc's stdout, which the library never sees: fd 1 is the kernel's),
    // < and <& read.
    let script = format!(
        "cd {mnt} && echo one > r && echo two >> r && cat r && cat < r && wc -l < r \
         && exec 3< r && read -r x <&3 && echo \"first $x\" && cat <&3 \
         && printf 'abcdef' > o && exec 4<> o && head -c 2 <&4 && echo && echo XY >&4 && cat o"
    );
    let out = same(&script, s);
    assert_eq!(out, "one\ntwo\none\ntwo\n2\nfirst one\ntwo\nab\nabXY\nf");
    // SQLite writes through the client (pwrite under the lease), then
    // reads them back, served; a reader without the library sees them.
    let pre = sh_run(
        &format!("sqlite3 {mnt}/db \"insert into t values (3, 'three'); select count(*), max(b) from t;\""),
        Some(s),
    );
    assert!(pre.0, "{}", pre.2);
    assert_eq!(pre.1, "3|two\n");
    let plain = sh_run(
        &format!("sqlite3 {mnt}/db 'select b from t where a = 3'"),
        None,
    );
    assert_eq!(plain.1, "three\n");
    // A read-write descriptor: write at the library's offset, read back.
    let py = format!(
        "import os\nfd = os.open('{mnt}/rw', os.O_RDWR | os.O_CREAT, 0o644)\n\
         os.write(fd, b'0123456789')\nos.lseek(fd, 2, 0)\nprint(os.read(fd, 3))\n\
         os.write(fd, b'xy')\nprint(os.lseek(fd, 0, 1))\nos.lseek(fd, 0, 0)\nprint(os.read(fd, 100))\n\
         fa = os.open('{mnt}/rw', os.O_RDWR | os.O_APPEND)\nos.write(fa, b'END')\n\
         print(os.lseek(fa, 0, 1), os.pread(fa, 4, 9), os.read(fa, 9))\n\
         os.lseek(fa, 0, 0)\nprint(os.read(fa, 100))\n"
    );
    let out = sh_run(&format!("{PYTHON} -c \"{py}\""), Some(s));
    assert!(out.0, "{}", out.2);
    assert_eq!(
        out.1,
        "b'234'\n7\nb'01234xy789'\n13 b'9END' b''\nb'01234xy789END'\n"
    );
    assert_eq!(
        std::fs::read(m.p("rw")).expect("read back"),
        b"01234xy789END"
    );
    let n = counts(s);
    assert!(c(&n, "read_local") > 0, "{n:?}");
    assert!(c(&n, "write_local") >= 5, "{n:?}");
    assert_eq!(c(&n, "write_kernel"), 0, "{n:?}");
}

/// A preloaded process driven line by line: it answers each command with
/// one line starting with `@`.
struct Driven {
    child: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Driven {
    fn new(script: &str, arg: &Path, stats: &Path) -> Driven {
        let mut child = Command::new(PYTHON)
            .arg("-c")
            .arg(script)
            .arg(arg)
            .env("LD_PRELOAD", lib())
            .env("INKFS_PRELOAD_STATS", stats)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python");
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        Driven { child, out }
    }

    fn ask(&mut self, cmd: &str) -> String {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{cmd}").expect("send");
        stdin.flush().expect("flush");
        let mut line = String::new();
        self.out.read_line(&mut line).expect("answer");
        assert!(line.starts_with('@'), "{cmd}: {line:?}");
        line[1..].trim_end().to_string()
    }

    fn finish(mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().expect("wait").success());
    }
}

const PY_DRIVEN: &str = r#"
import os, sys
p = sys.argv[1]
fd = os.open(p, os.O_RDWR)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "read":
        os.lseek(fd, 0, 0); data = b""
        while True:
            b = os.read(fd, 3)
            if not b: break
            data += b
        ans = data.decode().replace("\n", "|")
    elif cmd[0] == "pread":
        ans = os.pread(fd, 100, int(cmd[1])).decode().replace("\n", "|")
    elif cmd[0] == "fsize":
        ans = str(os.fstat(fd).st_size)
    elif cmd[0] == "size":
        ans = str(os.stat(p).st_size)
    elif cmd[0] == "append":
        os.lseek(fd, 0, 2); os.write(fd, cmd[1].encode() + b"\n"); ans = "ok"
    print("@" + ans, flush=True)
"#;

#[test]
fn the_mount_and_the_library_see_each_others_writes_at_once() {
    for mode in ["strict", "sync"] {
        let pool = Pool::new(&format!("preload-coherence-{mode}"), 64);
        let m = Mounted::new(&pool, &format!("mode={mode}"));
        let f = m.p("shared");
        std::fs::write(&f, "a\n").expect("write");
        let stats = stats_file("coherence");
        let mut d = Driven::new(PY_DRIVEN, &f, stats.path());
        assert_eq!(d.ask("read"), "a|");
        // The mount appends: seen at the next call, no sleep.
        let mut w = std::fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .expect("open");
        w.write_all(b"b\n").expect("append");
        assert_eq!(d.ask("read"), "a|b|");
        assert_eq!(d.ask("fsize"), "4");
        assert_eq!(d.ask("size"), "4");
        // The library's process writes (through the kernel descriptor):
        // the mount and its own next read see it.
        assert_eq!(d.ask("append c"), "ok");
        assert_eq!(std::fs::read(&f).expect("read"), b"a\nb\nc\n");
        assert_eq!(d.ask("read"), "a|b|c|");
        // Overwrite in place and truncate through the mount.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&f)
            .expect("open");
        file.write_at(b"X", 0).expect("overwrite");
        assert_eq!(d.ask("pread 0"), "X|b|c|");
        file.set_len(2).expect("truncate");
        assert_eq!(d.ask("read"), "X|");
        assert_eq!(d.ask("fsize"), "2");
        d.finish();
        let n = counts(stats.path());
        assert!(c(&n, "read_local") >= 10, "{mode}: {n:?}");
        assert_eq!(c(&n, "read_kernel"), 0, "{mode}: {n:?}");
        assert!(c(&n, "stat_local") >= 3, "{mode}: {n:?}");
    }
}

const PY_FORK: &str = r#"
import os, sys, subprocess
m = sys.argv[1]
fd = os.open(m + "/nums", os.O_RDONLY)
print("first", os.read(fd, 6))
sys.stdout.flush()
pid = os.fork()
if pid == 0:
    print("child", os.read(fd, 6), os.lseek(fd, 0, 1), flush=True)
    fd3 = os.open(m + "/nums", os.O_RDONLY)
    print("child own", os.read(fd3, 4), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print("parent after child", os.read(fd, 6))
fd2 = os.dup(fd)
print("dup", os.read(fd2, 6), "orig", os.read(fd, 6))
fd4 = os.dup2(fd, 40)
print("dup2", os.read(fd4, 3), os.lseek(fd, 0, 1), os.lseek(fd2, 0, 1), os.lseek(fd4, 0, 1))
os.close(fd2)
os.set_inheritable(fd, True)
sys.stdout.flush()
subprocess.run(["sh", "-c", f"head -c 6 <&{fd}; echo"], close_fds=False)
print("after exec child", os.read(fd, 6), os.lseek(fd, 0, 1))
# subprocess (vfork and exec; the child closes every other descriptor):
# the parent's own descriptors keep their offsets.
g = os.open(m + "/nums", os.O_RDONLY)
print("g", os.read(g, 6))
subprocess.run(["true"])
print("g after spawn", os.read(g, 6))
# A close-on-exec descriptor passed as the child's stdin.
sys.stdout.flush()
subprocess.run(["head", "-c", "6"], stdin=g)
print()
print("g after child read", os.read(g, 6))
d = os.open(m + "/tree", os.O_RDONLY | os.O_DIRECTORY)
print(sorted(os.listdir(d)))
"#;

#[test]
fn offsets_are_shared_across_fork_and_dup_and_survive_exec() {
    let pool = Pool::new("preload-fork", 64);
    let m = Mounted::new(&pool, "mode=strict");
    populate(&m);
    let stats = stats_file("fork");
    let dir = tempfile::tempdir().expect("tempdir");
    let py = dir.path().join("fork.py");
    std::fs::write(&py, PY_FORK).expect("script");
    let out = same(
        &format!("{PYTHON} {} {}", py.display(), m.path().display()),
        stats.path(),
    );
    let want_head = "first b'1\\n2\\n3\\n'\nchild b'4\\n5\\n6\\n' 12\nchild own b'1\\n2\\n'\n\
        parent after child b'7\\n8\\n9\\n'\ndup b'10\\n11\\n' orig b'12\\n13\\n'\n\
        dup2 b'14\\n' 33 33 33\n15\n16\n\nafter exec child b'17\\n18\\n' 45\n\
        g b'1\\n2\\n3\\n'\ng after spawn b'4\\n5\\n6\\n'\n7\n8\n9\n\ng after child read b'10\\n11\\n'\n";
    assert!(out.starts_with(want_head), "{out}");
    let n = counts(stats.path());
    // The parent's reads before the exec (the child leaves by _exit,
    // without reporting; after the exec the descriptor is the kernel's).
    assert!(c(&n, "read_local") >= 5, "{n:?}");
    assert!(c(&n, "dir_local") > 0, "{n:?}");
}

const PY_THREADS: &str = r#"
import os, sys, threading, collections
p = sys.argv[1]
want = open(p, "rb").read()
errs = []
def whole():
    for _ in range(8):
        fd = os.open(p, os.O_RDONLY); parts = []
        while True:
            b = os.read(fd, 65536)
            if not b: break
            parts.append(b)
        if b"".join(parts) != want: errs.append("whole")
        if os.pread(fd, 4096, 4096 * 7) != want[4096 * 7:4096 * 8]: errs.append("pread")
        os.close(fd)
ts = [threading.Thread(target=whole) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
fd = os.open(p, os.O_RDONLY); got = collections.Counter(); lock = threading.Lock()
def shared():
    while True:
        b = os.read(fd, 4096)
        if not b: return
        with lock: got[b[:8]] += 1
ts = [threading.Thread(target=shared) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print("errors", errs, "records", len(got), "each once", all(v == 1 for v in got.values()))
"#;

#[test]
fn threads_read_at_once_and_share_one_offset_without_overlap() {
    let pool = Pool::new("preload-threads", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let recs: Vec<u8> = (0..1500)
        .flat_map(|i| format!("{i:08}").into_bytes().repeat(512))
        .collect();
    std::fs::write(m.p("recs"), &recs).expect("write");
    let stats = stats_file("threads");
    let (ok, out, err) = sh_run(
        &format!("{PYTHON} -c '{PY_THREADS}' {}", m.p("recs").display()),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    assert_eq!(out, "errors [] records 1500 each once True\n");
    let n = counts(stats.path());
    assert!(c(&n, "read_local") > 1000, "{n:?}");
}

#[test]
fn a_refused_mount_and_other_paths_run_as_without_the_library() {
    // Posix mode: the server refuses attach; everything goes to the kernel.
    let pool = Pool::new("preload-posix", 64);
    let m = Mounted::new(&pool, "mode=posix");
    populate(&m);
    let mnt = m.path().display().to_string();
    let stats = stats_file("posix");
    for script in [
        format!("cat {mnt}/big | sha256sum"),
        format!("ls -laR --full-time {mnt}/tree"),
        format!("stat -c '%n %s %i %F' {mnt}/nums {mnt}/tree"),
        format!("grep -r 77 {mnt}/tree | sort"),
        format!("printf 'ab\\n' > {mnt}/w && echo x >> {mnt}/w && cat {mnt}/w"),
    ] {
        same(&script, stats.path());
    }
    let n = counts(stats.path());
    assert_eq!(c(&n, "read_local"), 0, "{n:?}");
    assert_eq!(c(&n, "dir_local"), 0, "{n:?}");
    assert_eq!(c(&n, "stat_local"), 0, "{n:?}");
    assert!(
        c(&n, "attach_refused") > 0,
        "the refusal was not met: {n:?}"
    );

    // Not on any inkfs mount: nothing counted, same output.
    let other = stats_file("other");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().display();
    std::fs::write(dir.path().join("f"), "1\n2\n3\n").expect("write");
    same(
        &format!("cat {d}/f | sha256sum && ls -l --full-time {d} && stat -c '%s %i' {d}/f /etc/passwd && {PYTHON} -c 'import os; print(sorted(os.listdir(\"{d}\")))'"),
        other.path(),
    );
    let n = counts(other.path());
    assert!(
        n.values().all(|v| *v == 0),
        "calls off the mount were counted: {n:?}"
    );
    assert!(
        !std::fs::read_to_string(other.path())
            .unwrap_or_default()
            .is_empty(),
        "the library did not load"
    );
}

const PY_STALE: &str = r#"
import ctypes, os, sys
m, other = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
fd = os.open(m + "/nums", os.O_RDONLY)
print(os.read(fd, 4))
# Closed behind the library's back (as glibc closes inside fclose or
# freopen): the kernel hands the number out again.
libc.syscall(3, fd)  # SYS_close
fd2 = os.open(other, os.O_RDONLY)
print(fd2 == fd, os.read(fd2, 5), os.fstat(fd2).st_size)
f = open(m + "/nums", "rb", buffering=0)
print(f.read(4))
"#;

#[test]
fn a_number_the_kernel_hands_out_again_is_not_served_as_the_old_file() {
    let pool = Pool::new("preload-stale", 64);
    let m = Mounted::new(&pool, "mode=strict");
    populate(&m);
    let dir = tempfile::tempdir().expect("tempdir");
    let other = dir.path().join("other");
    std::fs::write(&other, "other file\n").expect("write");
    let py = dir.path().join("stale.py");
    std::fs::write(&py, PY_STALE).expect("script");
    let stats = stats_file("stale");
    let (ok, out, err) = sh_run(
        &format!(
            "{PYTHON} {} {} {}",
            py.display(),
            m.path().display(),
            other.display()
        ),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    assert_eq!(out, "b'1\\n2\\n'\nTrue b'other' 11\nb'1\\n2\\n'\n");
    assert!(c(&counts(stats.path()), "read_local") >= 2);
}

/// A C program's stdio on the mount (glibc's FILE reads with its internal
/// read: only the library's cookie FILE makes these reads served).
const C_STDIO: &str = r#"/* stdio on files under the mount: fopen r/r+/a+/w+, fgets, fread,
   fseek/ftell, fileno, fdopen, getline, fclose. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    char path[4096], buf[256];
    snprintf(path, sizeof path, "%s/nums", argv[1]);
    FILE *f = fopen(path, "r");
    if (!f) { perror("fopen"); return 1; }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) { perror("fstat"); return 1; }
    printf("fileno ok %d size %lld\n", fileno(f) > 2, (long long)st.st_size);
    fgets(buf, sizeof buf, f); printf("fgets %s", buf);
    fseek(f, 100, SEEK_SET); printf("ftell %ld ", ftell(f));
    size_t n = fread(buf, 1, 10, f); buf[n] = 0; printf("fread %zu [%s]\n", n, buf);
    fseek(f, -6, SEEK_END); n = fread(buf, 1, 100, f); buf[n] = 0; printf("tail [%s] eof %d\n", buf, feof(f));
    rewind(f);
    char *line = NULL; size_t cap = 0; int lines = 0;
    while (getline(&line, &cap, f) > 0) lines++;
    printf("lines %d\n", lines);
    free(line);
    fclose(f);

    snprintf(path, sizeof path, "%s/rw", argv[1]);
    f = fopen(path, "w+");
    fputs("hello world\n", f); fflush(f);
    rewind(f); fgets(buf, sizeof buf, f); printf("w+ %s", buf);
    fseek(f, 6, SEEK_SET); fputs("WORLD", f); fseek(f, 0, SEEK_SET);
    fgets(buf, sizeof buf, f); printf("r+ %s", buf);
    fclose(f);
    f = fopen(path, "a+");
    fputs("more\n", f); fseek(f, 0, SEEK_SET); n = fread(buf, 1, sizeof buf - 1, f); buf[n] = 0;
    printf("a+ [%s] ftell %ld\n", buf, ftell(f));
    fclose(f);
    int fd = open(path, O_RDONLY);
    lseek(fd, 6, SEEK_SET);
    f = fdopen(fd, "r");
    fgets(buf, sizeof buf, f); printf("fdopen %s", buf);
    printf("fileno same %d\n", fileno(f) == fd);
    fclose(f);
    printf("closed %d\n", fcntl(fd, F_GETFD) == -1);
    return 0;
}
"#;

#[test]
fn stdio_streams_are_served_and_fileno_is_the_descriptor() {
    require_tool("cc", "build-essential");
    let pool = Pool::new("preload-stdio", 64);
    let m = Mounted::new(&pool, "mode=strict");
    populate(&m);
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("stdio.c");
    let exe = dir.path().join("stdio");
    std::fs::write(&src, C_STDIO).expect("source");
    run(Command::new("cc").arg("-O2").arg("-o").arg(&exe).arg(&src));
    let stats = stats_file("stdio");
    let out = same(
        &format!("{} {}", exe.display(), m.path().display()),
        stats.path(),
    );
    assert!(
        out.starts_with("fileno ok 1 size 168894\nfgets 1\n"),
        "{out}"
    );
    assert!(
        out.ends_with("fdopen WORLD\nfileno same 1\nclosed 1\n"),
        "{out}"
    );
    let n = counts(stats.path());
    assert!(c(&n, "read_local") >= 10, "stdio reads not served: {n:?}");
    assert_eq!(c(&n, "read_kernel"), 0, "{n:?}");
}

#[test]
fn a_user_the_trust_rule_refuses_runs_through_the_mount() {
    require_tool("setpriv", "util-linux");
    // A strict mount whose pool is root's 0600: nobody may not have it.
    let pool = Pool::new("preload-trust", 64);
    let m = Mounted::new(&pool, "mode=strict");
    populate(&m);
    let mnt = m.path().display().to_string();
    let stats = stats_file("trust");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(stats.path(), std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let script = format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups sh -c \
         'cat {mnt}/nums | sha256sum; ls -l --full-time {mnt}/tree | head -5; stat -c \"%s %i\" {mnt}/nums'"
    );
    let out = same(&script, stats.path());
    assert_eq!(out.lines().count(), 7, "{out}");
    let n = counts(stats.path());
    assert!(c(&n, "attach_refused") > 0, "{n:?}");
    assert_eq!(
        c(&n, "read_local") + c(&n, "stat_local") + c(&n, "dir_local"),
        0,
        "{n:?}"
    );
}

/// A signal handler reading a served descriptor while its thread is in
/// the library (in the middle of a served pread).
const C_SIGNAL: &str = r#"/* A signal handler reads a served descriptor while the main thread is in
   the middle of served reads (often inside the library): the handler's
   reads must still advance one offset, byte after byte. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static int fd2;
static volatile int got;
static char seen[200000];

static void on_alarm(int sig) {
    (void)sig;
    if (got < (int)sizeof seen && read(fd2, &seen[got], 1) == 1) got++;
}

int main(int argc, char **argv) {
    char path[4096], buf[4096];
    snprintf(path, sizeof path, "%s/big", argv[1]);
    int fd = open(path, O_RDONLY);
    snprintf(path, sizeof path, "%s/nums", argv[1]);
    fd2 = open(path, O_RDONLY);
    int plain = open(path, O_RDONLY);
    if (fd < 0 || fd2 < 0 || plain < 0) { perror("open"); return 1; }
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 50}, {0, 50}};
    setitimer(ITIMER_REAL, &it, NULL);
    struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
    long rounds = 0;
    do {
        for (off_t o = 0; o < 1 << 20; o += 4096) {
            if (pread(fd, buf, sizeof buf, o) < 0) { perror("pread"); return 1; }
            if (lseek(fd, o, SEEK_SET) != o) { perror("lseek"); return 1; }
        }
        rounds++;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) < 400000000L);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    int n = got;
    static char want[200000];
    if (pread(plain, want, n, 0) != n) { perror("pread plain"); return 1; }
    printf("handler reads %s\n", n > 10 && memcmp(want, seen, n) == 0 ? "in order" : "OUT OF ORDER");
    printf("offset %s\n", lseek(fd2, 0, SEEK_CUR) == n ? "right" : "WRONG");
    fprintf(stderr, "%d handler reads, %ld rounds\n", n, rounds);
    return 0;
}
"#;

#[test]
fn a_signal_handler_reading_inside_the_library_keeps_the_offset() {
    require_tool("cc", "build-essential");
    let pool = Pool::new("preload-signal", 64);
    let m = Mounted::new(&pool, "mode=strict");
    populate(&m);
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("sig.c");
    let exe = dir.path().join("sig");
    std::fs::write(&src, C_SIGNAL).expect("source");
    run(Command::new("cc").arg("-O2").arg("-o").arg(&exe).arg(&src));
    let stats = stats_file("signal");
    let (ok, out, err) = sh_run(
        &format!("{} {}", exe.display(), m.path().display()),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    assert_eq!(out, "handler reads in order\noffset right\n", "{err}");
    assert!(c(&counts(stats.path()), "read_local") > 1000);
}

const PY_WRITER: &str = r#"
import os, sys
p = sys.argv[1]
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "write":
        ans = str(os.write(fd, cmd[1].encode()))
    elif cmd[0] == "pwrite":
        ans = str(os.pwrite(fd, cmd[2].encode(), int(cmd[1])))
    elif cmd[0] == "writev":
        ans = str(os.writev(fd, [c.encode() for c in cmd[1:]]))
    elif cmd[0] == "trunc":
        os.ftruncate(fd, int(cmd[1])); ans = "ok"
    elif cmd[0] == "fsync":
        os.fsync(fd); os.fdatasync(fd); ans = "ok"
    elif cmd[0] == "pos":
        ans = str(os.lseek(fd, 0, 1))
    elif cmd[0] == "seek":
        ans = str(os.lseek(fd, int(cmd[1]), 0))
    elif cmd[0] == "read":
        ans = os.pread(fd, 1000, 0).decode()
    elif cmd[0] == "unlinked":
        # An unlinked file still open (a placeholder the client holds):
        # its writes go on under the lease.
        u = p + ".gone"
        g = os.open(u, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.unlink(u)
        os.write(g, b"still"); os.write(g, b" here")
        ans = os.pread(g, 100, 0).decode() + ":" + str(os.lseek(g, 0, 1))
        os.close(g)
    print("@" + ans, flush=True)
"#;

#[test]
fn writes_from_the_pool_are_seen_by_the_mount_at_once() {
    for mode in ["strict", "sync"] {
        let pool = Pool::new(&format!("preload-wr-{mode}"), 64);
        let m = Mounted::new(&pool, &format!("mode={mode}"));
        let f = m.p("w");
        let stats = stats_file("wr");
        let mut d = Driven::new(PY_WRITER, &f, stats.path());
        let on_mount = || String::from_utf8(std::fs::read(&f).expect("read")).expect("utf8");
        let size = || std::fs::metadata(&f).expect("stat").len();
        // Each write is seen through the mount at once (no library in this
        // process: the server recalls the lease, then answers).
        assert_eq!(d.ask("write hello"), "5");
        assert_eq!(on_mount(), "hello");
        assert_eq!(d.ask("write ,world"), "6");
        assert_eq!(on_mount(), "hello,world");
        assert_eq!(size(), 11);
        assert_eq!(d.ask("pwrite 0 J"), "1");
        assert_eq!(d.ask("pos"), "11");
        assert_eq!(on_mount(), "Jello,world");
        assert_eq!(d.ask("writev ab cd e"), "5");
        assert_eq!(on_mount(), "Jello,worldabcde");
        // The mount writes in between: the library's next write takes the
        // lease again and lands after it.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&f)
            .expect("open")
            .write_all(b"[m]")
            .expect("append through the mount");
        assert_eq!(d.ask("seek 19"), "19");
        assert_eq!(d.ask("write Z"), "1");
        assert_eq!(on_mount(), "Jello,worldabcde[m]Z");
        assert_eq!(d.ask("trunc 5"), "ok");
        assert_eq!(on_mount(), "Jello");
        assert_eq!(size(), 5);
        assert_eq!(d.ask("trunc 8"), "ok");
        assert_eq!(on_mount(), "Jello\0\0\0");
        assert_eq!(d.ask("fsync"), "ok");
        assert_eq!(d.ask("read"), "Jello\0\0\0");
        assert_eq!(d.ask("pos"), "20");
        assert_eq!(d.ask("write !"), "1");
        assert_eq!(on_mount(), "Jello\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0!");
        let n = counts(stats.path());
        assert_eq!(n, BTreeMap::new(), "nothing reported before exit");
        assert_eq!(d.ask("unlinked"), "still here:10");
        d.finish();
        let n = counts(stats.path());
        // 5 writes, 2 truncates, 1 writev, 1 pwrite... (8 served calls),
        // and the unlinked file's 2: a held orphan is leased.
        assert_eq!(c(&n, "write_local"), 10, "{mode}: {n:?}");
        assert_eq!(c(&n, "sync_local"), 2, "{mode}: {n:?}");
        assert_eq!(c(&n, "write_kernel"), 0, "{mode}: {n:?}");
        drop(m);
        fsck_clean(&pool);
    }
}

/// The pool after its mount is gone: fsck finds nothing to repair.
const PY_APPENDER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
tag = sys.argv[2]
for i in range(int(sys.argv[3])):
    rec = "%s %05d %s\n" % (tag, i, tag.lower() * (i % 37))
    assert os.write(fd, rec.encode()) == len(rec)
"#;

/// Lines of `text` written by `tag`, checked whole and in order: how many.
fn records_of(text: &str, tag: &str) -> usize {
    let mut next = 0;
    for line in text.lines().filter(|l| l.starts_with(tag)) {
        let want = format!("{tag} {next:05} {}", tag.to_lowercase().repeat(next % 37));
        assert_eq!(line, want, "record {next} of {tag}");
        next += 1;
    }
    next
}

#[test]
fn appends_of_two_preloaded_processes_interleave_whole_records() {
    let pool = Pool::new("preload-append", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let dir = tempfile::tempdir().expect("tempdir");
    let py = dir.path().join("app.py");
    std::fs::write(&py, PY_APPENDER).expect("script");
    let stats = stats_file("append");
    let log = m.p("log");
    let (ok, _, err) = sh_run(
        &format!(
            "{PYTHON} {py} {log} A 300 & {PYTHON} {py} {log} B 300 & wait",
            py = py.display(),
            log = log.display()
        ),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    let text = std::fs::read_to_string(&log).expect("read through the mount");
    assert_eq!(text.lines().count(), 600);
    assert_eq!(records_of(&text, "A"), 300);
    assert_eq!(records_of(&text, "B"), 300);
    let n = counts(stats.path());
    assert_eq!(c(&n, "write_local"), 600, "{n:?}");
    assert_eq!(c(&n, "write_kernel"), 0, "{n:?}");
    // bash's > and >> (its builtins write through glibc's stdout: fd 1 is
    // the kernel's) from two preloaded shells at once, and > after >>.
    let b = m.p("b");
    let script = format!(
        "f={b}; : > $f; (for i in $(seq 1 200); do echo \"C $i\" >> $f; done) & \
         (for i in $(seq 1 200); do echo \"D $i\" >> $f; done) & wait; \
         grep -c '^C ' $f; grep -c '^D ' $f; grep '^C ' $f | cut -d' ' -f2 | sort -nc && echo sorted; \
         echo new > {b}2 && echo more >> {b}2 && cat {b}2; \
         {{ echo a; cat {b}2; echo b; }} > {b}3 && cat {b}3",
        b = b.display()
    );
    // bash (not sh: dash's builtins write with write(2), bash's with stdio).
    let file = dir.path().join("redir.sh");
    std::fs::write(&file, script).expect("script");
    let out = same(&format!("bash {}", file.display()), stats.path());
    assert_eq!(out, "200\n200\nsorted\nnew\nmore\na\nnew\nmore\nb\n");
}

#[test]
fn writes_share_one_offset_across_fork_and_dup() {
    let pool = Pool::new("preload-wfork", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("wfork");
    let py = format!(
        "import os\nfd = os.open('{f}', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n\
         os.write(fd, b'p1.')\npid = os.fork()\n\
         if pid == 0:\n    os.write(fd, b'c1.')\n    os.write(fd, b'c2.')\n    os._exit(0)\n\
         os.waitpid(pid, 0)\nos.write(fd, b'p2.')\nd = os.dup(fd)\nos.write(d, b'd1.')\n\
         e = os.dup2(fd, 30)\nos.write(e, b'e1.')\nprint(os.lseek(fd, 0, 1), os.lseek(d, 0, 1))\n\
         os.lseek(d, 0, 0)\nos.write(fd, b'P')\nprint(os.lseek(e, 0, 1))\n",
        f = m.p("wf").display()
    );
    let (ok, out, err) = sh_run(&format!("{PYTHON} -c \"{py}\""), Some(stats.path()));
    assert!(ok, "{err}");
    assert_eq!(out, "18 18\n1\n");
    assert_eq!(
        std::fs::read(m.p("wf")).expect("read"),
        b"P1.c1.c2.p2.d1.e1."
    );
    let n = counts(stats.path());
    // The parent's (the child leaves by _exit, without reporting).
    assert_eq!(c(&n, "write_local"), 5, "{n:?}");
}

#[test]
fn sqlite_writes_a_database_under_the_library_in_each_journal_mode() {
    require_tool("sqlite3", "sqlite3");
    let pool = Pool::new("preload-sqlite", 128);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("sqlite");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    for mode in ["delete", "truncate", "persist", "wal"] {
        let script = |db: &Path| {
            format!(
                "sqlite3 {db} 'pragma journal_mode={mode}; pragma synchronous=full; \
                 create table t(a integer primary key, b text); \
                 create index tb on t(b);' > /dev/null && \
                 for k in 1 2 3 4 5; do sqlite3 {db} \"begin; \
                 with recursive c(x) as (select 1 union all select x + 1 from c where x < 400) \
                 insert into t(b) select hex(randomblob(20 + x % 50)) from c; commit; \
                 delete from t where a % 7 = $k; update t set b = 'u' || b where a % 11 = $k;\" || exit 1; done",
                db = db.display()
            )
        };
        let check = |db: &Path| {
            format!(
                "sqlite3 {} 'pragma integrity_check; select count(*), sum(length(b)) > 0 from t; pragma journal_mode;'",
                db.display()
            )
        };
        // The same work off the mount, without the library: the rows it
        // leaves (the contents are random, the row count is not).
        let plain_db = elsewhere.path().join(format!("{mode}.db"));
        let (ok, _, err) = sh_run(&script(&plain_db), None);
        assert!(ok, "{mode}: {err}");
        let want = sh_run(&check(&plain_db), None).1;
        assert!(want.starts_with("ok\n"), "{mode}: {want}");
        let db = m.p(&format!("{mode}.db"));
        let (ok, _, err) = sh_run(&script(&db), Some(stats.path()));
        assert!(ok, "{mode}: {err}");
        // Without the library: the database as the writer left it.
        let (ok, out, err) = sh_run(&check(&db), None);
        assert!(ok, "{mode}: {err}");
        assert_eq!(out, want, "{mode}");
    }
    let n = counts(stats.path());
    assert!(c(&n, "write_local") > 100, "{n:?}");
    assert_eq!(c(&n, "write_kernel"), 0, "{n:?}");
    assert!(c(&n, "sync_local") > 10, "{n:?}");
}

const PY_KILLED: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
i = 0
while True:
    rec = "%08d %s\n" % (i, "x" * (i % 300))
    os.write(fd, rec.encode())
    os.write(1, b"%d\n" % i)
    i += 1
"#;

#[test]
fn a_preloaded_writer_killed_mid_loop_leaves_its_acknowledged_records() {
    for mode in ["strict", "sync"] {
        let pool = Pool::new(&format!("preload-kill-{mode}"), 64);
        let m = Mounted::new(&pool, &format!("mode={mode}"));
        let f = m.p("k");
        let mut child = Command::new(PYTHON)
            .arg("-c")
            .arg(PY_KILLED)
            .arg(&f)
            .env("LD_PRELOAD", lib())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut acked = 0u64;
        let mut line = String::new();
        while acked < 2000 {
            line.clear();
            assert!(out.read_line(&mut line).expect("ack") > 0, "writer ended");
            acked = line.trim().parse().expect("number");
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("wait");
        // Everything acknowledged is there, whole and in order; at most
        // one record more (written, not yet acknowledged).
        let text = std::fs::read_to_string(&f).expect("read through the mount");
        let mut n = 0u64;
        for l in text.lines() {
            assert_eq!(
                l,
                format!("{n:08} {}", "x".repeat((n % 300) as usize)),
                "{mode}"
            );
            n += 1;
        }
        assert!(text.ends_with('\n'), "{mode}: a torn last record");
        assert!(n > acked, "{mode}: {n} records, {acked} acknowledged");
        // The reader gets the rest of the acknowledgements (the pipe keeps
        // them): nothing beyond the file's records was acknowledged.
        let rest: Vec<u64> = out
            .lines()
            .map(|l| l.expect("line").trim().parse().expect("number"))
            .collect();
        let last = rest.last().copied().unwrap_or(acked);
        assert!(last < n, "{mode}: {last} acknowledged, {n} records");
        assert!(
            n <= last + 2,
            "{mode}: {n} records, last acknowledged {last}"
        );
        drop(m);
        fsck_clean(&pool);
    }
}

/// redis-server (its allocator, jemalloc, is initialized by another
/// library's constructor before the library's own and calls readlink
/// under its lock: it deadlocked when the library served that call)
/// logging every SET to its append-only file, fsync always, served.
#[test]
fn redis_server_appends_and_fsyncs_under_the_library() {
    require_tool("redis-server", "redis-server");
    require_tool("redis-cli", "redis-tools");
    let pool = Pool::new("preload-redis", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let dir = m.p("r");
    std::fs::create_dir(&dir).expect("mkdir");
    let stats = stats_file("redis");
    // A port the kernel says is free now (one derived from the pid could
    // be another program's, and redis then never answers).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut server = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .arg("--dir")
        .arg(&dir)
        .args([
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ])
        .args(["--daemonize", "no", "--logfile", ""])
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    let cli = |args: &[&str]| {
        Command::new("timeout")
            .args(["10", "redis-cli", "-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli")
    };
    let t = std::time::Instant::now();
    while cli(&["ping"]).stdout != b"PONG\n" {
        if t.elapsed() > inkfs::testkit::WAIT_LIMIT {
            let _ = server.kill();
            let _ = server.wait();
            panic!("redis-server never answered (deadlocked at start?)");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    for i in 0..50 {
        assert_eq!(
            cli(&["set", &format!("key{i}"), &format!("value{i}")]).stdout,
            b"OK\n"
        );
    }
    let _ = cli(&["shutdown"]);
    assert!(server.wait().expect("wait").success());
    // Without the library: every SET is in the append-only file.
    let (ok, out, err) = sh_run(
        &format!("cat {}/appendonlydir/*.incr.aof", dir.display()),
        None,
    );
    assert!(ok, "{err}");
    for i in 0..50 {
        assert!(out.contains(&format!("value{i}\r\n")), "value{i} missing");
    }
    let n = counts(stats.path());
    assert!(c(&n, "write_local") >= 50, "{n:?}");
    assert!(c(&n, "sync_local") >= 50, "{n:?}");
}

const PY_THREAD_WRITERS: &str = r#"
import os, sys, threading
m = sys.argv[1]
# Four threads pwrite their own 4 KiB blocks of one file, and append
# records to one shared O_APPEND descriptor, and write through one shared
# offset: every write through the one client of the process.
fd = os.open(m + "/blocks", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
log = os.open(m + "/log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
seq = os.open(m + "/seq", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
def work(t):
    for i in range(200):
        b = ("%d:%04d|" % (t, i)).encode().ljust(4096, b".")
        os.pwrite(fd, b, (i * 4 + t) * 4096)
        os.write(log, b"%d %04d\n" % (t, i))
        os.write(seq, b"%d%04d\n" % (t, i))
    os.fsync(fd)
ts = [threading.Thread(target=work, args=(t,)) for t in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
print(os.fstat(fd).st_size, os.lseek(seq, 0, 1))
"#;

#[test]
fn threads_write_one_file_at_once() {
    let pool = Pool::new("preload-twrite", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let stats = stats_file("twrite");
    let (ok, out, err) = sh_run(
        &format!("{PYTHON} -c '{PY_THREAD_WRITERS}' {}", m.path().display()),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    assert_eq!(out, format!("{} {}\n", 800 * 4096, 800 * 6));
    let blocks = std::fs::read(m.p("blocks")).expect("read");
    for t in 0..4 {
        for i in 0..200 {
            let at = (i * 4 + t) * 4096;
            let head = format!("{t}:{i:04}|");
            assert_eq!(
                &blocks[at..at + head.len()],
                head.as_bytes(),
                "block {t}/{i}"
            );
        }
    }
    let log = std::fs::read_to_string(m.p("log")).expect("read");
    let seq = std::fs::read_to_string(m.p("seq")).expect("read");
    for t in 0..4 {
        let mine: Vec<&str> = log
            .lines()
            .filter(|l| l.starts_with(&format!("{t} ")))
            .collect();
        let want: Vec<String> = (0..200).map(|i| format!("{t} {i:04}")).collect();
        assert_eq!(mine, want, "thread {t}'s records");
        let mine: Vec<&str> = seq
            .lines()
            .filter(|l| l.starts_with(&t.to_string()))
            .collect();
        let want: Vec<String> = (0..200).map(|i| format!("{t}{i:04}")).collect();
        assert_eq!(mine, want, "thread {t}'s records through the shared offset");
    }
    assert_eq!(log.lines().count(), 800);
    assert_eq!(seq.lines().count(), 800);
    // Every write is served by the process's one client, which holds the
    // inode's lease: no thread waits for another's call to end, none goes
    // through the kernel.
    let n = counts(stats.path());
    assert_eq!(c(&n, "write_local"), 2400, "{n:?}");
    assert_eq!(c(&n, "write_kernel"), 0, "{n:?}");
}

/// N 4 KiB O_APPEND writes, each followed by fdatasync (issue 16's
/// durable append), then exit.
const PY_DURABLE_APPENDS: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
rec = b"x" * 4096
for i in range(int(sys.argv[2])):
    os.write(fd, rec)
    os.fdatasync(fd)
os.close(fd)
"#;

/// The system calls a preloaded run of [`PY_DURABLE_APPENDS`] makes (all
/// its threads: strace -f), from strace's summary.
fn syscalls_of_appends(script: &Path, file: &Path, n: u32, stats: &Path) -> u64 {
    let out = tempfile::NamedTempFile::new().expect("strace output");
    let st = Command::new("strace")
        .args(["-f", "-c", "-o"])
        .arg(out.path())
        .arg(PYTHON)
        .arg(script)
        .arg(file)
        .arg(n.to_string())
        .env("LD_PRELOAD", lib())
        .env("INKFS_PRELOAD_STATS", stats)
        .status()
        .expect("strace (Debian package strace) runs");
    assert!(st.success(), "the preloaded appends failed under strace");
    let text = std::fs::read_to_string(out.path()).expect("strace summary");
    // "100.00    0.001234           1      1234        56 total": calls is
    // the fourth column (errors, the fifth, may be empty).
    let total = text
        .lines()
        .find(|l| l.trim_end().ends_with(" total"))
        .unwrap_or_else(|| panic!("no total in strace's summary: {text}"));
    total
        .split_whitespace()
        .nth(3)
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no call count in {total:?}"))
}

/// The served durable append makes no system call (issue 16: none on the
/// data path): a run of 2050 write + fdatasync pairs makes about as many
/// calls as a run of 50 (the difference is the reservation's refills
/// ahead, a few calls per 1024 blocks, and the process's own start-up
/// noise), where the kernel path would make 4000 more.
#[test]
fn a_served_durable_append_makes_no_system_call() {
    let pool = Pool::new("preload-nosyscall", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let dir = tempfile::tempdir().expect("tempdir");
    let py = dir.path().join("appends.py");
    std::fs::write(&py, PY_DURABLE_APPENDS).expect("script");
    let stats = stats_file("nosyscall");
    let few = syscalls_of_appends(&py, &m.p("few"), 50, stats.path());
    let many = syscalls_of_appends(&py, &m.p("many"), 2050, stats.path());
    let n = counts(stats.path());
    assert_eq!(c(&n, "write_local"), 2100, "{n:?}");
    assert_eq!(c(&n, "sync_local"), 2100, "{n:?}");
    assert_eq!(c(&n, "write_kernel"), 0, "{n:?}");
    let extra = many.saturating_sub(few);
    assert!(
        extra < 100,
        "2000 more served appends made {extra} more system calls ({few} → {many})"
    );
    assert_eq!(
        std::fs::metadata(m.p("many")).expect("stat").len(),
        2050 * 4096
    );
    drop(m);
    fsck_clean(&pool);
}

/// write, pwrite and pread of 4096 bytes with a buffer of which only the
/// first 100 bytes are mapped (the next page PROT_NONE), each in a forked
/// child on a file of 16 KiB the parent wrote: `OP RET ERRNO`, or `OP
/// signal N` if the child died of a signal.
const C_BAD_BUFFER: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    long pg = sysconf(_SC_PAGESIZE);
    char *m = mmap(0, 2 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || mprotect(m + pg, pg, PROT_NONE)) { perror("mmap"); return 1; }
    memset(m, 'x', pg);
    char *bad = m + pg - 100;
    int fd = open(argv[1], O_RDWR | O_CREAT, 0644);
    if (fd < 0) { perror(argv[1]); return 1; }
    char page[4096];
    memset(page, 'y', sizeof page);
    for (int i = 0; i < 4; i++)
        if (pwrite(fd, page, sizeof page, i * 4096) != 4096) { perror("fill"); return 1; }
    close(fd);
    const char *ops[] = {"write", "pwrite", "pread"};
    for (int k = 0; k < 3; k++) {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            fd = open(argv[1], O_RDWR);
            if (fd < 0) { perror(argv[1]); _exit(2); }
            ssize_t r;
            errno = 0;
            if (k == 0) r = write(fd, bad, 4096);
            else if (k == 1) r = pwrite(fd, bad, 4096, 8192);
            else r = pread(fd, bad, 4096, 0);
            printf("%s %zd %d\n", ops[k], r, r < 0 ? errno : 0);
            fflush(stdout);
            _exit(0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 1; }
        if (WIFSIGNALED(st)) printf("%s signal %d\n", ops[k], WTERMSIG(st));
        else if (WEXITSTATUS(st)) printf("%s exit %d\n", ops[k], WEXITSTATUS(st));
    }
    return 0;
}
"#;

/// A documented limit (docs/KERNEL-FREE.md, "Built: ... a bad buffer"):
/// a served read or write whose user buffer is partly unmapped dies of
/// SIGSEGV in the library's copy, where the kernel (this mount without
/// the library) copies up to the fault and returns the short count.
/// Pinned here so that a fix (a fault-tolerant copy) changes this test
/// with the docs.
#[test]
fn a_buffer_partly_unmapped_is_the_kernels_short_count_and_the_librarys_sigsegv() {
    require_tool("cc", "build-essential");
    let pool = Pool::new("preload-badbuf", 64);
    let m = Mounted::new(&pool, "mode=strict");
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path().join("bad.c");
    let exe = dir.path().join("bad");
    std::fs::write(&src, C_BAD_BUFFER).expect("source");
    run(Command::new("cc").arg("-O2").arg("-o").arg(&exe).arg(&src));
    let (ok, out, err) = sh_run(&format!("{} {}", exe.display(), m.p("k").display()), None);
    assert!(ok, "{err}");
    assert_eq!(out, "write 100 0\npwrite 100 0\npread 100 0\n", "{err}");
    let stats = stats_file("badbuf");
    let (ok, out, err) = sh_run(
        &format!("{} {}", exe.display(), m.p("l").display()),
        Some(stats.path()),
    );
    assert!(ok, "{err}");
    assert_eq!(
        out, "write signal 11\npwrite signal 11\npread signal 11\n",
        "{err}"
    );
    // Served (the parent's four writes; the children _exit or die
    // uncounted), not the kernel's.
    let n = counts(stats.path());
    assert!(c(&n, "write_local") >= 4, "{n:?}");
    assert_eq!(c(&n, "write_kernel"), 0, "{n:?}");
    drop(m);
    fsck_clean(&pool);
}
