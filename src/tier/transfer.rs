//! Whole-block copies between the device tier's store and host memory.

use crate::error::{Error, Result};
use crate::ids::BlockId;
use crate::store::{HostStore, Stream};

/// A device-tier store whose blocks can be copied out and in whole: every
/// layer of one block, in stored format, layer after layer. This is the
/// unit the lower tiers keep.
///
/// Both copies are enqueued on `stream` (a GPU store's `CUstream`; host
/// stores ignore it), so they follow the engine's earlier work on that
/// stream, and complete before returning: the host bytes are read or
/// written by the time the call returns.
pub trait BlockTransfer: Send + Sync {
    /// Bytes of one block, all layers.
    fn block_bytes(&self) -> usize;

    /// Copies block `block` into `out` (`block_bytes()` bytes). The caller
    /// guarantees nobody writes the block meanwhile (the manager's rules: a
    /// full computed block is immutable; an evicted one is untouched until
    /// its new owner's engine writes it).
    fn read_block(&self, block: BlockId, out: &mut [u8], stream: Stream) -> Result<()>;

    /// Overwrites block `block` with `data` (`block_bytes()` bytes). The
    /// caller owns the block and nobody reads it meanwhile.
    fn write_block(&self, block: BlockId, data: &[u8], stream: Stream) -> Result<()>;
}

impl BlockTransfer for HostStore {
    fn block_bytes(&self) -> usize {
        HostStore::block_bytes(self)
    }

    fn read_block(&self, block: BlockId, out: &mut [u8], _stream: Stream) -> Result<()> {
        HostStore::read_block(self, block, out)
    }

    fn write_block(&self, block: BlockId, data: &[u8], _stream: Stream) -> Result<()> {
        HostStore::write_block(self, block, data)
    }
}

#[cfg(feature = "cuda")]
impl BlockTransfer for crate::store::CudaStore {
    fn block_bytes(&self) -> usize {
        crate::store::CudaStore::block_bytes(self)
    }

    fn read_block(&self, block: BlockId, out: &mut [u8], stream: Stream) -> Result<()> {
        crate::store::CudaStore::read_block(self, block, out, stream)
    }

    fn write_block(&self, block: BlockId, data: &[u8], stream: Stream) -> Result<()> {
        crate::store::CudaStore::write_block(self, block, data, stream)
    }
}

/// A device tier that keeps bookkeeping only, no bytes: blocks are 0 bytes.
/// Workload replays (`simulate`) use it to measure what each tier would hit
/// without holding terabytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BookkeepingOnly;

impl BlockTransfer for BookkeepingOnly {
    fn block_bytes(&self) -> usize {
        0
    }

    fn read_block(&self, _block: BlockId, out: &mut [u8], _stream: Stream) -> Result<()> {
        empty(out.len())
    }

    fn write_block(&self, _block: BlockId, data: &[u8], _stream: Stream) -> Result<()> {
        empty(data.len())
    }
}

fn empty(len: usize) -> Result<()> {
    if len == 0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "blocks hold no bytes here, got {len}"
        )))
    }
}
