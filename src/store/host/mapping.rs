//! The host store's memory: one anonymous private mapping, page-aligned,
//! on transparent or explicit huge pages where the system gives them.

use super::*;

/// The system page size.
pub(super) fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size > 0 {
        size as usize
    } else {
        4096
    }
}

/// An anonymous private mapping, zero-filled, unmapped on drop.
pub(super) struct Mapping {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
    pub(super) kind: PageKind,
}

// SAFETY: the mapping is plain memory owned by this value; `HostStore`
// orders every access to it through its per-layer locks.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len > 0` bytes (a multiple of the page size).
    pub(super) fn new(len: usize, huge_pages: bool) -> Result<Self> {
        if huge_pages {
            if let Some(mapping) = Self::huge_tlb(len) {
                return Ok(mapping);
            }
        }
        let ptr = map_anonymous(len, 0).ok_or_else(|| {
            let os = std::io::Error::last_os_error();
            if os.raw_os_error() == Some(libc::ENOMEM) {
                Error::OutOfMemory {
                    what: "the host store",
                    bytes: len,
                }
            } else {
                Error::Storage(format!("mmap of {len} bytes failed: {os}"))
            }
        })?;
        let kind = if huge_pages && advise_huge_pages(ptr, len) {
            PageKind::TransparentHuge
        } else {
            PageKind::Regular
        };
        Ok(Self { ptr, len, kind })
    }

    #[cfg(target_os = "linux")]
    fn huge_tlb(len: usize) -> Option<Self> {
        const HUGE_PAGE: usize = 2 << 20;
        let len = len.checked_next_multiple_of(HUGE_PAGE)?;
        let ptr = map_anonymous(len, libc::MAP_HUGETLB)?;
        Some(Self {
            ptr,
            len,
            kind: PageKind::HugeTlb,
        })
    }

    #[cfg(not(target_os = "linux"))]
    fn huge_tlb(_len: usize) -> Option<Self> {
        None
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing
        // references the memory once the owning store is dropped.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// `mmap(PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | flags)`.
fn map_anonymous(len: usize, flags: libc::c_int) -> Option<*mut u8> {
    // SAFETY: an anonymous mapping at an address of the kernel's choosing
    // touches no existing memory.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    (ptr != libc::MAP_FAILED).then_some(ptr.cast())
}

#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, len: usize) -> bool {
    // SAFETY: the range is a mapping we own; the advice changes no contents.
    unsafe { libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) -> bool {
    false
}
