//! Mapped pools: device DAX, fs-DAX with MAP_SYNC, DRAM (tmpfs/shm), msync files.
//! (Being written: see the persistence-layer issue.)

use super::{BackendInfo, Pmem};

/// How to open or create a pool.
#[derive(Clone, Debug, Default)]
pub struct OpenOptions {
    /// Create the file (or resize an empty one) to this many bytes.
    pub create_size_bytes: Option<u64>,
    /// Open read-only (stat, fsck without -y).
    pub read_only: bool,
}

pub struct MappedPool {
    _private: (),
}

impl MappedPool {
    pub fn open(_path: &std::path::Path, _opts: &OpenOptions) -> std::io::Result<MappedPool> {
        unimplemented!("MappedPool::open")
    }
}

impl Pmem for MappedPool {
    fn size_bytes(&self) -> u64 {
        unimplemented!()
    }
    fn info(&self) -> BackendInfo {
        unimplemented!()
    }
    fn read(&self, _off: u64, _buf: &mut [u8]) {
        unimplemented!()
    }
    fn read_u64(&self, _off: u64) -> u64 {
        unimplemented!()
    }
    fn write(&self, _off: u64, _data: &[u8]) {
        unimplemented!()
    }
    fn write_u64(&self, _off: u64, _value: u64) {
        unimplemented!()
    }
    fn copy_nt(&self, _off: u64, _data: &[u8]) {
        unimplemented!()
    }
    fn zero_nt(&self, _off: u64, _len: u64) {
        unimplemented!()
    }
    fn flush(&self, _off: u64, _len: u64) {
        unimplemented!()
    }
    fn fence(&self) {
        unimplemented!()
    }
    fn sync_all(&self) -> std::io::Result<()> {
        unimplemented!()
    }
}
