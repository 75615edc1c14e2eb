//! `inkfs scrub`, the server side. The pool belongs to the server process,
//! so a scrub runs there: a client asks on the statistics socket with the
//! request word `scrub`, and a thread of the server runs `Filesystem::scrub`
//! (one at a time per mount) and streams progress and the result back.
//!
//! Wire protocol, after the client's `scrub\n`: lines of UTF-8 text.
//!
//! ```text
//! progress DONE TOTAL            inode slots; at most every 100 ms, and at the end
//! problem REASON INODE|- MESSAGE one per damaged thing found
//! done KEY=VALUE ...             inodes, log_pages, log_entries, table_blocks,
//!                                superblocks, journals, problems, cancelled,
//!                                read_only (after the scrub: errors= may
//!                                have turned the file system read-only)
//! json {...}                     the same facts as one JSON object (last line)
//! error MESSAGE                  refused or failed (then nothing else)
//! ```
//!
//! Only root or the user the server runs as may start a scrub (it reads the
//! whole pool, and what it finds can turn the file system read-only).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use inkfs::api::{ScrubProgress, ScrubReport};

use crate::Engine;

/// The request word that asks for a scrub instead of the statistics.
pub const REQUEST: &str = "scrub";

/// Takes a connection whose request was [`REQUEST`] (the statistics server
/// calls it and goes back to its other clients).
pub type Handler = Arc<dyn Fn(UnixStream) + Send + Sync>;

/// Progress lines are sent at most this often (and once at the end).
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// A client that reads nothing for this long loses its scrub.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an unmount waits for a running scrub to notice it must stop.
const STOP_WAIT: Duration = Duration::from_secs(30);

/// Scrubs of one mount: at most one at a time, all stopped at unmount.
pub struct ScrubService {
    state: Arc<State>,
    handler: Handler,
}

#[derive(Default)]
struct State {
    /// Set at unmount: a running scrub stops at its next progress call.
    stop: AtomicBool,
    running: Mutex<bool>,
    ended: Condvar,
}

impl ScrubService {
    /// Scrubs of `engine`, which they hold only while running (so that the
    /// unmount gets it back once `shutdown` returns).
    pub fn new(engine: &Arc<Engine>) -> ScrubService {
        let state = Arc::new(State::default());
        let weak: Weak<Engine> = Arc::downgrade(engine);
        let st = state.clone();
        let handler: Handler = Arc::new(move |conn: UnixStream| {
            let (weak, st) = (weak.clone(), st.clone());
            let spawned = std::thread::Builder::new()
                .name("inkfs-scrub".into())
                .spawn(move || serve(&weak, &st, conn));
            if let Err(e) = spawned {
                eprintln!("inkfs: scrub: cannot start a thread: {e}");
            }
        });
        ScrubService { state, handler }
    }

    pub fn handler(&self) -> Handler {
        self.handler.clone()
    }

    /// Stop a running scrub and wait (bounded) until it has let go of the
    /// engine; refuse new ones.
    pub fn shutdown(&self) {
        let running = self.state.running.lock().unwrap_or_else(|e| e.into_inner());
        // Under the mutex: a request either registered as running before
        // (and is waited for) or sees `stop` and never takes the engine.
        self.state.stop.store(true, Ordering::Relaxed);
        let _ = self
            .state
            .ended
            .wait_timeout_while(running, STOP_WAIT, |r| *r)
            .unwrap_or_else(|e| e.into_inner());
    }
}

/// One scrub request, on its own thread.
fn serve(engine: &Weak<Engine>, st: &State, mut conn: UnixStream) {
    let _ = conn.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = conn.set_read_timeout(None);
    if let Err(why) = permitted(&conn) {
        let _ = writeln!(conn, "error {why}");
        return;
    }
    {
        let mut running = st.running.lock().unwrap_or_else(|e| e.into_inner());
        if st.stop.load(Ordering::Relaxed) {
            let _ = writeln!(conn, "error the file system is being unmounted");
            return;
        }
        if *running {
            let _ = writeln!(conn, "error a scrub of this file system is already running");
            return;
        }
        *running = true;
    }
    let last = run(engine, st, &mut conn);
    // The scrub ends before its last line is written: a client that reads
    // it and asks again at once must not find this one still running.
    *st.running.lock().unwrap_or_else(|e| e.into_inner()) = false;
    st.ended.notify_all();
    if let Some(text) = last {
        let _ = conn.write_all(text.as_bytes());
    }
}

