//! File space: fallocate (preallocate, punch a hole, zero a range; the
//! collapse and insert of shift.rs) and SEEK_DATA/SEEK_HOLE. A child of
//! file.rs: it builds its changes with the same data transaction
//! (`DataTx`) and commits them through the same `commit_data`, so they are
//! atomic and durable on return exactly as writes are.

use super::*;

impl<P: Pmem> Fs<P> {
    /// fallocate: preallocate (zeroed blocks), punch a hole, zero a range,
    /// or collapse or insert a range (`shift.rs`). Atomic and durable on
    /// return in every mode.
    pub fn fallocate(&self, fh: &FileHandle, off: u64, len: u64, flags: FallocFlags) -> Result<()> {
        self.check_writable()?;
        Self::file_state_check(&fh.inode)?;
        self.revalidate(&fh.inode)?;
        if len == 0 {
            return errno(libc::EINVAL);
        }
        // vfs_fallocate's order: the mode, then what the flags forbid, then
        // the size limit.
        flags.check()?;
        let inode = &fh.inode;
        let mut st = write(&inode.state);
        live(&st)?;
        crate::flags::deny_fallocate(&st, &flags)?;
        let end = off.checked_add(len).ok_or(Error::Errno(libc::EFBIG))?;
        if end > MAX_FILE_BYTES {
            return errno(libc::EFBIG);
        }
        // As truncate: the file's data is durable with the operation,
        // including posix overwrites in place not yet flushed from the
        // data device (a shift moves them to other offsets).
        self.dev_sync()?;
        if flags.shifts() {
            return self.shift_range(inode, &mut st, off, len, flags.collapse_range);
        }
        let now = now_ns();
        let old_size = st.attr.size;
        let size = if flags.keep_size || flags.punch_hole {
            old_size
        } else {
            old_size.max(end)
        };
        let mut tx = DataTx::new(&mut st);
        tx.side = self.place(len);
        let r = if flags.punch_hole || flags.zero_range {
            self.clear_range(&st, off, end, size, now, flags.zero_range, &mut tx)
        } else {
            self.preallocate(&st, off, end, size, now, &mut tx)
        };
        if let Err(e) = r {
            self.abort_data(&mut st, &mut tx);
            return Err(e);
        }
        let mut a = st.attr;
        a.ctime_ns = now;
        if size != old_size {
            a.mtime_ns = now;
        }
        a.size = size;
        // file_modified: as a write, by a caller without CAP_FSETID.
        if let Some(bits) = fh
            .drops_setid
            .then(|| crate::perm::killed_setid(a.mode))
            .flatten()
        {
            a.mode = (a.mode & libc::S_IFMT) | bits;
        }
        self.commit_data(inode, &mut st, &mut tx, Some(a), true, false)
    }

    /// Map fresh zeroed blocks over every hole in `[off, end)`.
    #[allow(clippy::too_many_arguments)]
    fn preallocate(
        &self,
        st: &InodeState,
        off: u64,
        end: u64,
        size: u64,
        now: i64,
        tx: &mut DataTx,
    ) -> Result<()> {
        let Some(map) = st.file() else {
            return errno(libc::EINVAL);
        };
        let (first, last) = (off / BLOCK_SIZE, (end - 1) / BLOCK_SIZE + 1);
        let mut page = first;
        while page < last {
            match map.find(page) {
                Some(e) => page = e.end(),
                None => {
                    let hole_end = map.next_from(page).map_or(last, |e| e.page.min(last));
                    self.cow_range(
                        st,
                        page,
                        hole_end,
                        Src::Zeros {
                            off: page * BLOCK_SIZE,
                            len: (hole_end - page) * BLOCK_SIZE,
                        },
                        size,
                        now,
                        tx,
                    )?;
                    page = hole_end;
                }
            }
        }
        Ok(())
    }

    /// Punch a hole (unmap whole pages) or zero a range (fresh zeroed
    /// blocks), zeroing the partial pages at both edges.
    #[allow(clippy::too_many_arguments)]
    fn clear_range(
        &self,
        st: &InodeState,
        off: u64,
        end: u64,
        size: u64,
        now: i64,
        keep_blocks: bool,
        tx: &mut DataTx,
    ) -> Result<()> {
        let first_full = off.div_ceil(BLOCK_SIZE);
        let end_full = end / BLOCK_SIZE;
        if first_full > end_full {
            // Inside a single page.
            return self.zero_partial(st, off, end, size, now, tx);
        }
        if !off.is_multiple_of(BLOCK_SIZE) {
            self.zero_partial(st, off, first_full * BLOCK_SIZE, size, now, tx)?;
        }
        if !end.is_multiple_of(BLOCK_SIZE) {
            self.zero_partial(st, end_full * BLOCK_SIZE, end, size, now, tx)?;
        }
        if first_full < end_full {
            if keep_blocks {
                let src = Src::Zeros {
                    off: first_full * BLOCK_SIZE,
                    len: (end_full - first_full) * BLOCK_SIZE,
                };
                self.cow_range(st, first_full, end_full, src, size, now, tx)?;
            } else if let Some((lo, hi)) =
                st.file().and_then(|m| mapped_span(m, first_full, end_full))
            {
                let mut page = lo;
                while page < hi {
                    let n = (hi - page).min(MAX_PAGES_PER_ENTRY);
                    tx.pieces.push(write_entry(page, 0, n, size, now));
                    page += n;
                }
            }
        }
        Ok(())
    }

    /// SEEK_DATA / SEEK_HOLE from `off`.
    pub fn seek(&self, fh: &FileHandle, off: u64, whence: Whence) -> Result<u64> {
        Self::file_state_check(&fh.inode)?;
        self.revalidate(&fh.inode)?;
        let st = inode::read(&fh.inode.state);
        let size = st.attr.size;
        if off >= size {
            return errno(libc::ENXIO);
        }
        let Some(map) = st.file() else {
            return errno(libc::EINVAL);
        };
        match whence {
            Whence::Data => {
                let e = map
                    .next_from(off / BLOCK_SIZE)
                    .ok_or(Error::Errno(libc::ENXIO))?;
                let at = off.max(e.page * BLOCK_SIZE);
                if at >= size {
                    return errno(libc::ENXIO);
                }
                Ok(at)
            }
            Whence::Hole => {
                let mut page = off / BLOCK_SIZE;
                while let Some(e) = map.find(page) {
                    page = e.end();
                }
                Ok(off.max(page * BLOCK_SIZE).min(size))
            }
        }
    }
}
