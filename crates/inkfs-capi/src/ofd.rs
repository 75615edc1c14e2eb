//! An open file description: the engine's open [`File`] and the file
//! offset that read, write and lseek share, shared by every descriptor
//! dup made of it (POSIX's open file description).

use std::sync::{Mutex, MutexGuard};

use inkfs::api::{File, FileKind};

pub(crate) struct Ofd {
    pub(crate) file: File,
    /// The file offset (a directory's: the readdir cookie getdents64
    /// resumes from). Held across a read or write that uses it, as Linux
    /// holds f_pos_lock, so two threads reading one descriptor never read
    /// the same bytes.
    pos: Mutex<u64>,
}

impl Ofd {
    pub(crate) fn new(file: File) -> Ofd {
        Ofd {
            file,
            pos: Mutex::new(0),
        }
    }

    pub(crate) fn pos(&self) -> MutexGuard<'_, u64> {
        // A panic mid-call leaves the offset as it was or as updated: a
        // valid offset either way.
        self.pos.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_dir(&self) -> bool {
        self.file.kind() == FileKind::Dir
    }
}

/// Lock the offsets of two descriptions (copy_file_range) in a fixed
/// order, by address, so that two threads copying in opposite directions
/// cannot deadlock; one lock when both are the same description.
pub(crate) fn lock_two<'a>(
    a: &'a Ofd,
    b: &'a Ofd,
) -> (MutexGuard<'a, u64>, Option<MutexGuard<'a, u64>>) {
    if std::ptr::eq(a, b) {
        return (a.pos(), None);
    }
    if (a as *const Ofd) < (b as *const Ofd) {
        let ga = a.pos();
        (ga, Some(b.pos()))
    } else {
        let gb = b.pos();
        (a.pos(), Some(gb))
    }
}