/// Run the scrub, writing its progress to `conn`: the last lines to write
/// (the result, or why there is none), or None if the client went away.
/// The engine is let go of on return.
fn run(engine: &Weak<Engine>, st: &State, conn: &mut UnixStream) -> Option<String> {
    const UNMOUNTING: &str = "error the file system is being unmounted\n";
    // Gone only if the unmount took it back already (not while running).
    let Some(engine) = engine.upgrade() else {
        return Some(UNMOUNTING.to_string());
    };
    let mut last: Option<Instant> = None;
    let mut client_gone = false;
    let report = engine.scrub(&mut |p: ScrubProgress| {
        if st.stop.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if p.done == p.total || last.is_none_or(|l| now - l >= PROGRESS_EVERY) {
            last = Some(now);
            // A client that went away (or stopped reading) ends the scrub.
            if writeln!(conn, "progress {} {}", p.done, p.total).is_err() {
                client_gone = true;
                return false;
            }
        }
        true
    });
    if client_gone {
        return None;
    }
    if report.cancelled && st.stop.load(Ordering::Relaxed) {
        return Some(UNMOUNTING.to_string());
    }
    Some(encode(&report, engine.is_read_only()))
}

/// Root, or the user the server runs as.
fn permitted(conn: &UnixStream) -> Result<(), String> {
    let cred = crate::stats::peer_cred(conn).map_err(|e| format!("cannot tell who asks: {e}"))?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if cred.uid == 0 || cred.uid == me {
        Ok(())
    } else {
        Err(format!(
            "permission denied: only root or uid {me} (the server's user) may scrub this file system"
        ))
    }
}

/// The result lines (`problem`s, `done`, `json`).
pub fn encode(r: &ScrubReport, read_only: bool) -> String {
    let mut out = String::new();
    for p in &r.problems {
        out.push_str(&format!(
            "problem {} {} {}\n",
            p.reason.name(),
            p.ino.map_or("-".to_string(), |i| i.to_string()),
            one_line(&p.message)
        ));
    }
    let fields = [
        ("inodes", r.inodes),
        ("log_pages", r.log_pages),
        ("log_entries", r.log_entries),
        ("table_blocks", r.table_blocks),
        ("superblocks", r.superblocks as u64),
        ("journals", r.journals as u64),
        ("problems", r.problems.len() as u64),
        ("cancelled", u64::from(r.cancelled)),
        ("read_only", u64::from(read_only)),
    ];
    let done: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
    out.push_str(&format!("done {}\n", done.join(" ")));
    let problems: Vec<String> = r
        .problems
        .iter()
        .map(|p| {
            format!(
                "{{\"reason\":\"{}\",\"inode\":{},\"message\":{}}}",
                p.reason.name(),
                p.ino.map_or("null".to_string(), |i| i.to_string()),
                json_str(&p.message)
            )
        })
        .collect();
    let numbers: Vec<String> = fields
        .iter()
        .filter(|(k, _)| !matches!(*k, "cancelled" | "read_only" | "problems"))
        .map(|(k, v)| format!("\"{k}\":{v}"))
        .collect();
    out.push_str(&format!(
        "json {{\"clean\":{},\"cancelled\":{},\"read_only\":{read_only},{},\"problems\":[{}]}}\n",
        r.is_clean(),
        r.cancelled,
        numbers.join(","),
        problems.join(",")
    ));
    out
}

// ---------------------------------------------------------------- client

/// One damaged thing, as the server reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub reason: String,
    pub ino: Option<u64>,
    pub message: String,
}

/// What a finished scrub reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub findings: Vec<Finding>,
    /// The `done` line's counts (inodes, log_pages, ...).
    pub counts: Vec<(String, u64)>,
    /// The `json` line's object.
    pub json: String,
}

