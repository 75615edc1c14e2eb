//! The crash simulator. (Being written: see the persistence-layer issue.)
use super::{BackendInfo, Pmem};

pub struct SimPool {
    _private: (),
}
pub struct SimTrace {
    _private: (),
}
pub struct CrashImages {
    _private: (),
}

impl SimPool {
    pub fn new(_size_bytes: u64) -> SimPool {
        unimplemented!()
    }
}

impl Pmem for SimPool {
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