impl Outcome {
    /// A count of the `done` line (0 if absent).
    pub fn count(&self, key: &str) -> u64 {
        self.counts
            .iter()
            .find(|(k, _)| k == key)
            .map_or(0, |(_, v)| *v)
    }
}

/// How long the client waits for the next line: a progress line comes
/// after every inode-table block, and a block's 31 logs take far less.
const READ_TIMEOUT: Duration = Duration::from_secs(300);

/// Ask the server of mount point `path` to scrub its pool; `progress`
/// gets (done, total) inode slots as it goes. None: `path` is not the
/// mount point of a running inkfs server; `Err`: refused, failed, or the
/// server stopped answering.
pub fn request(
    path: &std::path::Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Option<Result<Outcome, String>> {
    use std::io::BufRead;
    let sock = crate::server_socket(path)?;
    let mut run = || -> Result<Outcome, String> {
        let mut conn = UnixStream::connect(&sock).map_err(|e| {
            format!(
                "{}: inkfs server is not running ({e}); stale socket {}",
                path.display(),
                sock.display()
            )
        })?;
        let _ = conn.set_read_timeout(Some(READ_TIMEOUT));
        conn.write_all(b"scrub\n")
            .map_err(|e| format!("asking {}: {e}", sock.display()))?;
        let mut out = Outcome::default();
        for line in std::io::BufReader::new(conn).lines() {
            let line = line.map_err(|e| format!("reading {}: {e}", sock.display()))?;
            let (word, rest) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            match word {
                "progress" => {
                    let mut n = rest.split(' ').map(|v| v.parse::<u64>().unwrap_or(0));
                    progress(n.next().unwrap_or(0), n.next().unwrap_or(0));
                }
                "problem" => {
                    let mut parts = rest.splitn(3, ' ');
                    let reason = parts.next().unwrap_or("").to_string();
                    let ino = parts.next().and_then(|i| i.parse().ok());
                    let message = parts.next().unwrap_or("").to_string();
                    out.findings.push(Finding {
                        reason,
                        ino,
                        message,
                    });
                }
                "done" => {
                    out.counts = rest
                        .split(' ')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.parse().unwrap_or(0)))
                        .collect();
                }
                "json" => {
                    out.json = rest.to_string();
                    return Ok(out);
                }
                "error" => return Err(rest.to_string()),
                // A server newer than this client: ignore what it adds.
                _ => {}
            }
        }
        Err(format!(
            "{}: the server ended the scrub without a result (unmounted?)",
            path.display()
        ))
    };
    Some(run())
}

fn one_line(s: &str) -> String {
    s.replace(['\n', '\r'], " ")
}

/// `s` as a JSON string literal, quotes included.
fn json_str(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use inkfs::format::ErrorReason;
    use inkfs::scrub::ScrubProblem;

    #[test]
    fn result_lines() {
        let r = ScrubReport {
            inodes: 3,
            superblocks: 2,
            problems: vec![ScrubProblem {
                reason: ErrorReason::Log,
                ino: Some(7),
                message: "inode 7 log: \"bad\"\nentry".into(),
            }],
            ..Default::default()
        };
        let text = encode(&r, true);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[0], "problem log 7 inode 7 log: \"bad\" entry");
        assert!(lines[1].starts_with("done inodes=3 "), "{}", lines[1]);
        assert!(lines[1].ends_with(" problems=1 cancelled=0 read_only=1"));
        assert!(lines[2].starts_with(
            "json {\"clean\":false,\"cancelled\":false,\"read_only\":true,\"inodes\":3,"
        ));
        assert!(
            lines[2].ends_with(
                "\"problems\":[{\"reason\":\"log\",\"inode\":7,\"message\":\"inode 7 log: \\\"bad\\\"\\nentry\"}]}"
            ),
            "{}",
            lines[2]
        );
        // The message survives the round trip through a JSON parser.
        let json: serde_json::Value =
            serde_json::from_str(lines[2].trim_start_matches("json ")).expect("valid JSON");
        assert_eq!(
            json["problems"][0]["message"],
            "inode 7 log: \"bad\"\nentry"
        );
    }
}
